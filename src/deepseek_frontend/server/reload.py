"""Re-reading the configuration while serving (``serve --config FILE`` / ``--keys-file``, on SIGHUP).

A reload never drops a request:

* The new file is read and checked completely first (off the event loop); one that does not load
  is logged and the server keeps its configuration.
* A model whose resolved configuration did not change is kept as it is, with its caches, router
  state, admission queue and in-flight requests. A new or changed model is built (tokenizer on a
  thread), started, and given up to ``ready_timeout_s`` for a worker to pass its health check
  before it takes requests, so requests do not meet a pool that is still discovering its workers.
* Then the registry and the keys are swapped at once (one assignment each, between two requests'
  steps on the event loop): every request routed before goes on with the model it holds, every
  request after sees the new configuration. A model that was removed or replaced drains -- its
  requests finish on it -- and is closed once they are done (or after ``drain_timeout_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, Metric

from deepseek_frontend.errors import FrontendError
from deepseek_frontend.fleet.config_file import Fleet
from deepseek_frontend.fleet.registry import ModelRegistry
from deepseek_frontend.fleet.served_model import ServedModel

from .compose import build_model

if TYPE_CHECKING:
    from deepseek_frontend.edge.context import FrontendState

log = logging.getLogger("deepseek_frontend.serve")

#: seconds a new model's workers get to become healthy before the model takes requests anyway
READY_TIMEOUT_S = 30.0
#: seconds a replaced model's requests get to finish before it is closed under them
DRAIN_TIMEOUT_S = 600.0


#: the settings of a model's ``ModelConfig`` its tokenizer is loaded with (server/compose.load_tokenizer)
_TOKENIZER_SETTINGS = (
    "family",
    "model_path",
    "tokenizer_path",
    "run_cache_bytes",
    "prefix_cache_bytes",
    "cache_idle_seconds",
)


def _same_tokenizer(model: ServedModel, config: Any) -> bool:
    """Whether ``config`` loads the tokenizer ``model`` has (then the new model shares it)."""
    return all(
        getattr(model.config.model, name) == getattr(config.model, name) for name in _TOKENIZER_SETTINGS
    )


class FleetReloader:
    """Applies a freshly loaded :class:`Fleet` to a running server's ``FrontendState``.

    ``load`` reads the configuration again (raising ``ValueError`` / ``OSError`` /
    ``FrontendError`` for one that does not load). Reloads run one at a time; a SIGHUP during
    one queues exactly one more.
    """

    def __init__(
        self,
        state: FrontendState,
        load: Callable[[], Fleet],
        *,
        ready_timeout_s: float = READY_TIMEOUT_S,
        drain_timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> None:
        self._state = state
        self._load = load
        self.ready_timeout_s = ready_timeout_s
        self.drain_timeout_s = drain_timeout_s
        self._lock = asyncio.Lock()
        #: retired models still finishing their requests, by their drain task
        self._draining: dict[asyncio.Task[None], ServedModel] = {}
        self._pending: asyncio.Task[bool] | None = None
        #: reloads applied and refused since start (``/metrics``)
        self.applied = 0
        self.failed = 0

    def request(self) -> None:
        """Reload soon (a signal handler's call): at most one reload waits behind a running one."""
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().create_task(self.reload())

    async def reload(self) -> bool:
        """Read the configuration and apply it; whether it was applied."""
        async with self._lock:
            try:
                fleet = await asyncio.to_thread(self._load)
            except (ValueError, OSError, FrontendError) as exc:
                self.failed += 1
                log.error("configuration reload refused, serving the previous configuration: %s", exc)
                return False
            try:
                await self.apply(fleet)
            except (ValueError, OSError, FrontendError) as exc:
                self.failed += 1
                log.error("configuration reload failed, serving the previous configuration: %s", exc)
                return False
            self.applied += 1
            return True

    async def apply(self, fleet: Fleet) -> None:
        """Swap ``fleet`` in: keep unchanged models, start new ones, drain the ones left out."""
        state = self._state
        old = state.models
        models: list[ServedModel] = []
        started: list[ServedModel] = []
        try:
            for config in fleet.models:
                current = old.get(config.model.served_model_name)
                if current is not None and current.config == config:
                    models.append(current)
                    continue
                # the tokenizer (~100 MB, and its warm caches) carries over when its settings did not
                # change: loading a new one and freeing the old leaves the freed heap fragmented in
                # the process (RSS 331 -> 707 MB after six reloads of two models, for good)
                tokenizer = (
                    current.tokenizer if current is not None and _same_tokenizer(current, config) else None
                )
                model = await asyncio.to_thread(
                    build_model, config, shared_with=old.default, tokenizer=tokenizer
                )
                started.append(model)
                models.append(model)
                await model.start()
            for model in started:
                if not await model.wait_ready(self.ready_timeout_s):
                    log.warning(
                        "model %s: no worker healthy %.0f s after the reload; it takes requests now",
                        model.name,
                        self.ready_timeout_s,
                    )
        except BaseException:
            for model in started:
                await model.aclose()
            raise
        registry = ModelRegistry(models)
        state.models = registry
        state.tenants = fleet.tenants
        state.fleet = fleet
        state.metrics.serve_models(m.name for m in registry)
        kept = {id(m) for m in models}
        retired = [m for m in old if id(m) not in kept]
        for model in retired:
            task = asyncio.get_running_loop().create_task(model.drain(self.drain_timeout_s))
            self._draining[task] = model
            task.add_done_callback(self._drained)
        self._release_memory()
        log.info(
            "configuration reloaded: models %s (%d new or changed, %d retired), %d API keys",
            ", ".join(m.name for m in registry),
            len(started),
            len(retired),
            len(fleet.tenants) if fleet.tenants is not None else 0,
        )

    def _drained(self, task: asyncio.Task[None]) -> None:
        """A retired model is closed: once none is left, its memory goes back to the system."""
        self._draining.pop(task, None)
        if not self._draining:
            self._release_memory()

    def _release_memory(self) -> None:
        # building a model frees its temporaries (the tokenizer's JSON), a drained one everything:
        # glibc keeps both freed heaps unless asked (edge/memory.py)
        memory = self._state.memory
        if memory is not None:
            memory.release_soon()

    async def aclose(self) -> None:
        """Stop a pending reload and close the retired models still draining."""
        if self._pending is not None:
            self._pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pending
        for task, model in list(self._draining.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            await model.aclose()  # the server stops: its requests end with it

    def collect(self) -> Iterator[Metric]:
        """``deepseek_frontend_config_reloads_total{result="applied"|"refused"}`` (a collector)."""
        family = CounterMetricFamily(
            "deepseek_frontend_config_reloads",
            "Configuration reloads (SIGHUP), by whether the new configuration was applied.",
            labels=["result"],
        )
        family.add_metric(["applied"], self.applied)
        family.add_metric(["refused"], self.failed)
        yield family

    def describe(self) -> Iterator[Metric]:
        return iter(())
