"""The Starlette application: routes, middlewares, lifespan.

``create_app(config)`` wires everything once; the shared state lives at
``app.frontend`` (:class:`~deepseek_frontend.edge.context.FrontendState`): the served models
(fleet/registry.py; each with its own tokenizer, engine, pipeline, admission and metrics,
fleet/served_model.py, built by compose.py), the API keys and their limits, the state store and the tracer.

Routes::

    POST /v1/chat/completions   openai.chat.chat_completions
    POST /v1/completions        completions.completions
    GET  /v1/models             every name the request's key may use (info_routes.py)
    GET  /health                JSON with every model's worker states; 503 when no model has a healthy one
    GET  /live                  process liveness (never touches workers)
    GET  /metrics               Prometheus text, per model (a ``model`` label)
    + the ROUTES of deepseek_frontend.api.anthropic / .responses / .conversations / .batches

The batch runner (api/batches/runner.py) starts once the state store is open and stops before it
closes.

Auth (with API keys): edge/auth.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from prometheus_client import Counter
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from deepseek_frontend._tracing import tracer_from_env
from deepseek_frontend.edge.arrivals import ArrivalPacer
from deepseek_frontend.edge.auth import AuthMiddleware
from deepseek_frontend.edge.background import BackgroundTasks
from deepseek_frontend.edge.body_readers import BodyReaders
from deepseek_frontend.edge.context import FrontendApp, FrontendState, get_state
from deepseek_frontend.edge.errors import error_response, shape_for
from deepseek_frontend.edge.memory import MemoryReleaser
from deepseek_frontend.edge.turns import RecentHeads, TurnGate
from deepseek_frontend.engines.base import Engine
from deepseek_frontend.errors import FrontendError, RequestError
from deepseek_frontend.fleet.config import ServerConfig
from deepseek_frontend.fleet.config_file import Fleet
from deepseek_frontend.fleet.metrics import FrontendMetrics
from deepseek_frontend.fleet.served_model import ServedModel
from deepseek_frontend.fleet.store_config import open_state_store
from deepseek_frontend.images import ImageResolver
from deepseek_frontend.keys.rate_limits import KeyUsageMetrics, LimitStateCollector, RateLimiter
from deepseek_frontend.keys.tenants import TenantTable
from deepseek_frontend.state import purge_forever
from deepseek_frontend.state.continuity import ReasoningContinuity
from deepseek_frontend.tokenization import PromptTokenizer

from . import hangups
from .compose import build_models
from .info_routes import health, list_models, live, metrics_endpoint, retrieve_model
from .reload import FleetReloader
from .startup import startup_step

log = logging.getLogger("deepseek_frontend.api")


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    err: FrontendError
    if exc.status_code == 404:
        err = RequestError(f"no route {request.method} {request.url.path}")
        err.status_code = 404
        err.error_type = "not_found_error"
    elif exc.status_code == 405:
        err = RequestError(f"method {request.method} is not allowed on {request.url.path}")
        err.status_code = 405
    else:
        err = RequestError(str(exc.detail))
        err.status_code = exc.status_code
    shape = shape_for(request.url.path, get_state(request).api_shapes)
    return error_response(err, shape.error_body, headers=exc.headers)


async def _frontend_error(request: Request, exc: Exception) -> Response:
    return error_response(exc, shape_for(request.url.path, get_state(request).api_shapes).error_body)


def _listen_for_sighup(reloader: FleetReloader | None, hangups_seen: int | None) -> bool:
    """Reload on SIGHUP (only the main thread's loop can take signals: not under a test client);
    and now when SIGHUPs came since the configuration was read (``hangups_seen``, server/hangups.py)."""
    if reloader is None or threading.current_thread() is not threading.main_thread():
        return False
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.request)
    if hangups_seen is not None and hangups.count() > hangups_seen:
        reloader.request()
    return True


async def _start_models(models: Iterable[ServedModel]) -> None:
    # a function of its own: a loop variable in the lifespan would hold the last model for the
    # server's life, also after a reload retired it
    for model in models:
        with startup_step(f"model {model.name}: its engine and workers"):
            await model.start()


def create_app(
    config: ServerConfig,
    *,
    tokenizer: PromptTokenizer | None = None,
    backend: Engine | None = None,
    fleet: Fleet | None = None,
    shared_limits: Any = None,
    process_index: int = 0,
    load_fleet: Callable[[], Fleet] | None = None,
    hangups_seen: int | None = None,
) -> Starlette:
    """The ASGI app serving ``fleet``'s models (default: ``config``'s one model and its keys).

    ``config`` gives the server-wide settings (with a fleet: its first model's configuration).
    ``tokenizer`` and ``backend`` (any :class:`~deepseek_frontend.engines.base.Engine`) may be
    injected by tests and benchmarks for the first model; by default they are built from its
    configuration (server/compose.py). The engines are started and closed by the app's lifespan.
    ``shared_limits`` (``limit_state.SharedLimitState``) holds the keys' limits across the
    processes of ``serve --workers N``, this one being ``process_index``. ``load_fleet`` reads the
    configuration again: given, the server reloads it on SIGHUP (server/reload.py), and at start
    when SIGHUPs arrived since it was read (``hangups_seen``: :func:`hangups.count` then).
    """
    from deepseek_frontend.api import batches as batch_routes
    from deepseek_frontend.api.anthropic import routes as anthropic_routes
    from deepseek_frontend.api.batches.runner import BatchRunner
    from deepseek_frontend.api.conversations import routes as conversation_routes
    from deepseek_frontend.api.openai.chat import chat_completions
    from deepseek_frontend.api.openai.completions import completions
    from deepseek_frontend.api.responses import routes as response_routes

    if fleet is None:
        keys = config.server.accepted_api_keys
        fleet = Fleet((config,), TenantTable.from_plain_keys(keys) if keys else None)
    models = build_models(fleet.models, tokenizer=tokenizer, engine=backend)
    metrics = FrontendMetrics(models=[m.name for m in models])
    lim = config.limits
    pipeline = models.default.pipeline  # its loop turns and offload threads are every model's
    store = config.server.state.build()
    restored = Counter(
        "deepseek_frontend_reasoning_restored",
        "Assistant turns sent back without the reasoning this server produced for them, "
        "whose reasoning was restored from the state store (by API).",
        ["api"],
        registry=metrics.registry,
    )
    limiter = RateLimiter(shared_limits, process_index)
    metrics.registry.register(LimitStateCollector(limiter))
    state = FrontendState(
        models=models,
        metrics=metrics,
        store=store,
        images=ImageResolver(config.server.images, offload=pipeline.offload.run),
        turns=pipeline.turns,
        background=BackgroundTasks(),
        continuity=ReasoningContinuity(store, restored),
        started_at=int(time.time()),
        body_readers=BodyReaders(lim.max_body_readers, lim.max_body_readers_per_client, lim.queue_timeout),
        memory=MemoryReleaser(),
        recent_heads=RecentHeads(),
        arrivals=ArrivalPacer(max_hold_s=lim.arrival_hold_timeout) if lim.arrival_hold_timeout else None,
        tenants=fleet.tenants,
        limiter=limiter,
        key_usage=KeyUsageMetrics(metrics.registry),
        fleet=fleet,
    )
    reloader = FleetReloader(state, load_fleet) if load_fleet is not None else None
    if reloader is not None:
        metrics.registry.register(reloader)
    metrics.watch_process(
        lambda: state.models.default.pipeline.offload.pending,  # every model's (compose.py)
        # the serve command gives its HTTP protocol's counters (none under a test client)
        lambda: state.connection_stats,
        state.arrivals,
        lambda: state.connection_counts,
    )

    routes: list[BaseRoute] = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/live", live, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
        *anthropic_routes.ROUTES,
        *response_routes.ROUTES,
        *conversation_routes.ROUTES,
        *batch_routes.ROUTES,
    ]
    state.api_shapes = tuple(anthropic_routes.API_SHAPES.items())

    async def start() -> None:
        """Each step's failure is a ``StartupError`` naming the step and its flag: ``serve`` prints
        it as one line and exits 2 (server/startup.py)."""
        # per process (after any fork: the exporter's thread does not survive one); first, so a
        # configuration that cannot be met stops the start-up before anything runs
        with startup_step("tracing (the OTEL_* environment variables)"):
            state.tracer = tracer_from_env()
        await _start_models(state.models)
        # Everything allocated at startup (tokenizer tables, grammars, caches) lives forever:
        # move it out of the collector's sight so full collections stay short under load.
        gc.collect()
        gc.freeze()
        state.store = state.continuity.store = await open_state_store(config.server.state, state.store)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            await start()
        except BaseException:
            # what did start stops now (pools' sessions and probes), so the process ends quietly
            for model in state.models:
                with contextlib.suppress(Exception):
                    await model.aclose()
            raise
        purger = asyncio.create_task(purge_forever(state.store))
        runner.start()
        hangup = _listen_for_sighup(reloader, hangups_seen)
        try:
            yield
        finally:
            await runner.aclose()  # its lines in flight go back to the store for others to run
            if hangup:
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
                signal.signal(signal.SIGHUP, signal.SIG_IGN)  # not its default action while draining
            purger.cancel()
            tracer, state.tracer = state.tracer, None
            if tracer is not None:
                await asyncio.to_thread(tracer.shutdown)  # exports what is buffered
            await state.background.aclose()  # before the store closes: their responses are marked failed
            await state.store.close()
            if reloader is not None:
                await reloader.aclose()  # models a reload replaced and still draining
            for model in state.models:
                await model.aclose()
            await state.images.aclose()

    app = FrontendApp(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, FrontendError: _frontend_error},
    )
    app.state.frontend = state
    app.frontend = state
    # batch lines run through the app's own routes, below the middlewares (api/batches/execute.py)
    runner = BatchRunner(state, app, app.router, config.server.batches)
    state.batch_runner = runner
    affinity = any(r.mode in ("session", "kv", "kv-approx") for m in models for r in m.routers())
    if affinity or reloader is not None:  # a reload may bring a model that routes by session
        from deepseek_frontend.routing.session import SessionMiddleware

        app.add_middleware(SessionMiddleware)  # the agent session header, for affinity
    endpoints = frozenset(getattr(r, "path", "") for r in routes) - {""}
    # always in place (a reload may bring the first keys); without keys it only passes requests on
    app.add_middleware(AuthMiddleware, state=state, endpoints=endpoints)
    # added last, so outermost: a burst queues here before any routing, auth or validation work
    app.add_middleware(TurnGate, turns=state.turns)
    return app
