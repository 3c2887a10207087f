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
  request after sees the new configuration. The keys' limits follow (``RateLimiter.reconfigure``):
  a removed key's limits record is freed, and a key given a limit has its requests already in
  flight counted against it. A model that was removed or replaced drains -- its requests finish on
  it -- and is closed once they are done (or after ``drain_timeout_s``).

SIGHUPs are never lost, and never pile up: reloads run one at a time, and every SIGHUP that arrives
while one runs is answered by one more reload after it, which reads the file as it is then -- many
SIGHUPs during a reload make one more, and the last file written wins.

A retired model's memory goes back to the system once it is closed. A model whose tokenizer
settings did not change keeps its tokenizer (its largest part). The rest is collected: ``serve``
freezes what it allocated at start-up out of the collector's sight (``gc.freeze`` in
server/app.py), so a model built then and retired by a reload -- its caches, engine, router --
would never be collected; once the last retired model is closed the reloader unfreezes, collects,
and freezes again what is still alive (one full collection per reload, holding the event loop:
0.12 s measured), then asks the memory releaser to hand free heap pages back (``malloc_trim``,
edge/memory.py). What requests in flight then hold is frozen with the rest; any cycle of theirs
that becomes garbage waits for the next reload's collection (requests break their own cycles,
edge/route.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

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
    ``FrontendError`` for one that does not load). :meth:`request` is the SIGHUP handler: see the
    module docstring for how requests made during a reload are answered.
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
        #: the task running the requested reloads (None or done: none requested)
        self._runner: asyncio.Task[None] | None = None
        #: reload requests (SIGHUPs) received, and how many of them a finished reload answered
        self.requested = 0
        self._answered = 0
        #: reloads applied and refused since start (``/metrics``)
        self.applied = 0
        self.failed = 0
        #: times retired models' memory was released (collected and trimmed)
        self.memory_releases = 0

    @property
    def pending(self) -> bool:
        """Whether a requested reload has not finished yet."""
        return self._answered < self.requested

    def request(self) -> None:
        """Reload soon (the SIGHUP handler): queued behind a running reload, never dropped."""
        self.requested += 1
        if self._runner is None or self._runner.done():
            self._runner = asyncio.get_running_loop().create_task(self._answer_requests())

    async def _answer_requests(self) -> None:
        # each pass answers every request made before its file read began; a request made during
        # it makes one more pass, which reads the file again
        while self._answered < self.requested:
            asked = self.requested
            try:
                await self.reload()
            except Exception:  # a bug, not a bad file: logged, and the server goes on serving
                self.failed += 1
                log.exception("configuration reload failed, serving the previous configuration")
            self._answered = asked

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
        before = set(state.tenants.names) if state.tenants is not None else set()
        state.models = registry
        state.tenants = fleet.tenants
        state.fleet = fleet
        if state.limiter is not None:
            now = fleet.tenants if fleet.tenants is not None else ()
            state.limiter.reconfigure(now, removed=before - {tenant.name for tenant in now})
        state.metrics.serve_models(m.name for m in registry)
        kept = {id(m) for m in models}
        retired = [m for m in old if id(m) not in kept]
        built = len(started)
        del old, models, started  # nothing here holds a retired model while it drains
        for model in retired:
            task = asyncio.get_running_loop().create_task(model.drain(self.drain_timeout_s))
            self._draining[task] = model
            task.add_done_callback(self._drained)
        self._release_memory()
        log.info(
            "configuration reloaded: models %s (%d new or changed, %d retired), %d API keys",
            ", ".join(m.name for m in registry),
            built,
            len(retired),
            len(fleet.tenants) if fleet.tenants is not None else 0,
        )

    def _drained(self, task: asyncio.Task[None]) -> None:
        """A retired model is closed: once none is left, its memory goes back to the system."""
        self._draining.pop(task, None)
        if not self._draining:
            self._collect_retired()
            self._release_memory()

    def _collect_retired(self) -> None:
        """Collect what retired models left -- also models built at start-up, which ``serve`` froze
        out of the collector's sight (module docstring): unfreeze, collect, freeze what is alive."""
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.memory_releases += 1
        log.debug("retired models collected in %.3f s (the event loop held)", time.perf_counter() - started)

    def _release_memory(self) -> None:
        # building a model frees its temporaries (the tokenizer's JSON), a drained one everything:
        # glibc keeps both freed heaps unless asked (edge/memory.py)
        memory = self._state.memory
        if memory is not None:
            memory.release_soon()

    async def aclose(self) -> None:
        """Stop pending reloads and close the retired models still draining."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner
        for task, model in list(self._draining.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            await model.aclose()  # the server stops: its requests end with it

    def collect(self) -> Iterator[Metric]:
        """The reload metrics (a collector): ``deepseek_frontend_config_reloads_total{result}``
        (``applied`` / ``refused``), ``deepseek_frontend_config_reload_requests_total`` (SIGHUPs
        received: more than reloads when several came during one) and
        ``deepseek_frontend_config_reload_pending`` (1 while a requested reload has not finished)."""
        family = CounterMetricFamily(
            "deepseek_frontend_config_reloads",
            "Configuration reloads (SIGHUP), by whether the new configuration was applied.",
            labels=["result"],
        )
        family.add_metric(["applied"], self.applied)
        family.add_metric(["refused"], self.failed)
        yield family
        yield CounterMetricFamily(
            "deepseek_frontend_config_reload_requests",
            "Configuration reloads asked for (SIGHUPs); those arriving during a reload are answered "
            "by one more reload after it.",
            value=self.requested,
        )
        yield GaugeMetricFamily(
            "deepseek_frontend_config_reload_pending",
            "1 while a requested configuration reload has not finished.",
            value=1.0 if self.pending else 0.0,
        )

    def describe(self) -> Iterator[Metric]:
        return iter(())
