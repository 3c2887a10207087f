"""The Starlette application: routes, auth, request ids, lifespan.

``create_app(config)`` wires everything once; the shared state lives at
``app.state.frontend`` (:class:`~deepseek_frontend.api.http.FrontendState`).

Routes::

    POST /v1/chat/completions   openai.chat.chat_completions
    POST /v1/completions        completions.completions
    GET  /v1/models             the served model (aliases are accepted, not listed)
    GET  /health                JSON with worker states; 503 when no worker is healthy
    GET  /live                  process liveness (never touches workers)
    GET  /metrics               Prometheus text
    + the ROUTES of deepseek_frontend.api.anthropic / .responses

Auth (when ``--api-key`` is set): ``Authorization: Bearer KEY`` or ``x-api-key: KEY``
on every route except /health, /live and /metrics (probes and scrapers carry no key).
"""

from __future__ import annotations

import contextlib
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

from deepseek_frontend.errors import AuthenticationError, FrontendError, RequestError

from .config import ServerConfig
from .errors import ErrorBodyRenderer, error_response, openai_error_body
from .http import FrontendState
from .metrics import CONTENT_TYPE, FrontendMetrics

log = logging.getLogger("deepseek_frontend.api")

#: Optional protocol modules (issue 5); each exposes ``ROUTES`` and may expose
#: ``ERROR_RENDERERS: dict[path_prefix, ErrorBodyRenderer]`` for errors raised before its handlers run.
#: Packages whose ``ROUTES`` the app mounts beside the OpenAI chat and completions routes.
PROTOCOL_ROUTE_MODULES = ("deepseek_frontend.api.anthropic.routes", "deepseek_frontend.api.responses.routes")
#: Paths that never require the API key.
PUBLIC_PATHS = frozenset({"/health", "/live", "/metrics"})
#: Constraint kinds each engine protocol can enforce, when the backend does not say itself.
DEFAULT_CONSTRAINT_SUPPORT = {
    "sglang": frozenset({"ebnf", "json_schema", "regex", "structural_tag"}),
    "vllm": frozenset({"json_schema", "regex"}),
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
        from deepseek_frontend.engines.sim.engine import SimulatedEngine

        engine = SimulatedEngine(
            tokenizer,
            ttft_ms=config.sim_ttft_ms,
            itl_ms=config.sim_itl_ms,
            tokens_per_chunk=config.sim_tokens_per_chunk,
        )
        return _Backend(engine, "sim")
    from deepseek_frontend.engines.pool import from_urls

    pool = from_urls(
        config.engine,
        config.workers,
        model=config.worker_model or config.served_model_name,
        vllm_grammar=config.vllm_grammar,
        health_interval_s=config.health_check_interval,
        max_attempts=config.max_retries + 1,
    )
    return _Backend(pool, config.engine)


# --------------------------------------------------------------------------- middleware


class AuthMiddleware:
    """Pure-ASGI API key check (no per-request task or body wrapping, unlike BaseHTTPMiddleware)."""

    def __init__(self, app: ASGIApp, api_key: str, renderers: list[tuple[str, ErrorBodyRenderer]]) -> None:
        self.app = app
        self._key = api_key.encode()
        self._renderers = renderers

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
        if presented is not None and hmac.compare_digest(presented, self._key):
            await self.app(scope, receive, send)
            return
        message = "Missing API key" if presented is None else "Incorrect API key provided"
        err = AuthenticationError(
            f"{message}: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'",
        )
        response = error_response(err, _renderer_for(scope["path"], self._renderers))
        await response(scope, receive, send)


def _renderer_for(path: str, renderers: list[tuple[str, ErrorBodyRenderer]]) -> ErrorBodyRenderer:
    for prefix, render in renderers:
        if path.startswith(prefix):
            return render
    return openai_error_body


# --------------------------------------------------------------------------- small endpoints


async def list_models(request: Request) -> Response:
    state: FrontendState = request.app.state.frontend
    cfg = state.config
    model = {
        "id": cfg.served_model_name,
        "object": "model",
        "created": state.extra.get("started_at", 0),
        "owned_by": "deepseek-frontend",
        "max_model_len": cfg.context_length,
    }
    return Response(orjson.dumps({"object": "list", "data": [model]}), media_type="application/json")


async def retrieve_model(request: Request) -> Response:
    state: FrontendState = request.app.state.frontend
    cfg = state.config
    name = cfg.resolve_model(request.path_params["model"])
    return Response(
        orjson.dumps(
            {
                "id": name,
                "object": "model",
                "created": state.extra.get("started_at", 0),
                "owned_by": "deepseek-frontend",
            }
        ),
        media_type="application/json",
    )


def _worker_json(status: Any) -> dict[str, Any]:
    return {
        "url": status.url,
        "healthy": status.healthy,
        "in_flight": status.in_flight,
        "consecutive_failures": status.consecutive_failures,
        "last_error": status.last_error,
    }


async def health(request: Request) -> Response:
    """Ready when at least one worker is healthy (Kubernetes readiness probe)."""
    state: FrontendState = request.app.state.frontend
    workers = [_worker_json(s) for s in state.backend.statuses()]
    healthy = sum(1 for w in workers if w["healthy"])
    status = "ok" if healthy == len(workers) else "degraded" if healthy else "unavailable"
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
    return Response(b'{"status":"ok"}', media_type="application/json")


async def metrics_endpoint(request: Request) -> Response:
    state: FrontendState = request.app.state.frontend
    m = state.metrics
    for s in state.backend.statuses():
        m.worker_healthy.labels(s.url).set(1 if s.healthy else 0)
        m.worker_in_flight.labels(s.url).set(s.in_flight)
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
    from deepseek_frontend.tokenization import PromptTokenizer

    from .openai.chat import chat_completions
    from .openai.completions import completions

    tok = tokenizer if tokenizer is not None else PromptTokenizer.load(config.model_path)
    back = _Backend(backend, config.engine) if backend is not None else build_backend(config, tok)
    metrics = FrontendMetrics()
    pipeline = ChatPipeline(config, tok, back, metrics)
    state = FrontendState(config=config, pipeline=pipeline, tokenizer=tok, metrics=metrics, backend=back)
    state.extra["started_at"] = int(time.time())

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
        await back.start()
        # Everything allocated at startup (tokenizer tables, grammars, caches) lives forever:
        # move it out of the collector's sight so full collections stay short under load.
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            await back.aclose()

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_exception, FrontendError: _frontend_error},
    )
    app.state.frontend = state
    app.state.error_renderers = renderers
    if config.api_key:
        app.add_middleware(AuthMiddleware, api_key=config.api_key, renderers=renderers)
    return app
