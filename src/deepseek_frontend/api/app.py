"""The Starlette application: routes, auth, request ids, lifespan.

``create_app(config)`` wires everything once; the shared state lives at
``app.state.frontend`` (:class:`~deepseek_frontend.api.http.FrontendState`).

Routes::

    POST /v1/chat/completions   openai.chat.chat_completions
    POST /v1/completions        completions.completions
    GET  /v1/models             the served model and its exact aliases (a glob is answered, not listed);
                                Anthropic's shape (type, display_name, created_at) for Anthropic clients
    GET  /health                JSON with worker states; 503 when no worker is healthy
    GET  /live                  process liveness (never touches workers)
    GET  /metrics               Prometheus text
    + the ROUTES of deepseek_frontend.api.anthropic / .responses

Auth (when ``--api-key`` is set): ``Authorization: Bearer KEY`` or ``x-api-key: KEY``
on every route except /health, /live and /metrics (probes and scrapers carry no key).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import hmac
import importlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from deepseek_frontend._tracing import tracer_from_env
from deepseek_frontend.errors import AuthenticationError, FrontendError, RequestError
from deepseek_frontend.state import purge_forever

from .admission import Admission, BodyReaders
from .arrivals import ArrivalPacer
from .config import ServerConfig
from .errors import ErrorBodyRenderer, error_response, openai_error_body
from .http import (
    FrontendApp,
    FrontendState,
    RecentHeads,
    TurnGate,
    log_request_done,
    new_request_id,
)
from .http_protocol import LIVE_BODY
from .logs import key_name
from .memory import MemoryReleaser
from .metrics import CONTENT_TYPE, FrontendMetrics
from .state_config import open_state_store

log = logging.getLogger("deepseek_frontend.api")

#: Optional protocol modules (issue 5); each exposes ``ROUTES`` and may expose
#: ``ERROR_RENDERERS: dict[path_prefix, ErrorBodyRenderer]`` for errors raised before its handlers run.
#: Packages whose ``ROUTES`` the app mounts beside the OpenAI chat and completions routes.
PROTOCOL_ROUTE_MODULES = (
    "deepseek_frontend.api.anthropic.routes",
    "deepseek_frontend.api.responses.routes",
    "deepseek_frontend.api.conversations.routes",
)
#: Paths that never require the API key.
PUBLIC_PATHS = frozenset({"/health", "/live", "/metrics"})
#: Constraint kinds each engine protocol can enforce, when the backend does not say itself.
DEFAULT_CONSTRAINT_SUPPORT = {
    "sglang": frozenset({"ebnf", "json_schema", "regex", "structural_tag"}),
    "vllm": frozenset({"ebnf", "json_schema", "regex"}),
    "sim": frozenset({"ebnf", "json_schema"}),
}


class _Backend:
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
        from deepseek_frontend.engines.base import WorkerStatus

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


def build_backend(config: ServerConfig, tokenizer: Any) -> _Backend:
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
        return _Backend(engine, "sim")
    from deepseek_frontend.engines.pool import from_urls
    from deepseek_frontend.routing import Router, RouterConfig

    if config.prefill_workers:
        from deepseek_frontend.routing.pd import build_disaggregated

        return _Backend(build_disaggregated(config, stream_limits(config, tokenizer)), config.engine)
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
    return _Backend(pool, config.engine)


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


# --------------------------------------------------------------------------- middleware


class AuthMiddleware:
    """Pure-ASGI API key check (no per-request task or body wrapping, unlike BaseHTTPMiddleware)."""

    def __init__(
        self,
        app: ASGIApp,
        api_key: str | tuple[str, ...],
        renderers: list[tuple[str, ErrorBodyRenderer]],
        metrics: FrontendMetrics | None = None,
        endpoints: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self._keys = tuple(k.encode() for k in ((api_key,) if isinstance(api_key, str) else api_key))
        self._renderers = renderers
        self._metrics = metrics
        #: paths counted under their own name; any other path is counted as "other" (bounded labels)
        self._endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        presented = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    presented = token.strip()
            elif name == b"x-api-key" and presented is None:
                presented = value.strip()
        # every key compared (no early exit): the time taken does not tell which key was close
        if presented is not None and sum(hmac.compare_digest(presented, key) for key in self._keys):
            # the request's log line names the key by a short digest (never the key itself)
            scope.setdefault("state", {})["api_key_name"] = key_name(presented)
            await self.app(scope, receive, send)
            return
        message = "Missing API key" if presented is None else "Incorrect API key provided"
        err = AuthenticationError(
            f"{message}: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
        )
        response = error_response(err, _renderer_for(scope["path"], self._renderers))
        # A refused request is counted and logged like any other (the key itself never is).
        path = scope["path"]
        endpoint = path if path in self._endpoints else "other"
        if self._metrics is not None:
            self._metrics.requests.labels(endpoint, str(err.status_code), err.error_type).inc()
        log_request_done(new_request_id("auth"), endpoint, err.status_code, err.error_type, err.message, 0.0)
        await response(scope, receive, send)


def _renderer_for(path: str, renderers: list[tuple[str, ErrorBodyRenderer]]) -> ErrorBodyRenderer:
    for prefix, render in renderers:
        if path.startswith(prefix):
            return render
    return openai_error_body


# --------------------------------------------------------------------------- small endpoints


def _is_anthropic_client(request: Request) -> bool:
    """Anthropic SDKs and Claude Code send ``anthropic-version`` (and their key as ``x-api-key``)."""
    headers = request.headers
    return "anthropic-version" in headers or ("x-api-key" in headers and "authorization" not in headers)


def _anthropic_model(name: str, created: int) -> dict[str, Any]:
    """A model in the shape of Anthropic's ``GET /v1/models`` (``created_at`` is RFC 3339)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    return {"type": "model", "id": name, "display_name": name, "created_at": stamp}


