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
    "PREFILL_ALLOWANCE_S_PER_TOKEN",
    "PREFILL_SETTLE_S",
    "TIMINGS",
    "TIMING_BUCKETS",
    "TRANSFER_TIMEOUT_S",
    "Histogram",
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
#: default ``--pd-transfer-timeout``: seconds the second of a pair's two signals (the prefill's
#: answer, the decode's first token) may trail the first; with neither, seconds past the prefill
#: allowance (:data:`PREFILL_ALLOWANCE_S_PER_TOKEN`)
TRANSFER_TIMEOUT_S = 60.0
#: seconds of prefill allowed per prompt token before a pair with neither signal counts as stuck:
#: 2,000 tokens/s, far below any GPU prefill (a 1M-token prompt gets 500 s)
PREFILL_ALLOWANCE_S_PER_TOKEN = 0.0005
#: pairs one request may try before its first token (the first and one retry)
PAIR_ATTEMPTS = 2
#: seconds a prefill answer still on its way when the decode finished is awaited, in the background
#: (after the client's response has ended), before that leg is aborted and counted as a late
#: failure. SGLang's prefill answers at its scheduler's next poll after the transfer, after the
#: forward in progress -- seconds under long chunked prefills -- and Dynamo waits 30 s for it
#: (``BOOTSTRAP_PREFILL_COMPLETION_TIMEOUT``, ``kv_router/prefill_router/bootstrap.rs``)
PREFILL_SETTLE_S = 30.0
#: histogram bounds (seconds) of the PD timings (:class:`Timings`)
TIMING_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip

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
    """``engine``: the workers' protocol; ``kv_connector``: vLLM's KV connector (``nixl`` or
    ``mooncake``; ``--vllm-kv-connector``); ``transfer_timeout_s`` (None: unbounded; see
    :data:`TRANSFER_TIMEOUT_S`) and ``bootstrap_port`` (None: each prefill worker's own) as described
    in disagg/pool.py's docstring."""

    engine: Literal["sglang", "vllm"] = "sglang"
    transfer_timeout_s: float | None = TRANSFER_TIMEOUT_S
    bootstrap_port: int | None = None
    #: see :data:`PREFILL_SETTLE_S`
    prefill_settle_s: float = PREFILL_SETTLE_S
    kv_connector: Literal["nixl", "mooncake"] = "nixl"


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
    #: prefill answers that were bad after the decode had started, or missing
    #: :data:`PREFILL_SETTLE_S` after the decode's end (logged, the client unaffected)
    late_prefill_failures: int = 0
    #: workers refused because their ``/server_info`` reports another role, by the role they were given
    role_mismatches: Counter[str] = field(default_factory=Counter)
    #: the PD timings, by name (:data:`TIMINGS`)
    timings: dict[str, Histogram] = field(default_factory=lambda: {name: Histogram() for name in TIMINGS})

    def observe(self, timing: str, seconds: float) -> None:
        self.timings[timing].observe(max(0.0, seconds))


#: the PD timings (histograms ``deepseek_frontend_pd_<name>_seconds``) and what each measures; the
#: same text is their metric help
TIMINGS = {
    "first_token": "From sending a pair's legs (vLLM: its prefill leg) to the decode leg's first token: "
    "prefill queue and compute, KV transfer, first decode step.",
    "prefill": "From sending the prefill leg to its answer. SGLang answers after the KV transfer, at its "
    "scheduler's next poll; vLLM answers before the transfer.",
    "decode_after_prefill": "From the prefill leg's answer to the decode leg's first token, when the answer "
    "came first (vLLM: always): the decode's scheduling, its KV transfer and first step.",
    "prefill_lag": "From the decode leg's first token to the prefill leg's answer, when the token came first "
    "(SGLang: nearly always): how long SGLang's prefill answer trails the transfer.",
}


@dataclass(slots=True)
class Histogram:
    """Counts per bound of :data:`TIMING_BUCKETS` (one more for above them all) and their sum."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(TIMING_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(TIMING_BUCKETS, seconds)] += 1
        self.total += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)


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
    #: seconds from the last pair's start to its decode's first token, and to its prefill's answer
    first_token_s: float | None = None
    prefill_s: float | None = None
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
    """The request's one log line; ``prefill``, ``decode`` and ``room`` list every pair, in order;
    ``first_token`` and ``prefill_answer`` are the last pair's :data:`TIMINGS` of those names."""
    pairs = trace.pairs or [("-", "-", None)]
    detail = "; ".join(trace.details)
    bad = trace.warn or trace.outcome not in ("ok", "migrated", "client_gone", "rejected")
    logger.log(
        logging.WARNING if bad else logging.INFO,
        "pd request %s outcome=%s prefill=%s decode=%s room=%s attempts=%d migrations=%d first_token=%s "
        "prefill_answer=%s%s",
        trace.rid,
        trace.outcome,
        ",".join(p for p, _, _ in pairs),
        ",".join(d for _, d, _ in pairs),
        ",".join("-" if r is None else str(r) for _, _, r in pairs),
        len(trace.pairs),
        trace.migrations,
        _ms(trace.first_token_s),
        _ms(trace.prefill_s),
        f" detail={detail!r}" if detail else "",
    )


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1000:.1f}ms" if seconds is not None else "-"
