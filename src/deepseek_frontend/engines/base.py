"""The two engine interfaces: token ids in, token-id chunks out.

* :class:`Engine` -- what serves one model's requests, as the layers above see it: the pipeline
  sends requests to it, the served model starts, watches and closes it. Implementations: the
  worker pool (``engines/pool.py``), the prefill/decode orchestrator (``disagg/pool.py``) and the
  in-process simulated engine (``engines/sim/engine.py``); tests add a scripted one.
* :class:`EngineClient` -- one worker, as a pool sees it (SGLang ``/generate``, vLLM
  ``/v1/completions``, the simulated engine): the transport a :class:`~.pool.WorkerPool` holds
  one of per worker.

Failure contract (see ``deepseek_frontend.errors``): a client raises
``EngineUnavailableError`` when the worker fails before the first chunk
(connection refused, HTTP 5xx, error before any token) -- the pool may retry on
another worker -- and ``EngineStreamError`` when it fails after at least one
chunk was yielded. A request the worker rejects as invalid raises
``EngineRejectedRequestError`` (a ``RequestError`` carrying the worker's 4xx status; not
retried, and never counted against the worker), before or after the first chunk. Closing
the async generator early (client disconnect) must abort the request on the worker; clients
do that in ``finally``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from deepseek_frontend.generation import (
    ConstraintKind,
    DecodingConstraint,
    EngineChunk,
    EngineFinishReason,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
    WorkerCapabilities,
    WorkerStatus,
)

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from deepseek_frontend.routing.router import Router

__all__ = [
    "ConstraintKind",
    "DecodingConstraint",
    "Engine",
    "EngineChunk",
    "EngineClient",
    "EngineFinishReason",
    "GenerateRequest",
    "SamplingParams",
    "TokenLogprob",
    "WorkerCapabilities",
    "WorkerStatus",
]


class EngineClient(ABC):
    """One engine worker. Implementations: SGLang, vLLM, simulated."""

    #: a stable name for logs and metrics (usually the worker URL)
    name: str

    @abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """Stream the completion of ``request``. The last chunk has ``finish_reason`` set."""

    @abstractmethod
    async def abort(self, request_id: str) -> None:
        """Best-effort abort of a running request."""

    @abstractmethod
    async def check_health(self) -> bool:
        """True when the worker can generate (SGLang: ``/health_generate``)."""

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        """Whether this engine can enforce a constraint of ``kind`` (the API answers 400 up front if not)."""
        return True

    async def discover(self) -> WorkerCapabilities | None:
        """Ask the worker what it can serve; ``None`` when it does not say (the default)."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


class Engine(ABC):
    """What serves one model's requests: a pool of workers, a prefill/decode pair of pools, or an
    in-process engine. The pipeline and the served model know engines only through this.

    Contract:

    * :meth:`generate` streams one request's chunks with the failure contract above; closing the
      stream early aborts the request wherever it runs.
    * :meth:`supports_constraint` and :meth:`capabilities` answer from what the engine knows now
      (its workers' discoveries, its own configuration): the pipeline refuses up front, with a
      400 that says why, a request the engine cannot serve.
    * :meth:`statuses` is one snapshot per worker (an in-process engine is its own one worker):
      ``/health`` and the worker metrics read it at request and scrape time.
    * :meth:`start` starts the engine's background work (health checks, discovery, KV event
      subscriptions) once, on the serving event loop; :meth:`aclose` stops it and releases every
      connection. :meth:`start` may return before a worker is ready: :meth:`statuses` then say
      which are not, and a request that finds none gets a 503.
    * :meth:`routers` and :meth:`collectors` expose what the server wires around the engine: the
      routers choosing its workers (the server installs the session-header middleware when one
      routes by session or KV cache) and the Prometheus collectors that export its state.
    """

    #: a stable name for logs
    name: str

    @abstractmethod
    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """Stream the completion of ``request``. The last chunk has ``finish_reason`` set."""

    @abstractmethod
    def supports_constraint(self, kind: ConstraintKind) -> bool:
        """Whether a request constrained by ``kind`` can be served."""

    @abstractmethod
    def capabilities(self) -> WorkerCapabilities | None:
        """What the engine's workers can serve, combined; None when nothing was reported."""

    @abstractmethod
    def statuses(self) -> list[WorkerStatus]:
        """One snapshot per worker, for ``/health`` and metrics."""

    @abstractmethod
    async def start(self) -> None:
        """Start the background work (see the class docstring); called once, before requests."""

    @abstractmethod
    async def aclose(self) -> None:
        """Stop the background work and release every connection; running streams end."""

    def routers(self) -> Sequence[Router]:
        """The routers choosing this engine's workers (none: the engine routes nothing)."""
        return ()

    def collectors(self) -> Sequence[Collector]:
        """Prometheus collectors exporting this engine's own state at scrape time (none by default)."""
        return ()
