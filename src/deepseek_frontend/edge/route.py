"""The endpoint decorator :func:`api_route`: what every API request goes through before and after
its handler.

Before the handler, in this order (each step one function below): the request gets its id and
tracker (:func:`_begin`); its body is read (:func:`_read_body`); it is routed to a model -- the one
its body's ``model`` names, among those its API key may use (:func:`_route`); its priority, service
tier and deadline are resolved from its headers, its body's ``service_tier`` and its key
(:func:`_schedule`, ``edge/priority.py``); its API key's rate limits admit it, a key with tokens
per minute reserving what the request may use, estimated from its body (:func:`_reservation`,
edge/reservation.py, before any preparation: a refusal costs the body's parse and nothing more)
(:func:`_admit_key`); the model's admission control admits it, in priority order and within its
deadline
(:func:`_admit_to_model`). The handler then gets one :class:`~.request.RequestContext`. After it:
the request is counted and logged (``edge/tracking.py``), any error is answered in the API's shape
(:func:`_answer_error`), and the response gets ``x-request-id`` and the key's rate-limit headers
(:func:`_stamp`).

Some requests skip steps. A route that ``streams_body`` (a file upload) reads its body itself, in
pieces, and does no model work: no whole-body read, no model admission. A route that does not
``generate`` (reading, cancelling or deleting a stored response, the conversations) takes no model
admission slot either: the slots are the model's generations -- background responses hold theirs
until they end -- and a client must be able to poll or cancel them while every slot is taken. A
request the server makes on a client's behalf (``request.OnBehalf``: a batch line) is not charged to its key's
rate limits -- batches have limits of their own -- and runs at its own priority (a batch line at the
lowest), whatever its body says.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from deepseek_frontend import _tracing
from deepseek_frontend.errors import KeyRateLimitError, PayloadTooLargeError
from deepseek_frontend.keys.rate_limits import Refusal
from deepseek_frontend.pipeline.offload import release_current_turn

from .body import parse_json_object, receive_body
from .context import FrontendState, get_state, new_request_id
from .errors import OPENAI, ApiShape, as_frontend_error, error_response
from .memory import LARGE_BODY_BYTES
from .priority import behalf_scheduling, resolve_scheduling
from .request import RequestContext, on_behalf
from .reservation import Reserve
from .tracking import RequestTracker

if TYPE_CHECKING:
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.keys.tenants import Tenant
    from deepseek_frontend.pipeline.request import Scheduling

log = logging.getLogger("deepseek_frontend.api")

REQUEST_ID_HEADER = "x-request-id"

Handler = Callable[[RequestContext], Awaitable[Response]]


class _Refused(Exception):
    """A request answered before its handler (a key's limit, the model's admission): ``response``."""

    def __init__(self, response: Response) -> None:
        self.response = response


def _begin(request: Request, state: FrontendState, endpoint: str, prefix: str) -> RequestTracker:
    """The request's id and tracker (counted under the server's own metrics until it is routed),
    its key's name and its trace."""
    request_id = new_request_id(prefix)
    only = state.models.only
    tracker = RequestTracker(only.metrics if only is not None else state.metrics, endpoint, request_id)
    tracker.key_name = request.scope.get("state", {}).get("api_key_name", "")
    if tracker.key_name:
        tracker.key_usage = state.key_usage  # counted per key whatever the answer
    return tracker


async def _read_body(request: Request, state: FrontendState, tracker: RequestTracker) -> bytes:
    """The body, read whole before admission: a slow one holds a reader slot (per client
    address), never an admission slot (``edge/body.receive_body``). A large body -- read, or
    refused once past the size limit while being read -- has its memory given back when the
    request is done (``edge/memory.py``)."""
    if request.method != "POST":
        return b""
    config = state.config
    memory = state.memory
    try:
        body = await receive_body(
            request,
            max_bytes=config.server.max_body_bytes,
            timeout_s=config.limits.body_timeout,
            readers=state.body_readers,
        )
    except PayloadTooLargeError:
        declared = request.headers.get("content-length")
        refused_unread = (
            declared is not None and declared.isdigit() and int(declared) > config.server.max_body_bytes
        )
        if memory is not None and not refused_unread:
            memory.release_soon()  # refused once past the limit: up to the limit was read
        raise
    if memory is not None and len(body) >= LARGE_BODY_BYTES:
        memory.started()
        tracker.on_done = memory.finished
    return body


