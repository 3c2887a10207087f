"""The Files and Batch APIs: OpenAI's ``/v1/files`` and ``/v1/batches``, Anthropic's
``/v1/messages/batches``, and the runner that works through batches in the background.

Layout::

    upload.py            POST /v1/files: multipart, streamed into the store in chunks, checked as JSONL
    files_routes.py      the Files endpoints (list, retrieve, delete, content)
    openai_routes.py     /v1/batches
    anthropic_routes.py  /v1/messages/batches
    lines.py             a batch's requests read and checked: the file's lines, Anthropic's requests
    results.py           the result lines in each API's shape
    objects.py           the File, Batch and MessageBatch objects
    lifecycle.py         batch-level work: reading the file into lines, finishing a batch
    execute.py           one line run through its endpoint's own route; BATCH_PRIORITY
    runner.py            the process's runner: leases, claims, renewals, cancellation
    common.py            the store check, the key's limits, windows, metadata, list parameters

Everything lives in the state store (``state/batch_sql.py``), so batches survive restarts and
the processes and replicas sharing a store share the work (docs/serving.md, "Batches").
"""

from starlette.routing import BaseRoute

from .anthropic_routes import ROUTES as ANTHROPIC_ROUTES
from .files_routes import ROUTES as FILE_ROUTES
from .openai_routes import ROUTES as OPENAI_ROUTES

__all__ = ["ROUTES"]

ROUTES: list[BaseRoute] = [*FILE_ROUTES, *OPENAI_ROUTES, *ANTHROPIC_ROUTES]
