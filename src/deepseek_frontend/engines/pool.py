"""A pool of engine workers: least-outstanding routing, health checks, ejection, retry.

Routing: each request goes to the admitted worker with the fewest in-flight requests;
ties rotate (round-robin), so an idle pool spreads load evenly.

Failures: a worker that raises :class:`EngineUnavailableError` before its first chunk is
charged a failure and the request moves to another worker (at most ``max_attempts``
workers per request). After the first chunk nothing is retried -- the client has seen
tokens -- and the error propagates. ``eject_after_failures`` consecutive failures (request
failures or failed health checks) eject a worker; a passing health check re-admits it.
Without a running health loop an ejected worker gets one trial request once
``readmit_after_s`` has passed (a half-open circuit), so a pool never stays empty forever.

Metrics: :meth:`WorkerPool.statuses` returns per-worker :class:`WorkerStatus` snapshots
(healthy, in-flight, consecutive failures, last error); the API's Prometheus collector
reads them at scrape time.

Discovery: a ``dns+http://host:port`` worker URL (for example a Kubernetes headless
Service) is resolved every ``dns_interval_s``; each A/AAAA record becomes a worker
``http://IP:port``, added and removed as records change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import httpx

from deepseek_frontend.engines._http import new_http_client
from deepseek_frontend.engines.base import (
    ConstraintKind,
    EngineChunk,
    EngineClient,
    GenerateRequest,
    WorkerStatus,
)
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.errors import EngineStreamError, EngineUnavailableError, NoHealthyWorkerError

__all__ = ["Resolver", "WorkerPool", "from_urls", "system_resolver"]

logger = logging.getLogger(__name__)

#: seconds between health checks of every worker
HEALTH_INTERVAL_S = 5.0
#: seconds one health check may take
HEALTH_TIMEOUT_S = 5.0
#: consecutive failures that eject a worker
EJECT_AFTER_FAILURES = 3
#: seconds before an ejected worker gets a trial request when no health loop re-admits it
READMIT_AFTER_S = 30.0
#: workers one request may try
MAX_ATTEMPTS = 3
#: seconds between DNS resolutions of dns+ worker URLs
DNS_INTERVAL_S = 10.0


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
    ) -> None:
        self._workers: list[_Worker] = [_Worker(c, getattr(c, "name", repr(c))) for c in clients]
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
        self.name = "pool"

    def __repr__(self) -> str:
        return f"WorkerPool({[w.url for w in self._workers]!r})"

    # ------------------------------------------------------------------ state

    def statuses(self) -> list[WorkerStatus]:
        """A snapshot per worker, for /health answers and metrics."""
        return [
            WorkerStatus(
                w.url,
                w.healthy,
                w.in_flight,
                w.consecutive_failures,
                w.last_error,
                {"requests": w.requests, "failures": w.failures, **w.extra},
            )
            for w in self._workers
        ]

    @property
    def healthy_count(self) -> int:
        return sum(1 for w in self._workers if w.healthy)

    @property
    def in_flight(self) -> int:
        return sum(w.in_flight for w in self._workers)

    def add_client(self, client: EngineClient) -> None:
        """Admit a new worker (discovery uses this)."""
        self._workers.append(_Worker(client, getattr(client, "name", repr(client))))

    async def remove_client(self, url: str) -> None:
        """Stop routing to the worker named ``url``; in-flight requests finish on it."""
        for w in list(self._workers):
            if w.url == url:
                self._workers.remove(w)
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

    def _record_failure(self, worker: _Worker, error: str) -> None:
        worker.consecutive_failures += 1
        worker.failures += 1
        worker.last_error = error
        if worker.healthy and worker.consecutive_failures >= self.eject_after_failures:
            worker.healthy = False
            worker.ejected_at = self._clock()
            logger.warning(
                "ejecting worker %s after %d failures: %s", worker.url, worker.consecutive_failures, error
            )
            self._notify(worker)
        elif not worker.healthy:
            # a failed trial request restarts the re-admission wait
            worker.ejected_at = self._clock()

    def _record_success(self, worker: _Worker) -> None:
        worker.consecutive_failures = 0
        if not worker.healthy:
            worker.healthy = True
            worker.ejected_at = None
            logger.warning("re-admitting worker %s", worker.url)
            self._notify(worker)

    # ------------------------------------------------------------------ routing

    def _pick(self, tried: set[int]) -> _Worker | None:
        candidates = [w for w in self._workers if w.healthy and id(w) not in tried]
        if not candidates:
            now = self._clock()
            candidates = [
                w
                for w in self._workers
                if id(w) not in tried
                and w.ejected_at is not None
                and now - w.ejected_at >= self.readmit_after_s
            ]
            if not candidates:
                return None
            # one trial at a time: move the clock so concurrent requests do not pile onto it
            candidates[0].ejected_at = now
            return candidates[0]
        low = min(w.in_flight for w in candidates)
        best = [w for w in candidates if w.in_flight == low]
        self._rr += 1
        return best[self._rr % len(best)]

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        """Stream ``request`` from one worker, retrying elsewhere only before the first chunk."""
        tried: set[int] = set()
        errors: list[str] = []
        for _ in range(self.max_attempts):
            worker = self._pick(tried)
            if worker is None:
                break
            tried.add(id(worker))
            worker.in_flight += 1
            worker.requests += 1
            stream = worker.client.generate(request)
            started = False
            try:
                try:
                    first = await anext(stream)
                except EngineUnavailableError as exc:
                    self._record_failure(worker, exc.message)
                    errors.append(f"{worker.url}: {exc.message}")
                    continue
                started = True
                yield first
                async for chunk in stream:
                    yield chunk
                self._record_success(worker)
                return
            except EngineUnavailableError as exc:
                if started:
                    self._record_failure(worker, exc.message)
                raise
            except EngineStreamError as exc:
                self._record_failure(worker, exc.message)
                raise
            finally:
                worker.in_flight -= 1
                await stream.aclose()  # type: ignore[attr-defined]
                if worker.in_flight == 0 and all(w is not worker for w in self._workers):
                    # removed by discovery while this request ran: close it now
                    await worker.client.aclose()
        detail = "; ".join(errors) if errors else "no worker is admitted"
        raise NoHealthyWorkerError(f"no healthy engine worker could take the request ({detail})")

    async def abort(self, request_id: str) -> None:
        """Ask every worker to abort ``request_id`` (requests are not tracked per worker)."""
        await asyncio.gather(*(w.client.abort(request_id) for w in self._workers), return_exceptions=True)

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        """True when every worker can enforce ``kind`` (a request may land on any of them)."""
        return all(w.client.supports_constraint(kind) for w in self._workers)

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
            except Exception as exc:  # a probe error is a failed check, whatever it is
                ok, error = False, f"health check error: {exc!r}"
            if ok:
                self._record_success(worker)
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
            for url in sorted(source.current - wanted):
                await self.remove_client(url)
            source.current = wanted

    async def _dns_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.refresh_dns()

    async def start(self) -> None:
        """Resolve DNS sources once, then run health checks and discovery in the background."""
        if self._dns_sources:
            await self.refresh_dns()
            interval = min(s.interval_s for s in self._dns_sources)
            self._tasks.append(asyncio.create_task(self._dns_loop(interval)))
        if self.health_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._health_loop()))

    async def aclose(self) -> None:
        """Stop background tasks and close every client (and the shared HTTP client, if owned)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await asyncio.gather(*(w.client.aclose() for w in self._workers), return_exceptions=True)
        if self._owned_http is not None:
            await self._owned_http.aclose()


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
    vllm_grammar: bool = False,
    http: httpx.AsyncClient | None = None,
    **pool_options: object,
) -> WorkerPool:
    """A pool of SGLang or vLLM clients sharing one HTTP connection pool.

    ``urls`` may mix plain ``http://host:port`` workers and ``dns+http://host:port``
    sources (resolved when :meth:`WorkerPool.start` runs). ``model`` is required for vLLM
    (the ``model`` field of its requests); ``vllm_grammar`` lets vLLM clients send the
    tool-call grammar (``VLLMClient(grammar=True)``).
    """
    shared = http or new_http_client()

    def factory(url: str) -> EngineClient:
        if engine == "sglang":
            return SGLangClient(url, http=shared, cumulative=cumulative)
        if engine == "vllm":
            from deepseek_frontend.engines.vllm import VLLMClient

            if not model:
                raise ValueError("vLLM workers need the served model name (model=...)")
            return VLLMClient(url, model=model, http=shared, grammar=vllm_grammar)
        raise ValueError(f"unknown engine {engine!r} (expected 'sglang' or 'vllm')")

    pool = WorkerPool([factory(u) for u in urls if not u.startswith("dns+")], **pool_options)  # type: ignore[arg-type]
    for url in urls:
        if url.startswith("dns+"):
            pool.add_dns_source(url, factory)
    if http is None:
        pool._owned_http = shared
    return pool
