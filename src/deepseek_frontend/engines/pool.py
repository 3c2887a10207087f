"""A pool of engine workers: routing, health checks, ejection, retry, migration.

Routing: each request goes to an admitted worker; with a ``router``
(:class:`~deepseek_frontend.routing.Router`: KV-cache aware, session affinity, ...) the router
chooses among the admitted workers and is told of each request's start, first token and end;
without one, the worker with the fewest in-flight requests, ties rotated.

Migration: with ``migration_limit`` > 0, a stream that breaks after its first chunk continues on
another worker with the prompt plus the tokens generated so far (never for grammar-constrained
requests; see :mod:`deepseek_frontend.routing.migration`).

Failures: a worker that raises :class:`EngineUnavailableError` before its first chunk is
charged a failure and the request moves to another worker (at most ``max_attempts``
workers per request). A request the worker refuses as invalid
(:class:`~deepseek_frontend.errors.EngineRejectedRequestError`, any ``RequestError``) is the
client's error: it propagates at once, is not retried and leaves the worker's health as it was.
Only transport failures, 5xx answers and timeouts count against a worker. After the first
chunk nothing is retried -- the client has seen tokens -- and the error propagates.
``eject_after_failures`` consecutive failures (request failures or failed health checks)
eject a worker; a passing health check re-admits it.
Without a running health loop an ejected worker gets one trial request once
``readmit_after_s`` has passed (a half-open circuit), so a pool never stays empty forever.
A worker that sends no response headers within ``StreamLimits.response_timeout_s``
(:class:`~deepseek_frontend.errors.WorkerSilentError`) is ejected at once, and the requests still
waiting for their first token on it move to other workers (:meth:`WorkerPool._silenced`); a
passing probe re-admits it only once ``readmit_after_s`` has passed, a successful request at once.

Health: the probe is each client's ``check_health`` (SGLang: ``GET /server_info``, which does not
generate) bounded by ``health_timeout_s`` (default 30 s, above SGLang's own 20 s health wait), plus
the outcomes of real requests. A slow worker that still answers is never charged a failure.

Capabilities: :meth:`WorkerPool.start` asks every worker what it can serve
(``EngineClient.discover``; a worker gets no request before its first answer, and ``start`` may
return before them, see its docstring), and asks again when a worker is added or re-admitted, or passes a
probe while nothing is known about it. A request that needs a constraint kind goes only to workers
that enforce it; :meth:`WorkerPool.capabilities` combines what the admitted workers reported
(smallest context, largest output reservation, seeds only if all honour them).

Limits (:class:`StreamLimits`): a request waits briefly (FIFO) for a worker below its in-flight limit
and for room under the pool's total, then gets a 429 (``OverloadedError``); the shared HTTP client
has that total plus a few control connections, so streams never queue inside httpx and probes and
aborts always find a connection. Deadlines (first token, idle between chunks, whole request) are
watched by one task per pool; on expiry the engine request is aborted, the worker charged and
``EngineTimeoutError`` (504) raised. Output is checked: ids outside the vocabulary and chunks the
client cannot read are the worker's fault, output past ``max_new_tokens`` is cut (finish ``length``).

Metrics: :meth:`WorkerPool.statuses` returns per-worker :class:`WorkerStatus` snapshots
(healthy, in-flight, consecutive failures, last error); the API's Prometheus collector
reads them at scrape time.

Discovery: a ``dns+http://host:port`` worker URL (for example a Kubernetes headless
Service) is resolved every ``dns_interval_s``; each A/AAAA record becomes a worker
``http://IP:port``, added and removed as records change.

Vetting: an owner may set :attr:`WorkerPool.vet` (``(url, capabilities) -> reason or None``); it
runs on every discovery, and a worker it refuses gets no request until a later discovery accepts
it. With a vet set, a worker added after construction (DNS) is held back until its first discovery
has been vetted (the prefill/decode orchestrator checks roles this way).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import httpx

from deepseek_frontend import _tracing
from deepseek_frontend._tasks import cancel_and_wait
from deepseek_frontend.engines._http import RESPONSE_TIMEOUT_S, StreamSession, new_http_client
from deepseek_frontend.engines.base import (
    ConstraintKind,
    EngineChunk,
    EngineClient,
    GenerateRequest,
    WorkerCapabilities,
    WorkerStatus,
)
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.errors import (
    EngineStreamError,
    EngineTimeoutError,
    EngineUnavailableError,
    FrontendError,
    NoHealthyWorkerError,
    OverloadedError,
    WorkerSilentError,
    WorkersStartingError,
)

if TYPE_CHECKING:
    from deepseek_frontend.routing.router import Router

__all__ = ["Resolver", "StreamLimits", "WorkerPool", "from_urls", "system_resolver"]

logger = logging.getLogger(__name__)

#: seconds between health checks of every worker
HEALTH_INTERVAL_S = 5.0
#: seconds one health check (or capability discovery) may take: longer than SGLang's own 20 s
#: health wait, so a busy worker is not taken for a dead one
HEALTH_TIMEOUT_S = 30.0
#: consecutive failures that eject a worker
EJECT_AFTER_FAILURES = 3
#: seconds before an ejected worker gets a trial request when no health loop re-admits it
READMIT_AFTER_S = 30.0
#: workers one request may try
MAX_ATTEMPTS = 3
#: seconds between DNS resolutions of dns+ worker URLs
DNS_INTERVAL_S = 10.0
#: engine requests one worker runs at once (more wait for a slot; SGLang queues what it cannot batch)
MAX_IN_FLIGHT_PER_WORKER = 1024
#: engine requests all workers together run at once: the engine client's connection pool is sized to
#: this plus :data:`CONTROL_CONNECTIONS`, so a request never waits inside the HTTP client's pool
MAX_IN_FLIGHT = 1024
#: connections kept free of streams for health probes, aborts and discovery
CONTROL_CONNECTIONS = 32
#: seconds a request may wait for a free worker slot before it is refused (429)
CAPACITY_WAIT_S = 10.0
#: seconds from sending a request to its first token: a 1M-token prefill takes minutes
FIRST_TOKEN_TIMEOUT_S = 600.0
#: seconds a started stream may go without a chunk (decode steps take milliseconds)
IDLE_TIMEOUT_S = 60.0
#: seconds one engine request may take in all (1M tokens of prefill plus a long answer)
REQUEST_TIMEOUT_S = 3600.0


@dataclasses.dataclass(frozen=True, slots=True)
class StreamLimits:
    """What the pool bounds and checks per engine request (None disables a timeout).

    * ``max_in_flight_per_worker`` / ``max_in_flight``: a request waits (FIFO, at most
      ``capacity_wait_s``) until a worker below its limit exists and fewer than ``max_in_flight``
      requests run in all; then :class:`~deepseek_frontend.errors.OverloadedError` (429).
    * ``first_token_timeout_s``, ``idle_timeout_s`` (between chunks), ``request_timeout_s``
      (from the first attempt): on expiry the engine request is aborted, the worker is charged a
      failure and :class:`~deepseek_frontend.errors.EngineTimeoutError` (504) is raised.
    * ``response_timeout_s``: from sending a request to the worker's response headers (which
      SGLang and vLLM send before the prefill). On expiry the worker is ejected as silent, the
      request moves to another worker (nothing reached the client yet), and so do the other
      requests still waiting for their first token on it. Applied by the HTTP clients' stream
      session (:func:`from_urls` passes it on).
    * ``vocab_size``: a token id outside ``0..vocab_size-1`` is the worker's fault
      (:class:`~deepseek_frontend.errors.EngineStreamError`, or a retry before the first token).
      Output beyond the request's ``max_new_tokens`` is always cut (finish ``length``).
    """

    max_in_flight_per_worker: int = MAX_IN_FLIGHT_PER_WORKER
    max_in_flight: int = MAX_IN_FLIGHT
    capacity_wait_s: float = CAPACITY_WAIT_S
    first_token_timeout_s: float | None = FIRST_TOKEN_TIMEOUT_S
    idle_timeout_s: float | None = IDLE_TIMEOUT_S
    request_timeout_s: float | None = REQUEST_TIMEOUT_S
    vocab_size: int | None = None
    response_timeout_s: float | None = RESPONSE_TIMEOUT_S

    @property
    def watched(self) -> bool:
        """Whether any deadline applies (else the watchdog never runs)."""
        return (
            self.first_token_timeout_s is not None
            or self.idle_timeout_s is not None
            or self.request_timeout_s is not None
        )

    @property
    def watch_interval_s(self) -> float:
        """How often the watchdog looks: a quarter of the shortest timeout, at most a second."""
        set_ = [t for t in (self.first_token_timeout_s, self.idle_timeout_s, self.request_timeout_s) if t]
        return max(0.01, min([1.0, *(t / 4 for t in set_)]))


class _Watch:
    """The deadline of one request's current wait on its worker (read by the watchdog).

    ``task`` is set only while the request awaits the worker, so a deadline never interrupts the
    consumer's own work (a slow client write, say); ``fired`` tells the waiter why it was cancelled,
    ``moved`` that its worker was found silent and the request should try another.
    """

    __slots__ = ("deadline", "end", "fired", "limit_s", "moved", "task", "what")

    def __init__(self, now: float, request_timeout_s: float | None) -> None:
        self.end = now + request_timeout_s if request_timeout_s is not None else None
        self.deadline = 0.0
        self.task: asyncio.Task[object] | None = None
        self.fired = ""
        self.moved = ""
        self.what = ""
        self.limit_s: float | None = None


#: seconds a finished stream may take to deliver its end marker (``[DONE]``) before it is closed
SETTLE_TIMEOUT_S = 0.05


async def _settle(stream: AsyncIterator[EngineChunk]) -> None:
    """Let a client read what follows its finish chunk (``[DONE]``), briefly.

    The consumer closes the stream as soon as it has the last chunk; an HTTP response closed with
    unread bytes loses its keep-alive connection, and a frontend would then open a new TCP
    connection to the worker for every request (a quarter of its CPU under a burst). Nothing the
    stream yields here is used: output after the finish chunk does not count.
    """
    with contextlib.suppress(Exception):
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            await anext(stream)


class _OutputChecker:
    """Checks a worker's chunks against the request: ids in the vocabulary, at most ``max_new`` of them.

    :meth:`check` returns the chunk to pass on: unchanged, or cut at ``max_new`` tokens with finish
    ``length`` (``overflowed`` then says what happened); an id outside the vocabulary (or not an
    integer) raises :class:`EngineStreamError` -- the worker's fault, never the client's.
    """

    __slots__ = ("emitted", "max_new", "overflowed", "url", "vocab")

    def __init__(self, max_new: int, vocab: int | None, url: str) -> None:
        self.max_new = max_new
        self.vocab = vocab
        self.url = url
        self.emitted = 0
        self.overflowed = ""

    def check(self, chunk: EngineChunk) -> EngineChunk:
        ids = chunk.token_ids
        if not ids:
            return chunk
        vocab = self.vocab
        if vocab is not None:
            for tid in ids:
                if tid.__class__ is not int or not 0 <= tid < vocab:
                    # the message reaches the client: it names the fault, not the worker's address
                    raise EngineStreamError(
                        f"the engine worker sent token id {tid!r}, outside the vocabulary (0..{vocab - 1})"
                    )
        before = self.emitted
        self.emitted = before + len(ids)
        if self.emitted <= self.max_new:
            return chunk
        keep = max(0, self.max_new - before)
        self.overflowed = (
            f"{self.url}: sent more than max_new_tokens={self.max_new} tokens; output cut at the limit"
        )
        return dataclasses.replace(
            chunk,
            token_ids=list(ids[:keep]),
            finish_reason="length",
            matched_stop=None,
            completion_tokens=self.max_new,
            logprobs=chunk.logprobs[:keep] if chunk.logprobs else None,
        )


Resolver = Callable[[str, int], Awaitable[Iterable[str]]]
"""``(host, port) -> IP addresses``; the default asks the system resolver (A and AAAA records)."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(sockaddr[0]) for _, _, _, _, sockaddr in infos]


