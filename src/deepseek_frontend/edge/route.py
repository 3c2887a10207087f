"""The endpoint decorator :func:`api_route`: what every API request goes through before and after
its handler.

Before the handler: a request id, the body read (``api/request_body.py``), the request routed to a
model (the one its body's ``model`` names, among those its API key may use), the key's rate limits,
the model's admission control. After: the request counted and logged (``api/tracking.py``), any
error answered in the protocol's shape, ``x-request-id`` and the key's rate-limit headers set.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from deepseek_frontend import _tracing
from deepseek_frontend.errors import KeyRateLimitError
from deepseek_frontend.keys.rate_limits import Refusal
from deepseek_frontend.pipeline.offload import release_current_turn

from .body import BODY_ATTR, PARSED_ATTR, parse_json_object, receive_body
from .context import MODEL_ATTR, get_state, new_request_id
from .errors import ErrorBodyRenderer, as_frontend_error, error_response, openai_error_body
from .memory import LARGE_BODY_BYTES
from .tracking import RequestTracker

if TYPE_CHECKING:
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.keys.tenants import Tenant

    from .context import FrontendState

log = logging.getLogger("deepseek_frontend.api")

REQUEST_ID_HEADER = "x-request-id"


def _route(request: Request, state: FrontendState, tenant: Tenant | None, selects_model: bool) -> ServedModel:
    """The model ``request`` goes to: the one its JSON body's ``model`` names (``selects_model``),
    among those its API key may use. With one model and a key that may use it, the body is not
    parsed here (the handler parses it after admission). Raises ``ModelNotFoundError`` (404) and,
    for a body that is not a JSON object, ``RequestError`` (400)."""
    models = state.models
    only = models.only
    if not selects_model or (only is not None and (tenant is None or tenant.may_use(only.name))):
        return only if only is not None else models.resolve(None, tenant)
    body = parse_json_object(getattr(request.state, BODY_ATTR, b""))
    setattr(request.state, PARSED_ATTR, body)
    name = body.get("model")
    # a model that is not a string is the handler's 400 (it names the field); routed to the default
    return models.resolve(name if isinstance(name, str) else None, tenant)


def _limit_protocol(render: ErrorBodyRenderer) -> str:
    """Whose rate-limit headers a route sends: Anthropic's on /v1/messages, else OpenAI's."""
    return "anthropic" if getattr(render, "__name__", "").startswith("anthropic") else "openai"


Endpoint = Callable[[Request, RequestTracker], Awaitable[Response]]


def api_route(
    endpoint: str,
    render: ErrorBodyRenderer = openai_error_body,
    prefix: str = "chatcmpl",
    *,
    selects_model: bool = False,
) -> Callable[[Endpoint], Callable[[Request], Awaitable[Response]]]:
    """Decorate ``async def handler(request, tracker) -> Response`` into a Starlette endpoint.

    The request id (``request.state.request_id``, also echoed as ``x-request-id``)
    is ``<prefix>-<hex>``; a ``FrontendError`` (or any exception) becomes an error
    response rendered by ``render``.

    Before the handler runs, in this order: the body is read; the request is routed to a model
    (``selects_model``: the one its body's ``model`` names, else the server's first;
    :func:`served_model`); its API key's limits admit it (429 with the protocol's rate-limit
    headers past one, api/rate_limits.py); the model's admission control admits it.
    """

    def decorate(fn: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(fn)
        async def handler(request: Request) -> Response:
            state = get_state(request)
            request_id = new_request_id(prefix)
            request.state.request_id = request_id
            only = state.models.only
            tracker = RequestTracker(
                only.metrics if only is not None else state.metrics, endpoint, request_id
            )
            rate_headers: dict[str, str] | None = None
            tracker.key_name = getattr(request.state, "api_key_name", "")
            if tracker.key_name:
                tracker.key_usage = state.key_usage  # counted per key whatever the answer
            # tracing off and no client traceparent: (None, None), nothing set
            tracker.trace, trace_token = _tracing.enter(
                state.tracer, request.method, endpoint, request.url.path, request.headers, request_id
            )
            try:
                if request.method == "POST":
                    # the body first: a slow one holds a reader slot (per client address), never an
                    # admission slot (receive_body)
                    await receive_body(request)
                    memory = state.memory
                    if memory is not None and len(getattr(request.state, BODY_ATTR)) >= LARGE_BODY_BYTES:
                        memory.started()
                        tracker.on_done = memory.finished
                # the auth middleware's (api/auth.py); None without API keys
                tenant = request.scope.get("state", {}).get("tenant")
                model = _route(request, state, tenant, selects_model)
                tracker.route(model)
                setattr(request.state, MODEL_ATTR, model)
                if tenant is not None and state.limiter is not None:
                    verdict = state.limiter.admit(tenant, protocol=_limit_protocol(render))
                    if isinstance(verdict, Refusal):
                        if state.key_usage is not None:
                            state.key_usage.limited(tenant.name, verdict.limit)
                        err = KeyRateLimitError(
                            verdict.message, retry_after_s=math.ceil(verdict.retry_after_s)
                        )
                        response = error_response(err, render, headers=verdict.headers)
                        tracker.finish(response.status_code, err.error_type, err.message)
                        response.headers.setdefault(
                            REQUEST_ID_HEADER, request.headers.get(REQUEST_ID_HEADER) or request_id
                        )
                        return response
                    tracker.grant = verdict
                    rate_headers = verdict.headers
                admission = model.admission
                # After the body, before the handler's parsing: a refused request costs no
                # validation. A request that queues here must not hold its loop turn (read_json
                # takes a new one).
                if not admission.can_enter():
                    release_current_turn()
                with _tracing.phase("admission"):
                    refusal = await admission.enter()
                if refusal is not None:
                    # answered without raising (see Admission.enter): the cheapest answer there is
                    response = error_response(refusal, render)
                    tracker.finish(response.status_code, refusal.error_type, refusal.message)
                    response.headers.setdefault(
                        REQUEST_ID_HEADER, request.headers.get(REQUEST_ID_HEADER) or request_id
                    )
                    return response
                tracker._release = admission.release
                try:
                    response = await fn(request, tracker)
                finally:
                    # the loop turn (TurnGate, read_json) ends with the handler at the latest
                    release_current_turn()
                if tracker.trace is not None:
                    tracker.trace.responding()
            except Exception as exc:
                err = as_frontend_error(exc)
                response = error_response(err, render)
                tracker.finish(response.status_code, err.error_type, err.message)
                if err.status_code >= 500:
                    log.warning("request failed: %s", err.message, extra={"request_id": request_id})
                # The traceback holds this frame, whose ``err`` holds the error: a reference cycle
                # through every frame of the failed request (its body, prompt and ids: hundreds of
                # MB for a multi-MB prompt) that only a full collection would free. Break it now.
                exc.__traceback__ = err.__traceback__ = None
                del err
            else:
                if not tracker.deferred:
                    tracker.finish(response.status_code)
            finally:
                _tracing.leave(trace_token)
            if rate_headers:
                response.headers.update(rate_headers)
            response.headers.setdefault(
                REQUEST_ID_HEADER, request.headers.get(REQUEST_ID_HEADER) or request_id
            )
            return response

        return handler

    return decorate