def _openai_model(name: str, created: int, cfg: ServerConfig) -> dict[str, Any]:
    """A model in the shape of OpenAI's ``GET /v1/models`` (vLLM's card: ``max_model_len``, and for a
    name answered by the served model under another name, ``parent``: the served model)."""
    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "deepseek-frontend",
        "max_model_len": cfg.context_length,
    }
    if name != cfg.served_model_name:
        card["parent"] = cfg.served_model_name
    return card


async def list_models(request: Request) -> Response:
    """The served model and its exact aliases (``ServerConfig.listed_model_names``), in OpenAI's list
    shape -- or Anthropic's for an Anthropic client."""
    state: FrontendState = request.app.state.frontend
    cfg = state.config
    created = state.extra.get("started_at", 0)
    names = cfg.listed_model_names()
    if _is_anthropic_client(request):
        entries = [_anthropic_model(name, created) for name in names]
        page = {"data": entries, "has_more": False, "first_id": names[0], "last_id": names[-1]}
        return Response(orjson.dumps(page), media_type="application/json")
    models = [_openai_model(name, created, cfg) for name in names]
    return Response(orjson.dumps({"object": "list", "data": models}), media_type="application/json")


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{id}``: any name the server answers to (the served name, an exact alias, a name a
    glob alias matches) comes back under the name asked for, as every response echoes it; others 404."""
    state: FrontendState = request.app.state.frontend
    cfg = state.config
    asked = request.path_params["model"]
    cfg.resolve_model(asked)  # ModelNotFoundError -> 404 in the client's error shape
    created = state.extra.get("started_at", 0)
    if _is_anthropic_client(request):
        return Response(orjson.dumps(_anthropic_model(asked, created)), media_type="application/json")
    return Response(orjson.dumps(_openai_model(asked, created, cfg)), media_type="application/json")


def _worker_json(status: Any) -> dict[str, Any]:
    return {
        "url": status.url,
        "healthy": status.healthy,
        "in_flight": status.in_flight,
        "consecutive_failures": status.consecutive_failures,
        "last_error": status.last_error,
        # request / failure counters and what discovery learned (the pool's WorkerStatus.extra)
        **{k: v for k, v in (getattr(status, "extra", None) or {}).items() if k in _WORKER_EXTRA_KEYS},
    }


#: WorkerStatus.extra entries /health shows per worker
_WORKER_EXTRA_KEYS = frozenset({"requests", "failures", "capabilities", "role", "discovery"})


def _presents_key(request: Request, api_keys: tuple[str, ...]) -> bool:
    """Whether ``request`` carries one of ``api_keys`` (Bearer or x-api-key); True when none is configured."""
    if not api_keys:
        return True
    keys = [k.encode() for k in api_keys]
    for name, value in request.scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer" and sum(hmac.compare_digest(token.strip(), k) for k in keys):
                return True
        elif name == b"x-api-key" and sum(hmac.compare_digest(value.strip(), k) for k in keys):
            return True
    return False


async def health(request: Request) -> Response:
    """Ready when at least one worker is healthy (Kubernetes readiness probe).

    Probes carry no key, so without one the answer is only up or down (``status``); worker URLs
    and their last errors -- internal addresses, engine messages -- need the API key when one is
    configured.
    """
    state: FrontendState = request.app.state.frontend
    workers = [_worker_json(s) for s in state.backend.statuses()]
    healthy = sum(1 for w in workers if w["healthy"])
    status = "ok" if healthy == len(workers) else "degraded" if healthy else "unavailable"
    if not _presents_key(request, state.config.accepted_api_keys):
        code = 200 if healthy else 503
        return Response(orjson.dumps({"status": status}), status_code=code, media_type="application/json")
    body = {
        "status": status,
        "model": state.config.served_model_name,
        "family": state.config.family,
        "engine": state.config.engine,
        "simulated": state.config.uses_builtin_sim,
        "workers": workers,
    }
    return Response(orjson.dumps(body), status_code=200 if healthy else 503, media_type="application/json")


async def live(_: Request) -> Response:
    """Liveness. ``serve`` answers it in the HTTP connection (``http_protocol``), with these bytes."""
    return Response(LIVE_BODY, media_type="application/json")


async def metrics_endpoint(request: Request) -> Response:
    state: FrontendState = request.app.state.frontend
    m = state.metrics
    for s in state.backend.statuses():
        m.worker_healthy.labels(s.url).set(1 if s.healthy else 0)
        m.worker_in_flight.labels(s.url).set(s.in_flight)
    slot = state.extra.get("process_slot")  # serve --workers N (api/processes.py)
    if slot is not None and request.query_params.get("scope") != "process":
        return Response(await slot.sibling_metrics(m.render()), media_type=CONTENT_TYPE)
    return Response(m.render(), media_type=CONTENT_TYPE)


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
    renderers = request.app.state.error_renderers
    return error_response(
        err, _renderer_for(request.url.path, renderers), headers=getattr(exc, "headers", None)
    )


async def _frontend_error(request: Request, exc: Exception) -> Response:
    renderers = request.app.state.error_renderers
    return error_response(exc, _renderer_for(request.url.path, renderers))


# --------------------------------------------------------------------------- app


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


def _load_tokenizer(config: ServerConfig) -> Any:
    """The tokenizer ``config``'s model renders with (``tokenization.load_for_family``). The V4.1 stand-in
    (a V4.1 model without a checkpoint: simulated engine only, ServerConfig refuses real workers) is
    logged."""
    from deepseek_frontend.tokenization import has_own_tokenizer, load_for_family

    if config.family == "deepseek_v41" and not has_own_tokenizer(config.model_path):
        log.warning(
            "DeepSeek-V4.1 on the simulated engine: using a stand-in tokenizer derived from the bundled "
            "DeepSeek-V4 tokenizer (ids 128799 and 129264 renamed to <｜System｜> and <｜deepseek_image｜>); "
            "real workers need the checkpoint's tokenizer (--model-path)"
        )
    return load_for_family(
        config.family,
        config.model_path,
        run_cache_bytes=config.run_cache_bytes,
        prefix_cache_bytes=config.prefix_cache_bytes,
        cache_idle_s=config.cache_idle_seconds,
    )


def create_app(
    config: ServerConfig,
    *,
    tokenizer: Any | None = None,
    backend: Any | None = None,
) -> Starlette:
    """The ASGI app for ``config``.

    ``tokenizer`` and ``backend`` (an object with ``generate`` -- a WorkerPool, an
    EngineClient) may be injected by tests and benchmarks; by default they are
    loaded from the config. The backend is started and closed by the app's lifespan.
    """
    from deepseek_frontend.pipeline.chat import ChatPipeline

    from .openai.chat import chat_completions
    from .openai.completions import completions

    tok = tokenizer if tokenizer is not None else _load_tokenizer(config)
    back = _Backend(backend, config.engine) if backend is not None else build_backend(config, tok)
    metrics = FrontendMetrics(model=config.served_model_name)
    if hasattr(tok, "cache_stats"):
        metrics.watch_caches(tok.cache_stats)
    router = getattr(back.target, "router", None)
    routers = getattr(back.target, "routers", None)  # one per role (prefill/decode): labelled by role
    if router is not None or routers:
        from deepseek_frontend.routing.metrics import RoutingCollector

        metrics.registry.register(RoutingCollector(routers or router))
    if hasattr(back.target, "pd_stats"):
        from deepseek_frontend.routing.pd_metrics import PdCollector

        metrics.registry.register(PdCollector(back.target))
    pipeline = ChatPipeline(config, tok, back, metrics)
    state = FrontendState(config=config, pipeline=pipeline, tokenizer=tok, metrics=metrics, backend=back)
    state.extra["started_at"] = int(time.time())
    lim = config.limits
    state.admission = Admission(lim.max_concurrent_requests, lim.max_queued_requests, lim.queue_timeout)
    state.body_readers = BodyReaders(lim.max_body_readers, lim.max_body_readers_per_client, lim.queue_timeout)
    state.memory = MemoryReleaser()
    state.recent_heads = RecentHeads()
    state.store = config.state.build()
    if lim.arrival_hold_timeout:
        state.arrivals = ArrivalPacer(max_hold_s=lim.arrival_hold_timeout)
    metrics.watch_admission(
        state.admission,
        lambda: pipeline.offload.pending,
        # the serve command puts its HTTP protocol class here (absent under a test client)
        lambda: getattr(state.extra.get("http_protocol"), "stats", None),
        state.arrivals,
    )

    routes: list[BaseRoute] = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/live", live, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    renderers: list[tuple[str, ErrorBodyRenderer]] = []
    for module in map(importlib.import_module, PROTOCOL_ROUTE_MODULES):
        routes.extend(module.ROUTES)
        renderers.extend(getattr(module, "ERROR_RENDERERS", {}).items())

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # per process (after any fork: the exporter's thread does not survive one); first, so a
        # configuration that cannot be met stops the start-up before anything runs
        state.tracer = tracer_from_env()
        await back.start()
        # Everything allocated at startup (tokenizer tables, grammars, caches) lives forever:
        # move it out of the collector's sight so full collections stay short under load.
        gc.collect()
        gc.freeze()
        sweeper = asyncio.create_task(_expire_idle_cache_entries(tok, config.cache_idle_seconds))
        state.store = await open_state_store(config.state, state.store)
        purger = asyncio.create_task(purge_forever(state.store))
        try:
            yield
        finally:
            sweeper.cancel()
            purger.cancel()
            tracer, state.tracer = state.tracer, None
            if tracer is not None:
                await asyncio.to_thread(tracer.shutdown)  # exports what is buffered
            runs = state.extra.get("background_runs")  # made on the first background response
            if runs is not None:
                await runs.aclose()  # before the store closes: their responses are marked failed
            await state.store.close()
            await back.aclose()
            resolver = state.extra.get("image_resolver")  # made on the first image request
            if resolver is not None:
                await resolver.aclose()

    app = FrontendApp(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, FrontendError: _frontend_error},
    )
    app.state.frontend = state
    app.frontend = state
    app.state.error_renderers = renderers
    if router is not None and router.mode in ("session", "kv", "kv-approx"):
        from deepseek_frontend.routing.session import SessionMiddleware

        app.add_middleware(SessionMiddleware)  # the agent session header, for affinity
    if config.api_key:
        endpoints = frozenset(getattr(r, "path", "") for r in routes) - {""}
        app.add_middleware(
            AuthMiddleware,
            api_key=config.accepted_api_keys,
            renderers=renderers,
            metrics=metrics,
            endpoints=endpoints,
        )
    # added last, so outermost: a burst queues here before any routing, auth or validation work
    app.add_middleware(TurnGate, turns=pipeline.turns)
    return app