@dataclass(slots=True, eq=False)  # identity semantics: two workers are never "equal"
class _Worker:
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
    waiting: set[_Watch] = field(default_factory=set)

    def can_enforce(self, kind: ConstraintKind) -> bool:
        """Whether this worker enforces constraints of ``kind`` (its client decides while unknown)."""
        caps = self.capabilities
        if caps is None:
            return self.client.supports_constraint(kind)
        return kind in caps.constraint_kinds


class WorkerPool:
    """Route requests over ``clients`` (see module docstring).

    ``generate(request)`` is an async iterator with the :class:`EngineClient` contract, so the
    API treats a pool like one engine. Call :meth:`start` to run health checks (and DNS
    discovery) in the background and :meth:`aclose` to stop them and close the clients.
    ``on_change`` (optional) is called after any worker's admission state changes.
    """

    def __init__(
        self,
        clients: Sequence[EngineClient] = (),
        *,
        health_interval_s: float = HEALTH_INTERVAL_S,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
        eject_after_failures: int = EJECT_AFTER_FAILURES,
        readmit_after_s: float = READMIT_AFTER_S,
        max_attempts: int = MAX_ATTEMPTS,
        on_change: Callable[[WorkerStatus], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        limits: StreamLimits | None = None,
        router: Router | None = None,
        migration_limit: int = 0,
    ) -> None:
        self._workers: list[_Worker] = [_Worker(c, getattr(c, "name", repr(c))) for c in clients]
        #: chooses among admitted workers and tracks their caches (routing/); None: least outstanding
        self.router = router
        #: times a stream broken mid-response may continue on another worker (routing/migration.py)
        self.migration_limit = max(0, migration_limit)
        if router is not None:
            for w in self._workers:
                router.worker_added(w.url)
        #: capacity, deadlines and output checks of every request (see :class:`StreamLimits`)
        self.limits = limits or StreamLimits()
        #: engine requests running on all workers together
        self._total_in_flight = 0
        #: requests waiting for a free slot (oldest first; done futures are skipped)
        self._capacity_waiters: deque[asyncio.Future[None]] = deque()
        #: deadlines of running requests, scanned by the watchdog task
        self._watches: set[_Watch] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.eject_after_failures = max(1, eject_after_failures)
        self.readmit_after_s = readmit_after_s
        self.max_attempts = max(1, max_attempts)
        self.on_change = on_change
        self._clock = clock
        self._rr = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._dns_sources: list[_DnsSource] = []
        self._owned_http: httpx.AsyncClient | None = None
        self._owned_streams: StreamSession | None = None
        self._caps_key: tuple[tuple[int, bool], ...] | None = None
        self._caps: WorkerCapabilities | None = None
        self._caps_refs: list[WorkerCapabilities | None] = []
        #: background capability discoveries of re-admitted workers (cancelled by aclose)
        self._discoveries: set[asyncio.Task[None]] = set()
        #: :meth:`start`'s DNS resolution, first discoveries and router start (then the health loop)
        self._startup: asyncio.Task[None] | None = None
        #: ``(url, capabilities) -> reason to refuse the worker, or None`` (see module docstring)
        self.vet: Callable[[str, WorkerCapabilities], str | None] | None = None
        self.name = "pool"

    def __repr__(self) -> str:
        return f"WorkerPool({[w.url for w in self._workers]!r})"

    # ------------------------------------------------------------------ state

    def statuses(self) -> list[WorkerStatus]:
        """A snapshot per worker, for /health answers and metrics."""
        return [
            WorkerStatus(
                w.url,
                w.healthy and not w.discovering,
                w.in_flight,
                w.consecutive_failures,
                w.last_error,
                {
                    "requests": w.requests,
                    "failures": w.failures,
                    **w.extra,
                    **({"refused": w.refused} if w.refused is not None else {}),
                    **({"discovery": "pending"} if w.discovering else {}),
                },
            )
            for w in self._workers
        ]

    @property
    def healthy_count(self) -> int:
        """Admitted workers (a refused one, or one still being discovered, is not admitted)."""
        return sum(1 for w in self._workers if w.healthy and w.refused is None and not w.discovering)

    @property
    def in_flight(self) -> int:
        return sum(w.in_flight for w in self._workers)

    def choose_url(self, request: GenerateRequest, avoid: Collection[str] = ()) -> str | None:
        """The worker the router would give ``request`` now, among admitted ones not in ``avoid``
        (None: none); nothing is started. The prefill/decode orchestrator (routing/pd.py) picks
        each leg's worker with this, then runs the leg there with :meth:`generate_on`."""
        constraint = request.sampling.constraint
        tried = {id(w) for w in self._workers if w.url in avoid}
        worker = self._pick(tried, constraint.kind if constraint is not None else None, request)
        return None if worker is None else worker.url

    def generate_on(self, url: str, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """Stream ``request`` on worker ``url`` alone, with the pool's limits, deadlines, output checks
        and health accounting; a failure before the first chunk raises (no other worker is tried)."""
        others = frozenset(w.url for w in self._workers if w.url != url)
        return self._generate_once(request, others, routed=False)  # chosen already: not a decision

    @contextlib.asynccontextmanager
    async def occupy(self, url: str, request: GenerateRequest) -> AsyncIterator[EngineClient]:
        """Hold a slot on worker ``url`` for a request the caller sends through the yielded client
        itself (vLLM's unstreamed prefill leg): it waits for capacity, counts in flight and with
        the router as a stream of :meth:`generate_on` does, and charges the worker an
        ``EngineUnavailableError`` or ``EngineTimeoutError`` raised inside (a success clears them)."""
        await self._await_capacity()
        worker = next((w for w in self._workers if w.url == url), None)
        if worker is None:
            raise NoHealthyWorkerError(f"no healthy engine worker could take the request ({url}: gone)")
        ticket = self.router.begin(url, request) if self.router is not None else None
        worker.in_flight += 1
        worker.requests += 1
        self._total_in_flight += 1
        try:
            yield worker.client
        except (EngineUnavailableError, EngineTimeoutError) as exc:
            self._record_failure(worker, exc.message)
            raise
        else:
            self._record_success(worker)
        finally:
            if ticket is not None:
                ticket.end()
            worker.in_flight -= 1
            self._total_in_flight -= 1
            self._wake_capacity_waiter()
            if worker.in_flight == 0 and all(w is not worker for w in self._workers):
                await worker.client.aclose()  # removed by discovery meanwhile

    def client_of(self, url: str) -> tuple[EngineClient, WorkerCapabilities | None] | None:
        """Worker ``url``'s client and what discovery learned about it (None: no such worker)."""
        for w in self._workers:
            if w.url == url:
                return w.client, w.capabilities
        return None

    def add_client(self, client: EngineClient) -> None:
        """Admit a new worker (discovery uses this); with a :attr:`vet`, only once it has been vetted."""
        self._workers.append(_Worker(client, getattr(client, "name", repr(client))))
        if self.vet is not None:
            self._workers[-1].refused = "not yet vetted (its discovery has not answered)"
        if self.router is not None:
            self.router.worker_added(self._workers[-1].url)

    async def remove_client(self, url: str) -> None:
        """Stop routing to the worker named ``url``; in-flight requests finish on it."""
        for w in list(self._workers):
            if w.url == url:
                self._workers.remove(w)
                if self.router is not None:
                    await self.router.worker_removed(url)
                if w.in_flight == 0:
                    await w.client.aclose()

    def _notify(self, worker: _Worker) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self._status(worker))
            except Exception:  # a metrics hook must not break routing
                logger.exception("pool on_change hook failed")

    def _status(self, w: _Worker) -> WorkerStatus:
        return WorkerStatus(w.url, w.healthy, w.in_flight, w.consecutive_failures, w.last_error)

    def _record_failure(self, worker: _Worker, error: str, *, eject: bool = False) -> None:
        """Charge ``worker`` a failure; ``eject_after_failures`` in a row (or ``eject``) eject it."""
        worker.consecutive_failures += 1
        worker.failures += 1
        worker.last_error = error
        if worker.healthy and (eject or worker.consecutive_failures >= self.eject_after_failures):
            worker.healthy = False
            worker.ejected_at = self._clock()
            logger.warning(
                "ejecting worker %s after %d failure(s): %s", worker.url, worker.consecutive_failures, error
            )
            if self.router is not None:
                self.router.worker_failed(worker.url)  # a dead worker's cache is gone
            self._notify(worker)
        elif not worker.healthy:
            # a failed trial request restarts the re-admission wait
            worker.ejected_at = self._clock()

    def _record_success(self, worker: _Worker) -> None:
        worker.consecutive_failures = 0
        worker.silent_at = None
        if not worker.healthy:
            worker.healthy = True
            worker.ejected_at = None
            logger.warning("re-admitting worker %s", worker.url)
            self._notify(worker)
            self._rediscover_later(worker)

    def _silenced(self, worker: _Worker, error: str) -> None:
        """``worker`` left a request without response headers: eject it at once, and move the other
        requests waiting for their first token on it to other workers.

        Its HTTP server is wedged, and a streamed answer -- a prefill finishing included -- comes
        through that server: waiting for those requests' first-token deadline (minutes) would hold
        them for nothing. Nothing of them reached a client yet, so they retry safely; each closes
        its stream and sends a bounded, best-effort abort (the clients' ``_abort_unanswered``).
        """
        worker.silent_at = self._clock()
        self._record_failure(worker, error, eject=True)
        for watch in list(worker.waiting):
            task = watch.task
            if task is not None and not watch.fired and not watch.moved:
                watch.moved = f"moved off a silent worker ({error})"
                task.cancel()

    def _rediscover_later(self, worker: _Worker) -> None:
        """Ask a re-admitted worker its capabilities again (it may have restarted with other flags),
        in the background: re-admission happens on request and probe paths that must not wait."""
        try:
            task = asyncio.get_running_loop().create_task(self._discover(worker))
        except RuntimeError:  # no running loop (a synchronous caller): the next probe asks
            return
        self._discoveries.add(task)
        task.add_done_callback(self._discoveries.discard)

    # ------------------------------------------------------------------ routing

    def _pick(
        self, tried: set[int], kind: ConstraintKind | None = None, request: GenerateRequest | None = None
    ) -> _Worker | None:
        """The next worker for a request; ``kind``: the constraint it needs (only workers enforcing it)."""
        candidates = [
            w
            for w in self._workers
            if w.healthy
            and w.refused is None
            and not w.discovering
            and id(w) not in tried
            and (kind is None or w.can_enforce(kind))
            and w.in_flight < self.limits.max_in_flight_per_worker
        ]
        if not candidates:
            now = self._clock()
            candidates = [
                w
                for w in self._workers
                if id(w) not in tried
                and w.refused is None
                and not w.discovering
                and w.ejected_at is not None
                and now - w.ejected_at >= self.readmit_after_s
                and (kind is None or w.can_enforce(kind))
            ]
            if not candidates:
                return None
            # one trial at a time: move the clock so concurrent requests do not pile onto it
            candidates[0].ejected_at = now
            return candidates[0]
        if self.router is not None and request is not None:
            return self.router.choose(candidates, request)  # type: ignore[return-value]
        low = min(w.in_flight for w in candidates)
        best = [w for w in candidates if w.in_flight == low]
        self._rr += 1
        return best[self._rr % len(best)]

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """Stream ``request``: one worker, retried elsewhere only before the first chunk; a stream
        that breaks later continues on another worker up to ``migration_limit`` times, unless the
        request is grammar-constrained (see routing/migration.py)."""
        if self.migration_limit and request.sampling.constraint is None:
            from deepseek_frontend.routing.migration import migrating_stream

            return migrating_stream(
                self._generate_once, request, self.migration_limit, on_migrate=self._count_migration
            )
        return self._generate_once(request)

    def _count_migration(self, url: str, tokens: int) -> None:
        if self.router is not None:
            self.router.migrations += 1

    async def _generate_once(
        self,
        request: GenerateRequest,
        avoid: frozenset[str] = frozenset(),
        served: list[str] | None = None,
        *,
        routed: bool = True,
    ) -> AsyncIterator[EngineChunk]:
        """One request on one worker at a time (see :meth:`generate`); ``avoid``: worker URLs not to
        use; ``served`` (out): the URL of the worker that produced the first chunk; ``routed=False``:
        the worker was chosen by :meth:`choose_url` already (the router counts no second decision)."""
        tried: set[int] = {id(w) for w in self._workers if w.url in avoid}
        errors: list[str] = []
        constraint = request.sampling.constraint
        kind = constraint.kind if constraint is not None else None
        limits = self.limits
        watch = _Watch(asyncio.get_running_loop().time(), limits.request_timeout_s)
        for _ in range(self.max_attempts):
            with _tracing.phase("routing") as span:
                await self._await_capacity()
                worker = self._pick(tried, kind, request if routed else None)
                if span is not None:
                    router = self.router.mode if self.router is not None else "least-in-flight"
                    url = worker.url if worker is not None else ""
                    span.set_attributes(
                        {"deepseek.worker": url, "deepseek.router": router, "deepseek.attempt": len(tried)}
                    )
            if worker is None:
                break
            tried.add(id(worker))
            ticket = self.router.begin(worker.url, request) if self.router is not None else None
            worker.in_flight += 1
            worker.requests += 1
            self._total_in_flight += 1
            stream = worker.client.generate(request)
            started = False
            if limits.watched:
                self._watch(watch)
            watch.moved = ""
            worker.waiting.add(watch)
            try:
                try:
                    first = await self._next(stream, watch, limits.first_token_timeout_s, "the first token")
                except EngineUnavailableError as exc:
                    worker.waiting.discard(watch)
                    if isinstance(exc, WorkerSilentError):
                        self._silenced(worker, exc.message)
                    elif not watch.moved:  # a moved request's worker was charged already
                        self._record_failure(worker, exc.message)
                    errors.append(f"{worker.url}: {exc.message}")
                    continue
                except (FrontendError, asyncio.CancelledError):
                    raise
                except Exception as exc:
                    # the client choked on what the worker sent (a malformed chunk): the worker's fault
                    message = f"{worker.url}: malformed output ({type(exc).__name__}: {exc})"
                    self._record_failure(worker, message)
                    errors.append(message)
                    continue
                started = True
                worker.waiting.discard(watch)
                if ticket is not None:
                    ticket.first_token(first.cached_tokens)
                if served is not None:
                    served.append(worker.url)
                checker = _OutputChecker(request.sampling.max_new_tokens, limits.vocab_size, worker.url)
                chunk = first
                while True:
                    chunk = checker.check(chunk)
                    if chunk.finish_reason is not None:
                        # Settle the worker's record now: a consumer that has the last chunk closes this
                        # generator at the yield, and nothing after it runs.
                        if checker.overflowed:
                            # it ignored max_new_tokens: the output is cut and the request aborted on close
                            logger.warning("%s", checker.overflowed)
                            self._record_failure(worker, checker.overflowed)
                        else:
                            self._record_success(worker)
                            await _settle(stream)
                        yield chunk
                        return
                    yield chunk
                    try:
                        chunk = await self._next(stream, watch, limits.idle_timeout_s, "the next token")
                    except StopAsyncIteration:
                        return
            except EngineUnavailableError as exc:
                if started:
                    self._record_failure(worker, exc.message)
                raise
            except (EngineStreamError, EngineTimeoutError) as exc:
                self._record_failure(worker, exc.message)
                raise
            except (FrontendError, asyncio.CancelledError, GeneratorExit):
                raise
            except Exception as exc:
                message = f"{worker.url}: malformed output ({type(exc).__name__}: {exc})"
                self._record_failure(worker, message)
                raise EngineStreamError(message) from exc
            finally:
                if ticket is not None:
                    ticket.end()
                watch.task = None
                self._watches.discard(watch)
                worker.waiting.discard(watch)
                worker.in_flight -= 1
                self._total_in_flight -= 1
                self._wake_capacity_waiter()
                await stream.aclose()  # type: ignore[attr-defined]
                if worker.in_flight == 0 and all(w is not worker for w in self._workers):
                    # removed by discovery while this request ran: close it now
                    await worker.client.aclose()
        if not errors and any(w.discovering for w in self._workers):
            raise WorkersStartingError(
                "no engine worker is ready yet: the server is still discovering its workers; retry shortly"
            )
        detail = "; ".join(errors) if errors else "no worker is admitted"
        raise NoHealthyWorkerError(f"no healthy engine worker could take the request ({detail})")

    # ------------------------------------------------------------------ capacity and deadlines

    def _has_capacity(self) -> bool:
        limits = self.limits
        if self._total_in_flight >= limits.max_in_flight:
            return False
        cap = limits.max_in_flight_per_worker
        healthy = [w for w in self._workers if w.healthy]
        # with nothing admitted, _pick decides (a trial request or NoHealthyWorkerError)
        return not healthy or any(w.in_flight < cap for w in healthy)

    async def _await_capacity(self) -> None:
        """Return once a slot is free (FIFO among waiters); ``OverloadedError`` after ``capacity_wait_s``."""
        if not self._capacity_waiters and self._has_capacity():
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.capacity_wait_s
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            self._capacity_waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                raise OverloadedError(
                    f"every engine worker is at its limit of in-flight requests "
                    f"({self._total_in_flight} running); retry later",
                    retry_after_s=1,
                ) from None
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_capacity_waiter()  # pass the wake-up on
                waiter.cancel()
                raise
            if self._has_capacity():
                # let the next waiter check too: more than one slot may be free
                if self._capacity_waiters:
                    self._wake_capacity_waiter()
                return

    def _wake_capacity_waiter(self) -> None:
        waiters = self._capacity_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _watch(self, watch: _Watch) -> None:
        self._watches.add(watch)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watchdog_loop())

    async def _next(
        self, stream: AsyncIterator[EngineChunk], watch: _Watch, timeout_s: float | None, what: str
    ) -> EngineChunk:
        """The stream's next chunk, or :class:`EngineTimeoutError` once this wait's deadline passes.

        The deadline is the sooner of ``timeout_s`` from now and the request's end. The watchdog
        cancels the waiting task at the deadline (closing the worker stream, which aborts the engine
        request); the cancellation is turned into the timeout error here. A request moved off a
        silent worker (:meth:`_silenced`) is cancelled the same way and gets
        :class:`EngineUnavailableError`, which the caller retries on another worker.
        """
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        if watch.end is not None and (deadline is None or watch.end < deadline):
            deadline, what, timeout_s = watch.end, "the end of the request", self.limits.request_timeout_s
        # no deadline: the task is still recorded, so a request can be moved off a silent worker
        watch.deadline = deadline if deadline is not None else float("inf")
        watch.what = what
        watch.limit_s = timeout_s
        watch.task = task = asyncio.current_task()
        try:
            return await anext(stream)
        except asyncio.CancelledError:
            if watch.moved and not watch.fired and task is not None and task.uncancel() == 0:
                raise EngineUnavailableError(watch.moved) from None
            if watch.fired and task is not None and task.uncancel() == 0:
                raise EngineTimeoutError(
                    f"the engine worker did not deliver {watch.fired} within {watch.limit_s:g} s; "
                    "the request was aborted"
                ) from None
            raise
        finally:
            watch.task = None

    async def _watchdog_loop(self) -> None:
        """Cancel requests whose wait on a worker passed its deadline; exits when none is watched."""
        interval = self.limits.watch_interval_s
        while self._watches:
            await asyncio.sleep(interval)
            now = asyncio.get_running_loop().time()
            for watch in list(self._watches):
                task = watch.task
                if task is not None and not watch.fired and now >= watch.deadline:
                    watch.fired = watch.what
                    task.cancel()

    async def abort(self, request_id: str) -> None:
        """Ask every worker to abort ``request_id`` (requests are not tracked per worker)."""
        await asyncio.gather(*(w.client.abort(request_id) for w in self._workers), return_exceptions=True)

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        """True when some admitted worker enforces ``kind`` (requests needing it are routed only there).

        With no worker admitted, any worker counts (the request then fails for lack of workers, a 503,
        rather than for a capability the pool may well have).
        """
        workers = [w for w in self._workers if w.healthy] or self._workers
        return any(w.can_enforce(kind) for w in workers)

    def capabilities(self) -> WorkerCapabilities | None:
        """What every admitted worker can serve, combined; None when no worker reported anything.

        A request may land on any admitted worker, so the limits combine conservatively: the smallest
        ``context_length``, the largest ``reserved_output_tokens``, ``honours_seed`` only when all
        honour it, ``page_size`` only when all agree. ``constraint_kinds`` is the union, because a
        constrained request is routed only to workers that enforce its kind.
        """
        # asked once per request: recombine only when admissions or discoveries changed
        key = tuple((id(w.capabilities), w.healthy) for w in self._workers)
        if key == self._caps_key:
            return self._caps
        self._caps_key, self._caps = key, self._combine_capabilities()
        # holding the objects the key names keeps their ids from being reused by new ones
        self._caps_refs = [w.capabilities for w in self._workers]
        return self._caps

    def _combine_capabilities(self) -> WorkerCapabilities | None:
        workers = [w for w in self._workers if w.healthy] or self._workers
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

    async def discover(self) -> WorkerCapabilities | None:
        """Ask every worker now (as :meth:`start` does); the combined :meth:`capabilities`."""
        await asyncio.gather(*(self._discover(w) for w in list(self._workers)))
        return self.capabilities()

    async def _discover(self, worker: _Worker) -> None:
        """Ask one worker what it serves; a failure keeps what was known (it is asked again later)."""
        try:
            caps = await asyncio.wait_for(worker.client.discover(), self.health_timeout_s)
        except Exception as exc:  # discovery is advisory: a failing one must not break the pool
            logger.warning("capability discovery of %s failed: %r", worker.url, exc)
            return
        if caps is None:
            return
        worker.capabilities = caps
        if self.vet is not None:
            refused = self.vet(worker.url, caps)
            if refused is not None and refused != worker.refused:
                logger.warning("refusing worker %s: %s", worker.url, refused)
            elif refused is None and worker.refused is not None:
                logger.info("worker %s vetted", worker.url)
            worker.refused = refused
        if self.router is not None:
            self.router.worker_added(worker.url, caps)  # page size, KV event endpoints
        worker.extra["capabilities"] = {
            "constraint_kinds": sorted(caps.constraint_kinds),
            "grammar_backend": caps.grammar_backend,
            "context_length": caps.context_length,
            "reserved_output_tokens": caps.reserved_output_tokens,
            "honours_seed": caps.honours_seed,
            "page_size": caps.page_size,
        }

    async def check_health(self) -> bool:
        """True when at least one worker is admitted."""
        return self.healthy_count > 0

    # ------------------------------------------------------------------ background

    async def check_all(self) -> None:
        """One health-check round over every worker (the loop calls this; tests may too)."""

        async def probe(worker: _Worker) -> None:
            try:
                ok = await asyncio.wait_for(worker.client.check_health(), self.health_timeout_s)
                error = "health check failed"
            except TimeoutError:
                ok, error = False, f"health check timed out after {self.health_timeout_s:g} s"
            except Exception as exc:  # a probe error is a failed check, whatever it is
                ok, error = False, f"health check error: {exc!r}"
            silent = worker.silent_at
            if ok and silent is not None and self._clock() - silent < self.readmit_after_s:
                # its probe answers, its generate did not: the probe alone does not re-admit it yet
                return
            if ok:
                self._record_success(worker)  # a re-admission asks for capabilities again
                if worker.capabilities is None:
                    await self._discover(worker)
            else:
                self._record_failure(worker, error)

        await asyncio.gather(*(probe(w) for w in list(self._workers)))

    async def _health_loop(self) -> None:
        # check at once: a worker that is down at startup should not wait a whole interval
        while True:
            try:
                await self.check_all()
            except Exception:
                logger.exception("health check round failed")
            await asyncio.sleep(self.health_interval_s)

    def add_dns_source(
        self,
        url: str,
        factory: Callable[[str], EngineClient],
        *,
        interval_s: float = DNS_INTERVAL_S,
        resolver: Resolver = system_resolver,
    ) -> None:
        """Resolve ``dns+http://host:port`` periodically; ``factory(base_url)`` makes each worker's client."""
        self._dns_sources.append(_DnsSource(url, factory, interval_s, resolver))

    async def refresh_dns(self) -> None:
        """Resolve every DNS source once and add/remove workers to match."""
        for source in self._dns_sources:
            try:
                wanted = await source.resolve()
            except OSError as exc:
                logger.warning(
                    "cannot resolve %s: %s (keeping %d workers)", source.url, exc, len(source.current)
                )
                continue
            for url in sorted(wanted - source.current):
                self.add_client(source.factory(url))
                await self._discover(self._workers[-1])
            for url in sorted(source.current - wanted):
                await self.remove_client(url)
            source.current = wanted

    async def _dns_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.refresh_dns()

    async def start(self, *, wait_for_discovery: bool = True) -> None:
        """Resolve DNS sources once and ask every worker what it serves, then run health checks
        (and DNS refreshes) in the background.

        A worker gets no request until its first discovery has answered or failed (the pipeline
        sizes default ``max_tokens`` and checks constraints with what it learns): meanwhile its
        status says ``discovery: pending`` and a request that finds no other worker gets
        :class:`~deepseek_frontend.errors.WorkersStartingError` (503 with ``Retry-After``).
        ``wait_for_discovery=False`` returns at once and lets all of that run in the background
        (the server does, so that it answers ``/live`` while a worker is slow to answer);
        :meth:`wait_discovered` waits for it.
        """
        pending = [w for w in self._workers if w.capabilities is None]
        for w in pending:
            w.discovering = True
        self._startup = asyncio.create_task(self._start_up(pending))
        if wait_for_discovery:
            await self.wait_discovered()

    async def wait_discovered(self) -> None:
        """Return once :meth:`start`'s DNS resolution and first discoveries are done."""
        if self._startup is not None:
            await asyncio.shield(self._startup)

    async def _start_up(self, pending: list[_Worker]) -> None:
        async def first_discovery(worker: _Worker) -> None:
            try:
                await self._discover(worker)
            finally:
                worker.discovering = False
                self._notify(worker)

        try:
            if self._dns_sources:
                await self.refresh_dns()
                interval = min(s.interval_s for s in self._dns_sources)
                self._tasks.append(asyncio.create_task(self._dns_loop(interval)))
            await asyncio.gather(*(first_discovery(w) for w in pending))
            if self.router is not None:
                await self.router.start()
        finally:
            for w in pending:
                w.discovering = False
        if self.health_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._health_loop()))

    async def aclose(self) -> None:
        """Stop background tasks and close every client (and the shared HTTP client, if owned)."""
        self._tasks.extend(self._discoveries)
        if self._startup is not None:
            self._tasks.append(self._startup)
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        if self.router is not None:
            await self.router.aclose()
        await asyncio.gather(*(w.client.aclose() for w in self._workers), return_exceptions=True)
        if self._owned_http is not None:
            await self._owned_http.aclose()
        if self._owned_streams is not None:
            await self._owned_streams.aclose()


