"""Mid-stream migration: continue a request on another worker when its worker breaks.

When a worker dies or its stream breaks after the client has seen tokens (an
``EngineStreamError``, or an ``EngineUnavailableError`` raised mid-stream), the request is sent
again to another worker as *the original prompt followed by every token generated so far*, with
``max_new_tokens`` (and ``min_new_tokens``) reduced by what was produced. A greedy (or seeded)
model continues exactly where the first worker stopped, so the client sees one uninterrupted
stream: same request, same usage totals (``prompt_tokens`` stays the original prompt's, and
``completion_tokens`` counts every worker's output).

Never migrated:

* requests with a decoding constraint -- the grammar's state would restart from the beginning on
  the new worker and accept output the constraint forbids; they end with the error as before;
* client cancellations (the consumer closes the stream: no exception reaches here);
* requests the worker refused (``RequestError``, a 4xx) and timeouts (``EngineTimeoutError``:
  the deadline is the client's, a new worker would not meet it either);
* failures past ``limit`` migrations.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable

from deepseek_frontend.errors import EngineStreamError, EngineUnavailableError
from deepseek_frontend.generation import EngineChunk, GenerateRequest, leg_id

__all__ = ["Attempt", "continuation", "migrating_stream"]

logger = logging.getLogger(__name__)

Attempt = Callable[[GenerateRequest, frozenset[str], list[str]], AsyncIterator[EngineChunk]]
"""``(request, worker URLs to avoid, out: URLs that served it) -> chunk stream`` (the pool's)."""


def continuation(request: GenerateRequest, generated: list[int], migration: int) -> GenerateRequest:
    """``request`` continued after ``generated`` tokens (the ``migration``-th time)."""
    sampling = request.sampling
    produced = len(generated)
    new_sampling = dataclasses.replace(
        sampling,
        max_new_tokens=sampling.max_new_tokens - produced,
        min_new_tokens=max(0, getattr(sampling, "min_new_tokens", 0) - produced),
    )
    return GenerateRequest(
        request_id=leg_id(request.request_id, f"m{migration}"),
        input_ids=[*request.input_ids, *generated],
        sampling=new_sampling,
        # the continuation is the same request: it keeps its place in the workers' queues
        priority=request.priority,
    )


async def migrating_stream(
    attempt: Attempt,
    request: GenerateRequest,
    limit: int,
    *,
    on_migrate: Callable[[str, int], None] | None = None,
) -> AsyncIterator[EngineChunk]:
    """Stream ``request`` through ``attempt``, migrating up to ``limit`` times (see module docstring).

    ``on_migrate(failed_worker_url, tokens_so_far)`` is called before each migration.
    """
    generated: list[int] = []
    avoid: set[str] = set()
    prompt_tokens = len(request.input_ids)
    cached: int | None = None
    current = request
    migrations = 0
    #: the failure that started the first migration: what the client hears if none can continue
    original: EngineStreamError | EngineUnavailableError | None = None
    while True:
        served: list[str] = []
        offset = len(generated)
        before = offset
        stream = attempt(current, frozenset(avoid), served)
        try:
            async for chunk in stream:
                if migrations:
                    # usage as if one worker had served the whole request
                    chunk.prompt_tokens = prompt_tokens
                    if chunk.completion_tokens is not None:
                        chunk.completion_tokens += offset
                    chunk.cached_tokens = cached
                elif chunk.cached_tokens is not None:
                    cached = chunk.cached_tokens
                generated.extend(chunk.token_ids)
                yield chunk
            return
        except (EngineStreamError, EngineUnavailableError) as exc:
            progressed = len(generated) > before or migrations > 0
            if not progressed or migrations >= limit or not served:
                if migrations and not served and original is not None:
                    # no worker could take the continuation: the client hears the failure it had
                    raise _as_stream_error(original) from exc
                if migrations and isinstance(exc, EngineUnavailableError):
                    raise _as_stream_error(exc) from exc  # the client has tokens: not a 503 any more
                raise
            if len(generated) >= request.sampling.max_new_tokens:
                raise
            if original is None:
                original = exc
            migrations += 1
            failed = served[-1]
            avoid.add(failed)
            logger.warning(
                "request %s: worker %s failed after %d tokens (%s); migrating (%d/%d)",
                request.request_id,
                failed,
                len(generated),
                exc.message,
                migrations,
                limit,
            )
            if on_migrate is not None:
                on_migrate(failed, len(generated))
            current = continuation(request, generated, migrations)
        finally:
            # a client that went away closes this generator: close the worker's stream now (it
            # aborts the engine request and frees the worker's slot), not when it is collected
            await stream.aclose()  # type: ignore[attr-defined]


def _as_stream_error(exc: EngineStreamError | EngineUnavailableError) -> EngineStreamError:
    """The failure as the mid-stream error it is for a client that already has tokens."""
    if isinstance(exc, EngineStreamError):
        return exc
    return EngineStreamError(exc.message)
