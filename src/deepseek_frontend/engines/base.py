"""The engine interface: token ids in, token-id chunks out.

Every engine client (SGLang ``/generate``, vLLM ``/v1/completions``, the
simulated engine) implements :class:`EngineClient`. The pool and the API layer
know nothing else about engines.

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
from collections.abc import AsyncIterator

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

__all__ = [
    "ConstraintKind",
    "DecodingConstraint",
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