@dataclass(slots=True)
class _DnsSource:
    url: str
    factory: Callable[[str], EngineClient]
    interval_s: float
    resolver: Resolver = system_resolver
    current: set[str] = field(default_factory=set)

    async def resolve(self) -> set[str]:
        """The worker URLs the name resolves to now: ``scheme://IP:port/path`` per address."""
        parts = urlsplit(self.url.removeprefix("dns+"))
        port = parts.port or (443 if parts.scheme == "https" else 80)
        urls = set()
        for ip in await self.resolver(parts.hostname or "", port):
            netloc = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
            urls.add(f"{parts.scheme}://{netloc}{parts.path.rstrip('/')}")
        return urls


def from_urls(
    engine: Literal["sglang", "vllm"],
    urls: Sequence[str],
    *,
    model: str | None = None,
    cumulative: bool | None = None,
    vllm_grammar: bool | None = None,
    http: httpx.AsyncClient | None = None,
    **pool_options: object,
) -> WorkerPool:
    """A pool of SGLang or vLLM clients sharing one HTTP connection pool.

    ``urls`` may mix plain ``http://host:port`` workers and ``dns+http://host:port``
    sources (resolved when :meth:`WorkerPool.start` runs). ``model`` is required for vLLM
    (the ``model`` field of its requests); ``vllm_grammar=False`` stops vLLM clients from sending
    the tool-call grammar (``VLLMClient(grammar=False)``; None, the default, sends it).
    """
    limits = pool_options.get("limits")
    if not isinstance(limits, StreamLimits):
        limits = StreamLimits()
    # Never more streams than connections: the pool caps streams at max_in_flight, and the extra
    # connections keep probes and aborts from queueing behind streams (a probe stuck there would
    # eject a healthy worker).
    shared = http or new_http_client(limits.max_in_flight + CONTROL_CONNECTIONS)
    streams = StreamSession(limits.max_in_flight + CONTROL_CONNECTIONS, limits.response_timeout_s)
    probe_timeout_s = float(pool_options.get("health_timeout_s", HEALTH_TIMEOUT_S))  # type: ignore[arg-type]

    def factory(url: str) -> EngineClient:
        if engine == "sglang":
            return SGLangClient(
                url, http=shared, streams=streams, cumulative=cumulative, probe_timeout_s=probe_timeout_s
            )
        if engine == "vllm":
            from deepseek_frontend.engines.vllm import VLLMClient

            if not model:
                raise ValueError("vLLM workers need the served model name (model=...)")
            return VLLMClient(url, model=model, http=shared, streams=streams, grammar=vllm_grammar)
        raise ValueError(f"unknown engine {engine!r} (expected 'sglang' or 'vllm')")

    pool = WorkerPool([factory(u) for u in urls if not u.startswith("dns+")], **pool_options)  # type: ignore[arg-type]
    for url in urls:
        if url.startswith("dns+"):
            pool.add_dns_source(url, factory)
    if http is None:
        pool._owned_http = shared
    pool._owned_streams = streams
    return pool
