"""One served model and everything that is its own: tokenizer and prompt-id caches, engine (worker
pool and router, prefill/decode pools, or the in-process simulated engine), pipeline, admission and
metrics.

A server holds one :class:`ServedModel` per model it serves (fleet/registry.py). It receives its
tokenizer, engine and pipeline built (``server/compose.py`` decides which engine, router and
tokenizer a configuration means) and owns their life: it starts and closes the engine, expires the
tokenizer's idle cache entries, and exports the engine's collectors with its own metrics. Nothing
here is shared between models except what the caller passes in (the event loop's turns and the
offload threads, through the pipeline): one model's overload fills only its own admission queue,
its dead workers fail only its own requests, and its caches hold only its own prompts.

A request holds its model for its whole life (``enter`` / ``leave``), so a model replaced by a
configuration reload finishes the requests it started before it is closed (:meth:`drain`).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .admission import Admission
from .config import ServerConfig
from .metrics import FrontendMetrics

if TYPE_CHECKING:
    from deepseek_frontend.engines.base import Engine
    from deepseek_frontend.generation import WorkerStatus
    from deepseek_frontend.pipeline.chat import ChatPipeline
    from deepseek_frontend.routing.router import Router
    from deepseek_frontend.tokenization import PromptTokenizer

log = logging.getLogger("deepseek_frontend.api")

#: seconds between two looks at a new model's workers while a reload waits for one to be ready
READY_POLL_S = 0.05


class ServedModel:
    """A model the server answers for, with all its per-model state.

    ``config`` is the model's resolved :class:`ServerConfig` (its server-wide fields are the
    server's). Requests :meth:`enter` it once routed to it and :meth:`leave` when done.
    """

    def __init__(
        self,
        config: ServerConfig,
        *,
        tokenizer: PromptTokenizer,
        engine: Engine,
        pipeline: ChatPipeline,
        metrics: FrontendMetrics,
    ) -> None:
        self.config = config
        self.name = config.model.served_model_name
        self.tokenizer = tokenizer
        self.engine = engine
        #: the pipeline over ``tokenizer`` and ``engine``, recording into ``metrics``
        self.pipeline = pipeline
        self.metrics = metrics
        metrics.watch_caches(tokenizer.cache_stats)
        for collector in engine.collectors():
            metrics.registry.register(collector)
        lim = config.limits
        self.admission = Admission(lim.max_concurrent_requests, lim.max_queued_requests, lim.queue_timeout)
        metrics.watch_admission(self.admission)
        #: requests routed to this model and not yet done
        self.active = 0
        self._idle: asyncio.Event | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.started_at = int(time.time())

    def __repr__(self) -> str:
        model, engine = self.config.model, self.config.engine
        return f"ServedModel({self.name!r}, family={model.family!r}, engine={engine.kind!r})"

    def enter(self) -> None:
        """A request was routed to this model."""
        self.active += 1

    def leave(self) -> None:
        """A request routed to this model is done."""
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self._idle.set()

    def routers(self) -> Sequence[Router]:
        """The routers choosing its workers (none: its engine routes nothing)."""
        return self.engine.routers()

    def statuses(self) -> list[WorkerStatus]:
        """Its workers' ``WorkerStatus`` values."""
        return self.engine.statuses()

    def ready(self) -> bool:
        """Whether at least one of its workers is healthy."""
        return any(s.healthy for s in self.statuses())

    async def start(self) -> None:
        """Start its engine and its cache sweeper."""
        await self.engine.start()
        self._sweeper = asyncio.create_task(
            _expire_idle_cache_entries(self.tokenizer, self.config.model.cache_idle_seconds)
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
        """Stop the sweeper and close the engine (its streams end)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        await self.engine.aclose()


async def _expire_idle_cache_entries(tokenizer: PromptTokenizer, idle_s: float) -> None:
    """Release idle prompt-id cache entries even when no request arrives to trigger it.

    After a sweep that freed something, glibc is asked to hand free heap pages back to the
    system (``malloc_trim``): without it the freed entries stay in the process's RSS.
    """
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
