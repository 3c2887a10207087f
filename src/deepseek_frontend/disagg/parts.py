"""The prefill/decode orchestrator's parts (disagg/pool.py): its settings and the deployment they
belong to, counters, rooms, the request's log line and the helpers that stop and judge a leg."""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from deepseek_frontend.errors import (
    EngineError,
    EngineTimeoutError,
    EngineUnavailableError,
    NoHealthyWorkerError,
)
from deepseek_frontend.generation import EngineChunk

__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "OUTCOMES",
    "PAIR_ATTEMPTS",
    "PREFILL_GRACE_S",
    "TRANSFER_BUCKETS",
    "TRANSFER_TIMEOUT_S",
    "LegFailed",
    "PdConfig",
    "PdDeployment",
    "PdStats",
    "RoleMismatchError",
    "Rooms",
    "Trace",
    "first_chunk",
    "leg_failure",
    "leg_message",
    "log_request",
    "quietly_cancel",
]

logger = logging.getLogger("deepseek_frontend.routing.pd")

#: SGLang's default ``--disaggregation-bootstrap-port``
DEFAULT_BOOTSTRAP_PORT = 8998
#: bootstrap rooms are drawn from ``0 .. ROOM_LIMIT - 1`` (SGLang keeps them in an int64 buffer)
ROOM_LIMIT = 1 << 63
#: rooms remembered so that none is drawn twice (a bounded cache; a repeat of a random 63-bit number
#: beyond it is as likely as a hardware fault)
RECENT_ROOMS = 1 << 16
#: default seconds from the prefill leg's end to the decode's first token (``--pd-transfer-timeout``)
TRANSFER_TIMEOUT_S = 60.0
#: pairs one request may try before its first token (the first and one retry)
PAIR_ATTEMPTS = 2
#: seconds a prefill answer still on its way when the decode finished is awaited (in the background,
#: after the client's response has ended) before that leg is aborted and counted as a late failure
PREFILL_GRACE_S = 1.0
#: histogram bounds (seconds) of the time from the prefill's end to the decode's first token
TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Role = Literal["prefill", "decode"]
#: how a PD request ended (the ``outcome`` label of ``pd_requests_total``)
OUTCOMES = (
    "ok",
    "migrated",
    "client_gone",
    "rejected",
    "prefill_failed",
    "decode_failed",
    "transfer_timeout",
    "no_worker",
    "error",
)


class RoleMismatchError(ValueError):
    """A worker given as ``--prefill-worker`` / ``--decode-worker`` reports another role."""


class Rooms:
    """Draws bootstrap rooms: uniform in ``0 .. 2**63-1`` (:mod:`secrets`), never one of the last
    ``remember`` drawn."""

    __slots__ = ("_order", "_seen")

    def __init__(self, remember: int = RECENT_ROOMS) -> None:
        self._order: deque[int] = deque(maxlen=remember)
        self._seen: set[int] = set()

    def draw(self) -> int:
        room = secrets.randbelow(ROOM_LIMIT)
        while room in self._seen:
            room = secrets.randbelow(ROOM_LIMIT)
        order = self._order
        if len(order) == order.maxlen:
            self._seen.discard(order[0])
        order.append(room)
        self._seen.add(room)
        return room


@dataclass(frozen=True, slots=True)
class PdConfig:
    """``engine``: the workers' protocol; ``transfer_timeout_s`` (None: unbounded) and
    ``bootstrap_port`` (None: each prefill worker's own) as described in the module docstring."""

    engine: Literal["sglang", "vllm"] = "sglang"
    transfer_timeout_s: float | None = TRANSFER_TIMEOUT_S
    bootstrap_port: int | None = None
    #: see :data:`PREFILL_GRACE_S`
    prefill_grace_s: float = PREFILL_GRACE_S


@dataclass(frozen=True, slots=True)
class PdDeployment:
    """A model served disaggregated, as configured: each role's workers (``--prefill-worker``,
    ``--decode-worker``) and the orchestrator's :class:`PdConfig`. No workers: not disaggregated."""

    prefill_workers: tuple[str, ...] = ()
    decode_workers: tuple[str, ...] = ()
    orchestrator: PdConfig = field(default_factory=PdConfig)

    @property
    def enabled(self) -> bool:
        """Whether the model is served by prefill/decode pairs."""
        return bool(self.prefill_workers or self.decode_workers)