def _route(
    state: FrontendState, tenant: Tenant | None, body: bytes, selects_model: bool
) -> tuple[ServedModel, dict[str, object] | None]:
    """The model the request goes to -- the one its JSON body's ``model`` names (``selects_model``),
    among those its API key may use -- and the body parsed on the way (None: not parsed). With one
    model and a key that may use it, the body is not parsed here (the handler parses it after
    admission). Raises ``ModelNotFoundError`` (404) and, for a body that is not a JSON object,
    ``RequestError`` (400)."""
    models = state.models
    only = models.only
    if not selects_model or (only is not None and (tenant is None or tenant.may_use(only.name))):
        return (only if only is not None else models.resolve(None, tenant)), None
    parsed = parse_json_object(body)
    name = parsed.get("model")
    # a model that is not a string is the handler's 400 (it names the field); routed to the default
    return models.resolve(name if isinstance(name, str) else None, tenant), parsed


def _admit_key(
    state: FrontendState, tenant: Tenant | None, api: ApiShape, tracker: RequestTracker, tokens: int = 0
) -> dict[str, str] | None:
    """The API key's rate limits, reserving ``tokens`` of its tokens per minute: the grant kept on
    the tracker (settled with the tokens used when the request is done, ``tracking.KeyCharge``)
    and the rate-limit headers the response will carry (None without limits), or
    :class:`_Refused` (429 with those headers)."""
    if tenant is None or state.limiter is None:
        return None
    verdict = state.limiter.admit(tenant, protocol=api.name, tokens=tokens)
    if isinstance(verdict, Refusal):
        if state.key_usage is not None:
            state.key_usage.limited(tenant.name, verdict.limit)
        err = KeyRateLimitError(verdict.message, retry_after_s=math.ceil(verdict.retry_after_s))
        raise _Refused(_answer_error(err, api, tracker, headers=verdict.headers))
    tracker.grant = verdict
    return verdict.headers


def _reservation(
    reserve: Reserve | None,
    tenant: Tenant | None,
    model: ServedModel,
    body: bytes,
    parsed: dict[str, object] | None,
) -> tuple[int, dict[str, object] | None]:
    """The tokens the request may use (edge/reservation.py) when its key limits tokens per minute
    and its route generates, and the body parsed on the way (handed to the handler: parsed once)."""
    if reserve is None or tenant is None or tenant.limits.tokens_per_minute is None:
        return 0, parsed
    if parsed is None:
        parsed = parse_json_object(body)  # not an object: the handler's 400, answered here
    return reserve(parsed, model.config.model), parsed


def _schedule(
    request: Request,
    api: ApiShape,
    tenant: Tenant | None,
    body: bytes,
    parsed: dict[str, object] | None,
    arrival: float,
) -> tuple[Scheduling, dict[str, object] | None]:
    """The request's priority, service tier and deadline (``edge/priority.py``), and its body parsed
    when reading ``service_tier`` parsed it; a request the server makes for a client runs at its own
    priority. Raises ``RequestError`` (400) for a bad priority header, budget or tier."""
    behalf = on_behalf(request)
    if behalf is not None:
        return behalf_scheduling(behalf.priority), parsed
    limits = tenant.limits if tenant is not None else None
    return resolve_scheduling(
        request.headers,
        api.name,
        body,
        parsed,
        limits.priority if limits is not None else None,
        limits.max_priority if limits is not None else None,
        arrival,
    )


async def _admit_to_model(
    model: ServedModel, api: ApiShape, tracker: RequestTracker, scheduling: Scheduling
) -> None:
    """The model's admission control: a slot, given back when the tracker finishes, or
    :class:`_Refused` (429 for a full queue or a waiter preempted by a more important request, 408
    for a deadline that passed in the queue). The request waits in the order of its priority
    (higher first; a batch line's is the lowest), then of its deadline."""
    admission = model.admission
    # After the body, before the handler's parsing: a refused request costs no validation. A
    # request that queues here must not hold its loop turn (the context's json() takes a new one).
    if not admission.can_enter():
        release_current_turn()
    with _tracing.phase("admission"):
        refusal = await admission.enter(
            scheduling.priority, scheduling.deadline, budget_ms=scheduling.budget_ms
        )
    if refusal is not None:
        # answered without raising (see Admission.enter): the cheapest answer there is
        raise _Refused(_answer_error(refusal, api, tracker))
    tracker.release_with(admission.release)


