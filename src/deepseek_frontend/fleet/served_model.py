"""One served model and everything that is its own: tokenizer and prompt-id caches, engine backend
(worker pool and router, or the in-process simulated engine), pipeline, admission and metrics.

A server holds one :class:`ServedModel` per model it serves (api/model_registry.py). Nothing here
is shared between models except what the caller passes in (the event loop's turns and the offload
threads): one model's overload fills only its own admission queue, its dead workers fail only its
own requests, and its caches hold only its own prompts.

A request holds its model for its whole life (``enter`` / ``leave``), so a model replaced by a
configuration reload finishes the requests it started before it is closed (:meth:`drain`).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable
from typing import Any

from .admission import Admission
from .config import ServerConfig
from .metrics import FrontendMetrics

log = logging.getLogger("deepseek_frontend.api")

#: Constraint kinds each engine protocol can enforce, when the backend does not say itself.
DEFAULT_CONSTRAINT_SUPPORT = {
    "sglang": frozenset({"ebnf", "json_schema", "regex", "structural_tag"}),
    "vllm": frozenset({"ebnf", "json_schema", "regex"}),
    "sim": frozenset({"ebnf", "json_schema"}),
}
#: seconds between two looks at a new model's workers while a reload waits for one to be ready
READY_POLL_S = 0.05


class EngineBackend:
    """The engine side as the pipeline sees it: a WorkerPool or the in-process sim, plus
    ``supports_constraint`` and worker statuses whatever the underlying object offers."""

    def __init__(self, target: Any, engine: str) -> None:
        self.target = target
        self.engine = engine
        self.generate = target.generate
        self._supports: Callable[[str], bool] | None = getattr(target, "supports_constraint", None)
        self._capabilities: Callable[[], Any] | None = getattr(target, "capabilities", None)

    def capabilities(self) -> Any:
        """The workers' combined ``WorkerCapabilities`` (None when the target reports none)."""
        return self._capabilities() if callable(self._capabilities) else None

    def supports_constraint(self, kind: str) -> bool:
        if self._supports is not None:
            return bool(self._supports(kind))
        return kind in DEFAULT_CONSTRAINT_SUPPORT.get(self.engine, frozenset())

    def statuses(self) -> list[Any]:
        from deepseek_frontend.generation import WorkerStatus

        for attr in ("statuses", "worker_statuses", "status"):
            fn = getattr(self.target, attr, None)
            if callable(fn):
                result = fn()
                return list(result.values()) if isinstance(result, dict) else list(result)
        stats = getattr(self.target, "stats", None)
        running = getattr(stats, "running", 0) if stats is not None else 0
        return [WorkerStatus(url=getattr(self.target, "name", "sim"), healthy=True, in_flight=running)]

    async def start(self) -> None:
        """Start the target. A worker pool discovers its workers in the background, so the server
        answers ``/live`` at once whatever its workers do (``/health`` names the workers still
        being discovered; requests get a 503 with ``Retry-After`` until one is ready)."""
        from deepseek_frontend.engines.pool import WorkerPool

        if isinstance(self.target, WorkerPool):
            await self.target.start(wait_for_discovery=False)
            return
        fn = getattr(self.target, "start", None)
        if fn is not None:
            await fn()

    async def aclose(self) -> None:
        fn = getattr(self.target, "aclose", None)
        if fn is not None:
            await fn()


def build_backend(config: ServerConfig, tokenizer: Any) -> EngineBackend:
    """The engine backend ``config`` asks for (not started yet)."""
    if config.engine == "sim":
        from deepseek_frontend.engines.sim.behavior import PRESETS
        from deepseek_frontend.engines.sim.engine import SimulatedEngine

        engine = SimulatedEngine(
            tokenizer,
            ttft_ms=config.sim_ttft_ms,
            itl_ms=config.sim_itl_ms,
            tokens_per_chunk=config.sim_tokens_per_chunk,
            behavior=PRESETS[config.sim_behave] if config.sim_behave != "ideal" else None,
        )
        return EngineBackend(engine, "sim")
    from deepseek_frontend.engines.pool import from_urls
    from deepseek_frontend.routing import Router, RouterConfig

    if config.prefill_workers:
        from deepseek_frontend.disagg.pool import build_disaggregated

        return EngineBackend(build_disaggregated(config, stream_limits(config, tokenizer)), config.engine)
    pool = from_urls(
        config.engine,
        config.workers,
        model=config.worker_model or config.served_model_name,
        vllm_grammar=config.vllm_grammar,
        health_interval_s=config.health_check_interval,
        health_timeout_s=config.health_check_timeout,
        max_attempts=config.max_retries + 1,
        limits=stream_limits(config, tokenizer),
        router=Router(config.router or RouterConfig()),
        migration_limit=config.migration_limit,
    )
    return EngineBackend(pool, config.engine)


def stream_limits(config: ServerConfig, tokenizer: Any) -> Any:
    """The worker pool's :class:`~deepseek_frontend.engines.pool.StreamLimits` for ``config``."""
    from deepseek_frontend.engines.pool import StreamLimits

    lim = config.limits
    return StreamLimits(
        max_in_flight_per_worker=lim.max_requests_per_worker,
        # every admitted request may hold an engine stream; n > 1 choices wait for a slot
        max_in_flight=max(lim.max_concurrent_requests, lim.max_requests_per_worker),
        capacity_wait_s=lim.queue_timeout,
        first_token_timeout_s=lim.first_token_timeout or None,
        response_timeout_s=lim.worker_response_timeout or None,
        idle_timeout_s=lim.idle_timeout or None,
        request_timeout_s=lim.request_timeout or None,
        vocab_size=getattr(tokenizer, "vocab_size", None),
    )