@dataclass(slots=True)
class PdStats:
    """Counters read at scrape time (disagg/metrics.py); updated on the event loop only."""

    outcomes: Counter[str] = field(default_factory=Counter)
    #: prefill legs that failed (SGLang: the bootstrap handshake, the prefill or its KV send)
    bootstrap_failures: int = 0
    #: decode legs that failed before their first token, or waited past the transfer timeout
    transfer_failures: int = 0
    #: pairs retried on other workers before the first token
    retries: int = 0
    #: prefill answers that were bad, or missing past the grace, after the decode had started
    #: (logged, the client unaffected)
    late_prefill_failures: int = 0
    #: workers refused because their ``/server_info`` reports another role, by the role they were given
    role_mismatches: Counter[str] = field(default_factory=Counter)
    transfer_counts: list[int] = field(default_factory=lambda: [0] * (len(TRANSFER_BUCKETS) + 1))
    transfer_sum: float = 0.0

    def observe_transfer(self, seconds: float) -> None:
        self.transfer_counts[bisect_left(TRANSFER_BUCKETS, seconds)] += 1
        self.transfer_sum += seconds


class LegFailed(Exception):
    """A leg failed before the decode's first token in a way another pair may not repeat."""

    def __init__(self, role: Role, message: str) -> None:
        super().__init__(message)
        self.role = role
        self.message = message


@dataclass(slots=True)
class Trace:
    """One client request across every pair it used (retries and migrations): its log line and
    outcome, written once, when the request has ended and ``pending`` background checks of
    prefill answers are done (``pending`` counts the request itself too)."""

    rid: str
    #: ``(prefill URL, decode URL, room or None)`` of every pair tried, in order
    pairs: list[tuple[str, str, int | None]] = field(default_factory=list)
    migrations: int = 0
    outcome: str = "error"
    transfer_s: float | None = None
    details: list[str] = field(default_factory=list)
    pending: int = 1
    #: something went wrong that the outcome does not say (a late prefill failure): log at WARNING
    warn: bool = False

    def note(self, detail: str, outcome: str | None = None) -> None:
        """Set the outcome (when given) and add ``detail`` to the line (once)."""
        if outcome is not None:
            self.outcome = outcome
        if detail and detail not in self.details:
            self.details.append(detail)


async def first_chunk(stream: AsyncIterator[EngineChunk]) -> EngineChunk:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        raise EngineUnavailableError("the decode leg ended before its first token") from None


def leg_failure(role: Role, exc: BaseException | None) -> str | None:
    """The message of a leg failure worth a retry on another pair; None when the leg is fine.

    A refusal (``RequestError``), a timeout (the client's deadline) and anything not an engine error
    propagate as they are.
    """
    if exc is None:
        return None
    if isinstance(exc, EngineError) and not isinstance(exc, EngineTimeoutError):
        return f"{role} leg: {leg_message(exc)}"
    raise exc


def leg_message(exc: BaseException) -> str:
    """What went wrong with a leg, without the pool's "no healthy worker (url: why)" wrapper (a leg
    runs on one worker: the wrapper says nothing more)."""
    message = exc.message if isinstance(exc, EngineError) else str(exc)
    if isinstance(exc, NoHealthyWorkerError) and message.startswith(_POOL_WRAPPER) and message.endswith(")"):
        message = _REPEATED_URL.sub(r"\1: ", message[len(_POOL_WRAPPER) : -1])
    return message


_POOL_WRAPPER = "no healthy engine worker could take the request ("
#: the pool names the worker before a client message that already starts with it
_REPEATED_URL = re.compile(r"^(\S+): \1: ")


async def quietly_cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel ``tasks`` and wait for them, swallowing what they end with (their failures are handled
    by the caller or no longer matter). Cancelling a leg's task closes its stream, which aborts it.

    Only the tasks' outcomes are swallowed: a caller cancelled meanwhile (the client left while a
    failed pair was being stopped) still waits for the tasks to end, then is cancelled -- it must not
    go on to start another pair.
    """
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    try:
        await asyncio.wait(tasks)
    except asyncio.CancelledError:
        await asyncio.wait(tasks)  # already cancelled: they end at once
        raise
    finally:
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved" warning


def log_request(trace: Trace) -> None:
    """The request's one log line; ``prefill``, ``decode`` and ``room`` list every pair, in order."""
    transfer = f"{trace.transfer_s * 1000:.1f}ms" if trace.transfer_s is not None else "-"
    pairs = trace.pairs or [("-", "-", None)]
    detail = "; ".join(trace.details)
    bad = trace.warn or trace.outcome not in ("ok", "migrated", "client_gone", "rejected")
    logger.log(
        logging.WARNING if bad else logging.INFO,
        "pd request %s outcome=%s prefill=%s decode=%s room=%s attempts=%d migrations=%d transfer=%s%s",
        trace.rid,
        trace.outcome,
        ",".join(p for p, _, _ in pairs),
        ",".join(d for _, d, _ in pairs),
        ",".join("-" if r is None else str(r) for _, _, r in pairs),
        len(trace.pairs),
        trace.migrations,
        transfer,
        f" detail={detail!r}" if detail else "",
    )
