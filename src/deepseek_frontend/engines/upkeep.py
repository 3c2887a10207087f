"""Keeping a pool's workers known and current: health probes, capability discovery and vetting,
DNS sources, start-up and shutdown.

Health: the probe is each client's ``check_health`` (SGLang: ``GET /server_info``, which does not
generate) bounded by ``health_timeout_s`` (default 30 s, above SGLang's own 20 s health wait), plus
the outcomes of real requests. A slow worker that still answers is never charged a failure.

Capabilities: :meth:`WorkerUpkeep.start` asks every worker what it can serve
(``EngineClient.discover``; a worker gets no request before its first answer, and ``start`` may
return before them, see its docstring), and asks again when a worker is added or re-admitted, or passes a
probe while nothing is known about it. A request that needs a constraint kind goes only to workers
that enforce it; :meth:`~deepseek_frontend.engines.pool.WorkerPool.capabilities` combines what the
admitted workers reported (smallest context, largest output reservation, seeds only if all honour them).

Discovery: a ``dns+http://host:port`` worker URL (for example a Kubernetes headless
Service) is resolved every ``dns_interval_s``; each A/AAAA record becomes a worker
``http://IP:port``, added and removed as records change.

Vetting: an owner may set ``WorkerPool.vet`` (``(url, capabilities) -> reason or None``); it
runs on every discovery, and a worker it refuses gets no request until a later discovery accepts
it. With a vet set, a worker added after construction (DNS) is held back until its first discovery
has been vetted (the prefill/decode orchestrator checks roles this way; the server's aggregated
pool refuses prefill and decode workers with :func:`aggregated_role_refusal`). With
``refuse_at_start`` a refusal of a worker given at start stops :meth:`WorkerUpkeep.start`
(:class:`WorkerRoleError`, one line naming the worker and what it reports); :meth:`start` waits for
those first discoveries even when they run in the background, at most :data:`START_CHECK_S` (a
worker slower than that is vetted, and refused, when it answers).

A worker is not reported healthy before its first discovery has answered: one whose discovery did
not answer and whose health probe fails then is taken out at once (not after
``eject_after_failures`` failed probes); the health loop re-admits it when it answers.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import httpx

from deepseek_frontend._tasks import cancel_and_wait
from deepseek_frontend.engines._http import StreamSession
from deepseek_frontend.engines.base import EngineClient
from deepseek_frontend.engines.workers import Worker
from deepseek_frontend.generation import WorkerCapabilities

if TYPE_CHECKING:
    from deepseek_frontend.routing.router import Router

__all__ = [
    "DNS_INTERVAL_S",
    "HEALTH_INTERVAL_S",
    "HEALTH_TIMEOUT_S",
    "START_CHECK_S",
    "DnsSource",
    "Resolver",
    "WorkerRoleError",
    "WorkerUpkeep",
    "aggregated_role_refusal",
    "system_resolver",
]

#: the pool's log lines keep one logger name, whichever of its modules holds the code
logger = logging.getLogger("deepseek_frontend.engines.pool")

#: seconds between health checks of every worker
HEALTH_INTERVAL_S = 5.0
#: seconds one health check (or capability discovery) may take: longer than SGLang's own 20 s
#: health wait, so a busy worker is not taken for a dead one
HEALTH_TIMEOUT_S = 30.0
#: seconds between DNS resolutions of dns+ worker URLs
DNS_INTERVAL_S = 10.0
#: seconds :meth:`WorkerUpkeep.start` waits for background first discoveries before it checks the
#: workers given at start (``refuse_at_start``)
START_CHECK_S = 5.0


class WorkerRoleError(ValueError):
    """Workers given at start that the pool's vet refuses (``refuse_at_start``): serving cannot start."""


def aggregated_role_refusal(url: str, caps: WorkerCapabilities) -> str | None:
    """Why an aggregated pool (``--worker``) must not use a worker: an SGLang worker started with
    ``--disaggregation-mode prefill`` or ``decode`` (its ``/server_info`` ``disaggregation_mode``)
    refuses every request without a bootstrap room with a 400 that would reach clients as their
    fault. None for an aggregated worker, or one that does not say (vLLM)."""
    mode = caps.extra.get("disaggregation_mode")
    if mode not in ("prefill", "decode"):
        return None
    return (
        f'{url} reports disaggregation_mode "{mode}" (an SGLang {mode} worker) but was given as --worker: '
        f"give prefill and decode workers as --prefill-worker and --decode-worker, or start it without "
        f"--disaggregation-mode"
    )


Resolver = Callable[[str, int], Awaitable[Iterable[str]]]
"""``(host, port) -> IP addresses``; the default asks the system resolver (A and AAAA records)."""


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(sockaddr[0]) for _, _, _, _, sockaddr in infos]


