"""A pool of engine workers: which workers it has, whether each is admitted, and its public face.

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

Metrics: :meth:`WorkerPool.statuses` returns per-worker :class:`WorkerStatus` snapshots
(healthy, in-flight, consecutive failures, last error); the API's Prometheus collector
reads them at scrape time.

The pool's other parts, each in its own module and mixed into :class:`WorkerPool`:

* :mod:`~deepseek_frontend.engines.dispatch` -- routing a request to a worker, retry before the first
  chunk, output checks, migration of a broken stream;
* :mod:`~deepseek_frontend.engines.limits` -- :class:`StreamLimits`: in-flight limits and deadlines;
* :mod:`~deepseek_frontend.engines.upkeep` -- health probes, capability discovery and vetting, DNS
  sources, start-up and shutdown;
* :mod:`~deepseek_frontend.engines.workers` -- one worker's record, combined capabilities.

:func:`from_urls` builds a pool of SGLang or vLLM clients sharing one HTTP connection pool;
:func:`pool_from_config` builds one from a served model's :class:`~.config.EngineConfig`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

import httpx

from deepseek_frontend.engines._http import StreamSession, new_http_client
from deepseek_frontend.engines.base import Engine, EngineClient
from deepseek_frontend.engines.config import EngineConfig
from deepseek_frontend.engines.dispatch import Dispatch
from deepseek_frontend.engines.limits import CONTROL_CONNECTIONS, CapacityAndDeadlines, StreamLimits, Watch
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.engines.upkeep import (
    HEALTH_INTERVAL_S,
    HEALTH_TIMEOUT_S,
    DnsSource,
    Resolver,
    WorkerUpkeep,
    system_resolver,
)
from deepseek_frontend.engines.workers import Worker, combine_capabilities
from deepseek_frontend.generation import ConstraintKind, WorkerCapabilities, WorkerStatus

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from deepseek_frontend.routing.router import Router

__all__ = ["Resolver", "StreamLimits", "WorkerPool", "from_urls", "pool_from_config", "system_resolver"]

logger = logging.getLogger(__name__)

#: consecutive failures that eject a worker
EJECT_AFTER_FAILURES = 3
#: seconds before an ejected worker gets a trial request when no health loop re-admits it
READMIT_AFTER_S = 30.0
#: workers one request may try
MAX_ATTEMPTS = 3


class WorkerPool(Dispatch, CapacityAndDeadlines, WorkerUpkeep, Engine):
    """Route requests over ``clients`` (see module docstring): an :class:`Engine` over workers.

    ``generate(request)`` is an async iterator with the :class:`EngineClient` contract. Call
    :meth:`start` to run health checks (and DNS discovery) in the background and :meth:`aclose` to
    stop them and close the clients. ``on_change`` (optional) is called after any worker's admission
    state changes. ``discover_in_background``: :meth:`start` returns before the workers' first
    discoveries have answered (the server's pools do, so that it answers ``/live`` at once);
    by default it waits for them.
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
        discover_in_background: bool = False,
    ) -> None:
        self._workers: list[Worker] = [Worker(c, getattr(c, "name", repr(c))) for c in clients]
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
        self._watches: set[Watch] = set()
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
        self._dns_sources: list[DnsSource] = []
        self._owned_http: httpx.AsyncClient | None = None
        self._owned_streams: StreamSession | None = None
        self._caps_key: tuple[tuple[int, bool], ...] | None = None
        self._caps: WorkerCapabilities | None = None
        self._caps_refs: list[WorkerCapabilities | None] = []
        #: background capability discoveries of re-admitted workers (cancelled by aclose)
        self._discoveries: set[asyncio.Task[None]] = set()
        #: :meth:`start`'s DNS resolution, first discoveries and router start (then the health loop)
        self._startup: asyncio.Task[None] | None = None
        #: ``(url, capabilities) -> reason to refuse the worker, or None`` (see engines/upkeep.py)
        self.vet: Callable[[str, WorkerCapabilities], str | None] | None = None
        #: :meth:`start` returns at once, its discoveries running in the background
        self.discover_in_background = discover_in_background
        #: a vet's refusal of a worker given at start stops :meth:`start` (engines/upkeep.py)
        self.refuse_at_start = False
        self._start_refusals: list[str] = []
        self.name = "pool"

    def __repr__(self) -> str:
        return f"WorkerPool({[w.url for w in self._workers]!r})"

    # ------------------------------------------------------------------ state

    def statuses(self) -> list[WorkerStatus]:
        """A snapshot per worker, for /health answers and metrics."""
        return [
            WorkerStatus(
                w.url,
                w.healthy and not w.discovering and w.refused is None,
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

    def client_of(self, url: str) -> tuple[EngineClient, WorkerCapabilities | None] | None:
        """Worker ``url``'s client and what discovery learned about it (None: no such worker)."""
        for w in self._workers:
            if w.url == url:
                return w.client, w.capabilities
        return None

    def add_client(self, client: EngineClient) -> None:
        """Admit a new worker (discovery uses this); with a :attr:`vet`, only once it has been vetted."""
        self._workers.append(Worker(client, getattr(client, "name", repr(client))))
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

    def _notify(self, worker: Worker) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self._status(worker))
            except Exception:  # a metrics hook must not break routing
                logger.exception("pool on_change hook failed")

    def _status(self, w: Worker) -> WorkerStatus:
        return WorkerStatus(w.url, w.healthy, w.in_flight, w.consecutive_failures, w.last_error)

    def _record_failure(self, worker: Worker, error: str, *, eject: bool = False) -> None:
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

    def _record_success(self, worker: Worker) -> None:
        worker.consecutive_failures = 0
        worker.silent_at = None
        if not worker.healthy:
            worker.healthy = True
            worker.ejected_at = None
            logger.warning("re-admitting worker %s", worker.url)
            self._notify(worker)
            self._rediscover_later(worker)

    def _silenced(self, worker: Worker, error: str) -> None:
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
        self._caps_key, self._caps = key, combine_capabilities(self._workers)
        # holding the objects the key names keeps their ids from being reused by new ones
        self._caps_refs = [w.capabilities for w in self._workers]
        return self._caps

    async def check_health(self) -> bool:
        """True when at least one worker is admitted."""
        return self.healthy_count > 0

    def routers(self) -> Sequence[Router]:
        """The pool's router, if it has one."""
        return (self.router,) if self.router is not None else ()

    def collectors(self) -> Sequence[Collector]:
        """The router's metrics (routing/metrics.py), if the pool has a router."""
        from deepseek_frontend.routing.metrics import RoutingCollector

        return [RoutingCollector(self.router)] if self.router is not None else []


def pool_from_config(
    config: EngineConfig,
    limits: StreamLimits,
    router: Router | None = None,
    *,
    discover_in_background: bool = False,
) -> WorkerPool:
    """The pool of ``config.workers`` (SGLang or vLLM, ``config.kind``), with the health checks,
    retries, vLLM settings and migration ``config`` gives, ``limits`` per request and ``router``
    choosing among its workers (see :class:`WorkerPool` for ``discover_in_background``)."""
    if config.kind == "sim":
        raise ValueError("the simulated engine runs in-process: it has no worker pool")
    return from_urls(
        config.kind,
        config.workers,
        model=config.worker_model,
        vllm_grammar=config.vllm_grammar,
        health_interval_s=config.health_check_interval,
        health_timeout_s=config.health_check_timeout,
        max_attempts=config.max_retries + 1,
        limits=limits,
        router=router,
        migration_limit=config.migration_limit,
        discover_in_background=discover_in_background,
    )


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