def _answer_error(
    exc: BaseException, api: ApiShape, tracker: RequestTracker, headers: dict[str, str] | None = None
) -> Response:
    """The error response for ``exc`` in the API's shape; the request counted and logged with it."""
    err = as_frontend_error(exc)
    response = error_response(err, api.error_body, headers=headers)
    tracker.finish(response.status_code, err.error_type, err.message)
    if err.status_code >= 500:
        log.warning("request failed: %s", err.message, extra={"request_id": tracker.request_id})
    return response


def _stamp(
    response: Response, request: Request, request_id: str, rate_headers: dict[str, str] | None
) -> None:
    """The headers every API response carries: the key's rate-limit headers (admitted requests) and
    ``x-request-id`` (the client's own when it sent one)."""
    if rate_headers:
        response.headers.update(rate_headers)
    response.headers.setdefault(REQUEST_ID_HEADER, request.headers.get(REQUEST_ID_HEADER) or request_id)


def api_route(
    endpoint: str,
    api: ApiShape = OPENAI,
    prefix: str = "chatcmpl",
    *,
    selects_model: bool = False,
    streams_body: bool = False,
    generates: bool = True,
    reserve: Reserve | None = None,
) -> Callable[[Handler], Callable[[Request], Awaitable[Response]]]:
    """Decorate ``async def handler(ctx: RequestContext) -> Response`` into a Starlette endpoint.

    The request id is ``<prefix>-<hex>`` (echoed as ``x-request-id`` unless the client sent its
    own); a ``FrontendError`` (or any exception) becomes an error response in ``api``'s shape.
    ``selects_model``: the request goes to the model its body's ``model`` names, else to the
    server's first. ``streams_body``: the handler reads the body itself (``edge/body_stream.py``),
    and the request takes no model admission slot; nor does it without ``generates`` (no model work).
    ``reserve``: the route generates, and a key with tokens per minute reserves what
    ``reserve(body, model config)`` says it may use (edge/reservation.py). See the module
    docstring for the steps.
    """

    def decorate(fn: Handler) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(fn)
        async def handler(request: Request) -> Response:
            arrival = asyncio.get_running_loop().time()  # a request's time budget counts from here
            state = get_state(request)
            tracker = _begin(request, state, endpoint, prefix)
            rate_headers: dict[str, str] | None = None
            # tracing off and no client traceparent: (None, None), nothing set
            tracker.trace, trace_token = _tracing.enter(
                state.tracer, request.method, endpoint, request.url.path, request.headers, tracker.request_id
            )
            try:
                body = b"" if streams_body else await _read_body(request, state, tracker)
                # the auth middleware's (edge/auth.py), or the client's a server-made request is for;
                # None without API keys
                tenant: Tenant | None = request.scope.get("state", {}).get("tenant")
                model, parsed = _route(state, tenant, body, selects_model)
                tracker.route(model)
                scheduling, parsed = _schedule(request, api, tenant, body, parsed, arrival)
                if on_behalf(request) is None:
                    tokens, parsed = _reservation(reserve, tenant, model, body, parsed)
                    rate_headers = _admit_key(state, tenant, api, tracker, tokens)
                if generates and not streams_body:
                    await _admit_to_model(model, api, tracker, scheduling)
                ctx = RequestContext(
                    request, tracker.request_id, state, api, tracker, model, tenant, body, parsed, scheduling
                )
                try:
                    response = await fn(ctx)
                finally:
                    # the loop turn (TurnGate, the context's json()) ends with the handler at the latest
                    release_current_turn()
                if tracker.trace is not None:
                    tracker.trace.responding()
            except _Refused as refused:
                response, rate_headers = refused.response, None
            except Exception as exc:
                response = _answer_error(exc, api, tracker)
                # The traceback holds this frame, whose locals hold the request (its body, prompt and
                # ids: hundreds of MB for a multi-MB prompt): a reference cycle only a full
                # collection would free. Break it now.
                exc.__traceback__ = None
            else:
                if not tracker.deferred:
                    tracker.finish(response.status_code)
            finally:
                _tracing.leave(trace_token)
            _stamp(response, request, tracker.request_id, rate_headers)
            return response

        return handler

    return decorate