@dataclass(slots=True)
class DnsSource:
    """One ``dns+`` worker URL: how to make a client per address, and the worker URLs it last gave."""

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


class WorkerUpkeep:
    """The part of :class:`~deepseek_frontend.engines.pool.WorkerPool` that keeps its workers known
    and current (see module docstring); the pool sets the attributes below and provides the
    admission bookkeeping (``_record_success``, ``_record_failure``, ``_notify``, ``add_client``,
    ``remove_client``, ``capabilities``) these methods use."""

    _workers: list[Worker]
    router: Router | None
    vet: Callable[[str, WorkerCapabilities], str | None] | None
    health_interval_s: float
    health_timeout_s: float
    readmit_after_s: float
    _clock: Callable[[], float]
    _tasks: list[asyncio.Task[None]]
    _dns_sources: list[DnsSource]
    _discoveries: set[asyncio.Task[None]]
    _startup: asyncio.Task[None] | None
    _owned_http: httpx.AsyncClient | None
    _owned_streams: StreamSession | None
    discover_in_background: bool
    #: a vet's refusal of a worker given at start stops :meth:`start` (see the module docstring)
    refuse_at_start: bool
    _start_refusals: list[str]

    async def discover(self) -> WorkerCapabilities | None:
        """Ask every worker now (as :meth:`start` does); the combined :meth:`capabilities`."""
        await asyncio.gather(*(self._discover(w) for w in list(self._workers)))
        return self.capabilities()

    async def _discover(self, worker: Worker) -> None:
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
            # whether (and which way) the worker schedules by a request's priority field
            "priority_order": caps.priority_order,
        }

    def _rediscover_later(self, worker: Worker) -> None:
        """Ask a re-admitted worker its capabilities again (it may have restarted with other flags),
        in the background: re-admission happens on request and probe paths that must not wait."""
        try:
            task = asyncio.get_running_loop().create_task(self._discover(worker))
        except RuntimeError:  # no running loop (a synchronous caller): the next probe asks
            return
        self._discoveries.add(task)
        task.add_done_callback(self._discoveries.discard)

    async def _probe_unknown(self, worker: Worker) -> None:
        """A worker whose first discovery did not answer: probe it once, and take it out at once
        when that fails too (it is not reported healthy meanwhile; a passing probe re-admits it)."""
        try:
            ok = await asyncio.wait_for(worker.client.check_health(), self.health_timeout_s)
        except Exception:  # a probe error is a failed check, whatever it is
            ok = False
        if not ok:
            self._record_failure(
                worker, "unreachable at start: discovery and health check failed", eject=True
            )

    async def check_all(self) -> None:
        """One health-check round over every worker (the loop calls this; tests may too)."""

        async def probe(worker: Worker) -> None:
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
        self._dns_sources.append(DnsSource(url, factory, interval_s, resolver))

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

    async def start(self, *, wait_for_discovery: bool | None = None) -> None:
        """Resolve DNS sources once and ask every worker what it serves, then run health checks
        (and DNS refreshes) in the background.

        A worker gets no request until its first discovery has answered or failed (the pipeline
        sizes default ``max_tokens`` and checks constraints with what it learns): meanwhile its
        status says ``discovery: pending`` and a request that finds no other worker gets
        :class:`~deepseek_frontend.errors.WorkersStartingError` (503 with ``Retry-After``).
        ``wait_for_discovery=False`` returns at once and lets all of that run in the background
        (the server does, so that it answers ``/live`` while a worker is slow to answer);
        :meth:`wait_discovered` waits for it. None (the default): the pool's
        ``discover_in_background`` decides.
        """
        if wait_for_discovery is None:
            wait_for_discovery = not self.discover_in_background
        pending = [w for w in self._workers if w.capabilities is None]
        for w in pending:
            w.discovering = True
        self._startup = asyncio.create_task(self._start_up(pending))
        if wait_for_discovery:
            await self.wait_discovered()
        elif self.refuse_at_start and self.vet is not None:
            # long enough for a worker that answers to be vetted; a slower one is refused later
            await asyncio.wait({self._startup}, timeout=START_CHECK_S)
        if self._start_refusals:
            raise WorkerRoleError("; ".join(self._start_refusals))

    async def wait_discovered(self) -> None:
        """Return once :meth:`start`'s DNS resolution and first discoveries are done."""
        if self._startup is not None:
            await asyncio.shield(self._startup)

    async def _start_up(self, pending: list[Worker]) -> None:
        async def first_discovery(worker: Worker) -> None:
            try:
                await self._discover(worker)
                if worker.capabilities is None:
                    await self._probe_unknown(worker)
                elif worker.refused is not None and self.refuse_at_start:
                    self._start_refusals.append(worker.refused)
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
