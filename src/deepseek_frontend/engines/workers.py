"""One engine worker as a pool sees it, and what the admitted workers can serve together.

A :class:`Worker` is a pool's record of one worker: its client, whether it is admitted (healthy, not
refused by the pool's vet, not still being discovered), its request and failure counts, what
capability discovery learned about it, and the requests waiting on it for their first token.
:func:`combine_capabilities` merges what the admitted workers reported, conservatively.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deepseek_frontend.engines.base import EngineClient
from deepseek_frontend.generation import ConstraintKind, WorkerCapabilities

if TYPE_CHECKING:
    from deepseek_frontend.engines.limits import Watch

__all__ = ["Worker", "combine_capabilities"]


@dataclass(slots=True, eq=False)  # identity semantics: two workers are never "equal"
class Worker:
    """A pool's record of one worker: its client, admission state, counters and capabilities."""

    client: EngineClient
    url: str
    healthy: bool = True
    in_flight: int = 0
    consecutive_failures: int = 0
    last_error: str | None = None
    ejected_at: float | None = None
    requests: int = 0
    failures: int = 0
    extra: dict[str, object] = field(default_factory=dict)
    #: what discovery last learned (None: not yet, or the worker does not say)
    capabilities: WorkerCapabilities | None = None
    #: why the pool's vet refuses this worker (None: usable)
    refused: str | None = None
    #: its first discovery is still running (start-up): no request goes to it yet
    discovering: bool = False
    #: when it last left a request without response headers (None: not since its last success)
    silent_at: float | None = None
    #: the requests waiting for their first token on it (moved elsewhere when it falls silent)
    waiting: set[Watch] = field(default_factory=set)

    def can_enforce(self, kind: ConstraintKind) -> bool:
        """Whether this worker enforces constraints of ``kind`` (its client decides while unknown)."""
        caps = self.capabilities
        if caps is None:
            return self.client.supports_constraint(kind)
        return kind in caps.constraint_kinds


def combine_capabilities(workers: Sequence[Worker]) -> WorkerCapabilities | None:
    """What the admitted ``workers`` (all of them when none is admitted) reported, combined; None
    when none reported anything (see :meth:`~deepseek_frontend.engines.pool.WorkerPool.capabilities`)."""
    workers = [w for w in workers if w.healthy] or workers
    known = [w.capabilities for w in workers if w.capabilities is not None]
    if not known:
        return None
    contexts = [c.context_length for c in known if c.context_length]
    pages = {c.page_size for c in known}
    backends = sorted({c.grammar_backend for c in known if c.grammar_backend})
    return WorkerCapabilities(
        constraint_kinds=frozenset().union(*(c.constraint_kinds for c in known)),
        grammar_backend=",".join(backends) or None,
        context_length=min(contexts) if contexts else None,
        reserved_output_tokens=max(c.reserved_output_tokens for c in known),
        honours_seed=all(c.honours_seed for c in known),
        page_size=pages.pop() if len(pages) == 1 else None,
    )