def load_tokenizer(config: ServerConfig) -> Any:
    """The tokenizer ``config``'s model renders with (``tokenization.load_for_family``). The V4.1 stand-in
    (a V4.1 model without a checkpoint: simulated engine only, ServerConfig refuses real workers) is
    logged."""
    from deepseek_frontend.tokenization import has_own_tokenizer, load_for_family

    source = config.tokenizer_path or config.model_path
    if config.family == "deepseek_v41" and not has_own_tokenizer(source):
        log.warning(
            "DeepSeek-V4.1 on the simulated engine: using a stand-in tokenizer derived from the bundled "
            "DeepSeek-V4 tokenizer (ids 128799 and 129264 renamed to <｜System｜> and <｜deepseek_image｜>); "
            "real workers need the checkpoint's tokenizer (--model-path or --tokenizer)"
        )
    return load_for_family(
        config.family,
        source,
        run_cache_bytes=config.run_cache_bytes,
        prefix_cache_bytes=config.prefix_cache_bytes,
        cache_idle_s=config.cache_idle_seconds,
    )


class ServedModel:
    """A model the server answers for, with all its per-model state.

    ``config`` is the model's resolved :class:`ServerConfig` (its server-wide fields are the
    server's). Requests :meth:`enter` it once routed to it and :meth:`leave` when done.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        tokenizer: Any | None = None,
        backend: Any | None = None,
        shared_with: ServedModel | None = None,
    ) -> None:
        from deepseek_frontend.pipeline.chat import ChatPipeline

        self.config = config
        self.name = config.served_model_name
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(config)
        self.backend = (
            EngineBackend(backend, config.engine)
            if backend is not None
            else build_backend(config, self.tokenizer)
        )
        self.metrics = FrontendMetrics()
        if hasattr(self.tokenizer, "cache_stats"):
            self.metrics.watch_caches(self.tokenizer.cache_stats)
        target = self.backend.target
        self.router = getattr(target, "router", None)
        routers = getattr(target, "routers", None)  # one per role (prefill/decode): labelled by role
        if self.router is not None or routers:
            from deepseek_frontend.routing.metrics import RoutingCollector

            self.metrics.registry.register(RoutingCollector(routers or self.router))
        if hasattr(target, "pd_stats"):
            from deepseek_frontend.disagg.metrics import PdCollector

            self.metrics.registry.register(PdCollector(target))
        # one event loop and one CPU budget per process: every model's prompt work takes the same
        # loop turns and the same offload threads
        shared = shared_with.pipeline if shared_with is not None else None
        self.pipeline = ChatPipeline(
            config,
            self.tokenizer,
            self.backend,
            self.metrics,
            offload=shared.offload if shared is not None else None,
            turns=shared.turns if shared is not None else None,
        )
        lim = config.limits
        self.admission = Admission(lim.max_concurrent_requests, lim.max_queued_requests, lim.queue_timeout)
        self.metrics.watch_admission(self.admission)
        #: requests routed to this model and not yet done
        self.active = 0
        self._idle: asyncio.Event | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.started_at = int(time.time())

    def __repr__(self) -> str:
        return f"ServedModel({self.name!r}, family={self.config.family!r}, engine={self.config.engine!r})"

    def enter(self) -> None:
        """A request was routed to this model."""
        self.active += 1

    def leave(self) -> None:
        """A request routed to this model is done."""
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self._idle.set()

    def statuses(self) -> list[Any]:
        """Its workers' ``WorkerStatus`` values."""
        return self.backend.statuses()

    def ready(self) -> bool:
        """Whether at least one of its workers is healthy."""
        return any(s.healthy for s in self.statuses())

    async def start(self) -> None:
        """Start its backend and its cache sweeper."""
        await self.backend.start()
        self._sweeper = asyncio.create_task(
            _expire_idle_cache_entries(self.tokenizer, self.config.cache_idle_seconds)
        )

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait until a worker is healthy, at most ``timeout_s`` seconds; whether one is."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.ready():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(READY_POLL_S)  # the pools' health checks set no event to wait on
        return True

    async def drain(self, timeout_s: float) -> None:
        """Wait until the requests routed here are done (at most ``timeout_s``), then close."""
        if self.active:
            self._idle = asyncio.Event()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._idle.wait()
            except TimeoutError:
                log.warning(
                    "model %s closed with %d requests still running after %.0f s",
                    self.name,
                    self.active,
                    timeout_s,
                )
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the sweeper and close the backend (its engine streams end)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await self.backend.aclose()


async def _expire_idle_cache_entries(tokenizer: Any, idle_s: float) -> None:
    """Release idle prompt-id cache entries even when no request arrives to trigger it.

    After a sweep that freed something, glibc is asked to hand free heap pages back to the
    system (``malloc_trim``): without it the freed entries stay in the process's RSS.
    """
    if not hasattr(tokenizer, "expire_idle"):
        return
    trim = _malloc_trim()
    while True:
        await asyncio.sleep(max(1.0, min(idle_s / 4, 60.0)))
        before = sum(c["bytes"] for c in tokenizer.cache_stats().values())
        tokenizer.expire_idle()
        if trim is not None and sum(c["bytes"] for c in tokenizer.cache_stats().values()) < before:
            trim(0)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on other C libraries."""
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None
