"""The routes that describe the server rather than generate: ``GET /v1/models`` (and one model),
``/health``, ``/live`` and ``/metrics``.

Each reports every served model: ``/v1/models`` lists the names the request's API key may use,
``/health`` gives each model's workers (``?model=NAME``: that model alone, with its own 503), and
``/metrics`` labels every series of a model's own state with ``model="<served name>"``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from deepseek_frontend.api.anthropic.routes import ANTHROPIC
from deepseek_frontend.edge.auth import AmbiguousCredentialsError, presented_key
from deepseek_frontend.edge.context import FrontendState, get_state
from deepseek_frontend.edge.errors import error_response, openai_error_body
from deepseek_frontend.errors import ModelNotFoundError
from deepseek_frontend.fleet.metrics import CONTENT_TYPE, merge_labelled, render_families
from deepseek_frontend.fleet.served_model import ServedModel
from deepseek_frontend.generation import WorkerStatus

from .http_protocol import LIVE_BODY


def _is_anthropic_client(request: Request) -> bool:
    """Anthropic SDKs and Claude Code send ``anthropic-version`` (and their key as ``x-api-key``)."""
    headers = request.headers
    return "anthropic-version" in headers or ("x-api-key" in headers and "authorization" not in headers)


def _anthropic_model(name: str, created: int) -> dict[str, Any]:
    """A model in the shape of Anthropic's ``GET /v1/models`` (``created_at`` is RFC 3339)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))
    return {"type": "model", "id": name, "display_name": name, "created_at": stamp}


def _openai_model(name: str, created: int, model: ServedModel) -> dict[str, Any]:
    """A model in the shape of OpenAI's ``GET /v1/models`` (vLLM's card: ``max_model_len``, and for a
    name answered by a served model under another name, ``parent``: that served model)."""
    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "deepseek-frontend",
        "max_model_len": model.config.model.context_length,
    }
    if name != model.name:
        card["parent"] = model.name
    return card


def _tenant(request: Request) -> Any:
    """The request's ``Tenant`` (the auth middleware's), or None without API keys."""
    return request.scope.get("state", {}).get("tenant")


async def list_models(request: Request) -> Response:
    """Every name the request's key may use (``ModelRegistry.listed``), in OpenAI's list shape -- or
    Anthropic's for an Anthropic client."""
    state = get_state(request)
    created = state.started_at
    listed = state.models.listed(_tenant(request))
    if _is_anthropic_client(request):
        entries = [_anthropic_model(name, created) for name, _ in listed]
        first = listed[0][0] if listed else None
        last = listed[-1][0] if listed else None
        page = {"data": entries, "has_more": False, "first_id": first, "last_id": last}
        return Response(orjson.dumps(page), media_type="application/json")
    models = [_openai_model(name, created, model) for name, model in listed]
    return Response(orjson.dumps({"object": "list", "data": models}), media_type="application/json")


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{id}``: any name a model answers to (served name, exact alias, a name a glob
    alias matches) comes back under the name asked for, as every response echoes it; others 404."""
    state = get_state(request)
    asked = request.path_params["model"]
    anthropic = _is_anthropic_client(request)
    try:
        model = state.models.resolve(asked, _tenant(request))
    except ModelNotFoundError as exc:  # a 404 in the shape of the client's API, as the list is
        return error_response(exc, ANTHROPIC.error_body if anthropic else openai_error_body)
    created = state.started_at
    if anthropic:
        return Response(orjson.dumps(_anthropic_model(asked, created)), media_type="application/json")
    return Response(orjson.dumps(_openai_model(asked, created, model)), media_type="application/json")


#: WorkerStatus.extra entries /health shows per worker
_WORKER_EXTRA_KEYS = frozenset({"requests", "failures", "capabilities", "role", "discovery"})


def _worker_json(status: WorkerStatus) -> dict[str, Any]:
    return {
        "url": status.url,
        "healthy": status.healthy,
        "in_flight": status.in_flight,
        "consecutive_failures": status.consecutive_failures,
        "last_error": status.last_error,
        # request / failure counters and what discovery learned (the pool's WorkerStatus.extra)
        **{k: v for k, v in status.extra.items() if k in _WORKER_EXTRA_KEYS},
    }


def _model_health(model: ServedModel) -> dict[str, Any]:
    workers = [_worker_json(s) for s in model.statuses()]
    healthy = sum(1 for w in workers if w["healthy"])
    return {
        "model": model.name,
        "status": "ok" if healthy == len(workers) else "degraded" if healthy else "unavailable",
        "family": model.config.model.family,
        "engine": model.config.engine.kind,
        "simulated": model.config.engine.uses_builtin_sim,
        "workers": workers,
    }


def _presents_a_key(request: Request) -> bool:
    """Whether ``request`` carries a key of the server (True when the server checks none); the
    same rule as every route (``edge/auth.presented_key``): ambiguous credentials present none."""
    tenants = get_state(request).tenants
    if tenants is None:
        return True
    try:
        key = presented_key(request.scope["headers"])
    except AmbiguousCredentialsError:
        return False
    return key is not None and tenants.authenticate(key) is not None


async def health(request: Request) -> Response:
    """Ready while any model has a healthy worker (Kubernetes readiness: the server can serve);
    ``?model=NAME`` asks about one model, and is 503 while that one has none.

    Status: ``ok`` (every worker of every model healthy), ``degraded`` or ``unavailable``. Probes
    carry no key, so without one the answer is only that status; models, worker URLs and their
    last errors -- internal addresses, engine messages -- need a key when keys are configured.
    """
    state = get_state(request)
    asked = request.query_params.get("model")
    models = [state.models.resolve(asked)] if asked else list(state.models)
    reports = [_model_health(m) for m in models]
    ready = any(r["status"] != "unavailable" for r in reports)
    every_worker = all(r["status"] == "ok" for r in reports)
    status = "ok" if every_worker else "degraded" if ready else "unavailable"
    code = 200 if ready else 503
    if not _presents_a_key(request):
        return Response(orjson.dumps({"status": status}), status_code=code, media_type="application/json")
    body: dict[str, Any] = {"status": status}
    if len(reports) == 1:
        body.update(reports[0])  # one model: its fields at the top, as a one-model server always had
        body["status"] = status
    body["models"] = reports
    return Response(orjson.dumps(body), status_code=code, media_type="application/json")


async def live(_: Request) -> Response:
    """Liveness. ``serve`` answers it in the HTTP connection (``http_protocol``), with these bytes."""
    return Response(LIVE_BODY, media_type="application/json")


def render_metrics(state: FrontendState) -> bytes:
    """The process's metrics: the server's own series, then each model's labelled ``model``."""
    parts: list[tuple[dict[str, str], str]] = [({}, state.metrics.render().decode())]
    for model in state.models:
        m = model.metrics
        for s in model.statuses():
            m.worker_healthy.labels(s.url).set(1 if s.healthy else 0)
            m.worker_in_flight.labels(s.url).set(s.in_flight)
        parts.append(({"model": model.name}, m.render().decode()))
    return render_families(merge_labelled(parts).values())


async def metrics_endpoint(request: Request) -> Response:
    state = get_state(request)
    own = render_metrics(state)
    group = state.process_group  # serve --workers N (server/processes.py)
    if group is not None and request.query_params.get("scope") != "process":
        return Response(await group.sibling_metrics(own), media_type=CONTENT_TYPE)
    return Response(own, media_type=CONTENT_TYPE)


__all__ = ["health", "list_models", "live", "metrics_endpoint", "render_metrics", "retrieve_model"]
