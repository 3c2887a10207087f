"""HTTP plumbing shared by every protocol adapter (OpenAI, Anthropic, Responses).

* :class:`FrontendState` -- what the app holds at ``app.state.frontend``.
* :func:`receive_body` -- reads a request's body before it is admitted (413, 408, reader limits).
* :func:`read_json` -- body size limit (413) and orjson parsing (400).
* :func:`api_route` -- wraps an endpoint: request id, in-flight gauge, request
  counter by status and error type, error responses in the protocol's shape.
* :class:`EventStreamResponse` -- an SSE response whose body iterator is always
  closed (and therefore its engine requests aborted) when the response ends,
  whether it finished, failed or the client went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from deepseek_frontend import _tracing
from deepseek_frontend._tasks import DisconnectWatch
from deepseek_frontend.errors import (
    FrontendError,
    KeyRateLimitError,
    PayloadTooLargeError,
    RequestError,
    RequestTimeoutError,
)
from deepseek_frontend.pipeline.offload import CURRENT_TURN, release_current_turn

from .admission import Admission, BodyReaders
from .arrivals import ArrivalPacer
from .errors import ErrorBodyRenderer, as_frontend_error, error_response, openai_error_body
from .memory import LARGE_BODY_BYTES, MemoryReleaser
from .rate_limits import Refusal
from .sse import MEDIA_TYPE, SSE_HEADERS

if TYPE_CHECKING:
    from deepseek_frontend._tracing import RequestTrace, Tracer
    from deepseek_frontend.pipeline.chat import ChatPipeline
    from deepseek_frontend.tokenization import PromptTokenizer

    from .config import ServerConfig
    from .metrics import FrontendMetrics, RequestFigures
    from .model_registry import ModelRegistry
    from .rate_limits import KeyUsageMetrics, RateLimiter
    from .served_model import ServedModel
    from .tenants import TenantTable

log = logging.getLogger("deepseek_frontend.api")

REQUEST_ID_HEADER = "x-request-id"

T = TypeVar("T")


@dataclass(slots=True)
class FrontendState:
    """Shared state of one server (``app.state.frontend``)."""

    #: the served models (api/model_registry.py); a reload swaps the registry, never edits it
    models: ModelRegistry
    #: the server's own metrics: requests not (yet) routed to a model, keys' usage, model_info
    metrics: FrontendMetrics
    extra: dict[str, Any] = field(default_factory=dict)
    #: bounds the requests whose body is still arriving, before admission (None: unlimited)
    body_readers: BodyReaders | None = None
    #: gives the memory of large requests back once they are done (None: left to the allocator)
    memory: MemoryReleaser | None = None
    #: heads of recent request bodies: a request that starts like one of them is served first
    recent_heads: RecentHeads | None = None
    #: paces the starts of cold requests (used by ``serve``'s HTTP protocol)
    arrivals: ArrivalPacer | None = None
    #: stored responses, conversations and kept reasoning (a ``state.StateStore``; opened by the lifespan)
    store: Any = None
    #: OpenTelemetry traces of requests (``_tracing.tracer_from_env``; None: tracing off)
    tracer: Tracer | None = None
    #: the API keys (api/tenants.py; None: no key needed)
    tenants: TenantTable | None = None
    #: the keys' request, token and concurrency limits (api/rate_limits.py)
    limiter: RateLimiter | None = None
    #: the keys' usage counters in ``metrics``
    key_usage: KeyUsageMetrics | None = None
    #: what the server was configured with (api/fleet_config.py); a reload replaces it
    fleet: Any = None

    @property
    def config(self) -> ServerConfig:
        """The server-wide settings (the first model's configuration, whose server fields every
        model shares)."""
        return self.models.default.config

    @property
    def pipeline(self) -> ChatPipeline:
        """The first model's pipeline (its loop turns and offload threads are every model's)."""
        return self.models.default.pipeline

    @property
    def tokenizer(self) -> PromptTokenizer:
        """The first model's tokenizer."""
        return self.models.default.tokenizer

    @property
    def backend(self) -> Any:
        """The first model's engine backend."""
        return self.models.default.backend

    @property
    def admission(self) -> Admission:
        """The first model's admission control."""
        return self.models.default.admission


def get_state(request: Request) -> FrontendState:
    app = request.scope["app"]
    # FrontendApp's attribute first: Starlette's State resolves attributes in Python
    state = getattr(app, "frontend", None)
    return state if state is not None else app.state.frontend


def new_request_id(prefix: str = "chatcmpl") -> str:
    """``<prefix>-<32 hex>``: unique per request; also the engine request id."""
    return f"{prefix}-{os.urandom(16).hex()}"  # what uuid4().hex carries, without building a UUID


#: bytes of a request body that make its head (:class:`RecentHeads`)
HEAD_BYTES = 4096
#: the scope key where the HTTP protocol leaves its verdict on a body's head (True: a recent
#: conversation's), so that the application does not judge the same body a second time
WARM_KEY = "deepseek_frontend.warm"
#: request heads remembered (one int each)
RECENT_HEADS = 4096


class RecentHeads:
    """Which request bodies started with the same bytes as a recent one: a bounded LRU of
    fingerprints of their first :data:`HEAD_BYTES` bytes.

    An agent resends its whole conversation every turn, so its next request starts like its last
    one, and that conversation's prompt is in the tokenizer's caches: preparing it is cheap. Such a
    request takes an urgent loop turn (``LoopTurns``) and so is not queued behind a burst of cold
    prompts. A wrong guess only reorders the queue: every request is still served, and a cold one
    sent ahead does its tokenizing on the offload threads all the same.
    """

    __slots__ = ("_seen", "max_entries")

    def __init__(self, max_entries: int = RECENT_HEADS) -> None:
        self.max_entries = max_entries
        self._seen: OrderedDict[int, None] = OrderedDict()

    def seen_before(self, body: bytes | bytearray) -> bool:
        """Whether a recent body started with the same bytes; then remember this one's head.

        ``body`` may be the HTTP protocol's ``bytearray`` buffer: either way its head is copied
        once, to be hashed."""
        key = hash(bytes(memoryview(body)[:HEAD_BYTES]))
        seen = self._seen
        if key in seen:
            seen.move_to_end(key)
            return True
        seen[key] = None
        if len(seen) > self.max_entries:
            seen.popitem(last=False)
        return False


#: seconds a client may take to send its whole request body (32 MiB at 1 MB/s takes 32 s)
BODY_TIMEOUT_S = 60.0


#: where :func:`receive_body` leaves a body it read (``request.state``)
BODY_ATTR = "received_body"
#: where :func:`api_route` leaves a body it parsed to find the model it names (``request.state``)
PARSED_ATTR = "parsed_body"


def _route(request: Request, state: FrontendState, selects_model: bool) -> ServedModel:
    """The model ``request`` goes to: the one its JSON body's ``model`` names (``selects_model``),
    among those its API key may use. With one model and a key that may use it, the body is not
    parsed here (the handler parses it after admission). Raises ``ModelNotFoundError`` (404) and,
    for a body that is not a JSON object, ``RequestError`` (400)."""
    models = state.models
    tenant = request.scope.get("state", {}).get("tenant")
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


#: where :func:`api_route` leaves the model a request was routed to (``request.state``)
MODEL_ATTR = "served_model"


def served_model(request: Request) -> ServedModel:
    """The model ``request`` was routed to (:func:`api_route`), or the server's first model."""
    model = getattr(request.state, MODEL_ATTR, None)
    return model if model is not None else get_state(request).models.default


def _body_limits(request: Request, max_bytes: int | None, timeout_s: float | None) -> tuple[int, float]:
    config = get_state(request).config
    if max_bytes is None:
        max_bytes = int(getattr(config, "max_body_bytes", 32 * 1024 * 1024))
    if timeout_s is None:
        timeout_s = getattr(getattr(config, "limits", None), "body_timeout", BODY_TIMEOUT_S)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(f"request body is {declared} bytes; the limit is {max_bytes}")
    return max_bytes, timeout_s or 0.0


async def receive_body(request: Request, max_bytes: int | None = None) -> None:
    """Read ``request``'s whole body before it is admitted; :func:`read_json` then parses it.

    A body that is complete at its first read takes nothing; one still arriving takes a reader
    slot (:class:`~deepseek_frontend.api.admission.BodyReaders`: per client address, then in all)
    until it is in, so a slow body never holds an admission slot. Raises ``OverloadedError``
    (429) past the reader limits, ``PayloadTooLargeError`` (413), ``RequestTimeoutError`` (408)
    after the server's ``body_timeout``, ``RequestError`` if the client goes away.
    """
    max_bytes, timeout_s = _body_limits(request, max_bytes, None)
    readers = get_state(request).body_readers
    client = request.client.host if request.client is not None else ""
    parts: list[bytes] = []
    size = 0
    reading = False
    # A client may send its body slowly: nobody else waits for this request's loop turn meanwhile.
    release_current_turn()
    CURRENT_TURN.set(None)
    try:
        async with asyncio.timeout(timeout_s or None):
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise RequestError("client disconnected while sending the body")
                part = message.get("body", b"")
                size += len(part)
                if size > max_bytes:
                    raise PayloadTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
                parts.append(part)
                if not message.get("more_body", False):
                    break
                if readers is not None and not reading:
                    refusal = await readers.enter(client)
                    if refusal is not None:
                        raise refusal
                    reading = True
    except TimeoutError:
        raise RequestTimeoutError(
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes received)"
        ) from None
    finally:
        if reading and readers is not None:
            readers.leave(client)
    setattr(request.state, BODY_ATTR, b"".join(parts))


async def read_json(request: Request, max_bytes: int, timeout_s: float | None = None) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises ``PayloadTooLargeError`` past ``max_bytes`` (checked on Content-Length
    first, then while reading, so a lying client cannot make us buffer more),
    ``RequestTimeoutError`` (408, and the connection is closed) when the body has not
    arrived within ``timeout_s`` seconds (default: the server's ``body_timeout``, else
    :data:`BODY_TIMEOUT_S`) -- a client trickling its body must not hold a request slot
    forever -- and ``RequestError`` for invalid JSON or a non-object body.
    """
    body: bytes | None = getattr(request.state, BODY_ATTR, None)
    if body is None:  # not read before admission (a route outside api_route, a test)
        max_bytes, timeout_s = _body_limits(request, max_bytes, timeout_s)
        body = await _read_stream(request, max_bytes, timeout_s)
    elif len(body) > max_bytes:
        raise PayloadTooLargeError(f"request body is {len(body)} bytes; the limit is {max_bytes}")
    state = get_state(request)
    turns = getattr(state.pipeline, "turns", None)
    if turns is not None:
        # Parsing, validating and preparing the prompt run on the event loop in turns, from here
        # until the request waits on the engine (ChatPipeline.start gives the turn up): a burst
        # queues here instead of running thousands of such steps in one loop iteration while
        # /live and everyone else wait. A follow-up of a recent conversation goes first.
        urgent = request.scope.get(WARM_KEY)
        if urgent is None:  # not judged by the HTTP protocol (a test client, another server)
            heads = state.recent_heads
            urgent = heads.seen_before(body) if heads is not None else False
        CURRENT_TURN.set(await turns.take(urgent))
    parsed = getattr(request.state, PARSED_ATTR, None)  # parsed already to route it (api_route)
    return parsed if parsed is not None else parse_json_object(body)


async def _read_stream(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    parts: list[bytes] = []
    size = 0
    # A client may send its body slowly: nobody else waits for this request's loop turn meanwhile.
    release_current_turn()
    CURRENT_TURN.set(None)
    try:
        async with asyncio.timeout(timeout_s or None):
            async for part in request.stream():
                size += len(part)
                if size > max_bytes:
                    raise PayloadTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
                parts.append(part)
    except ClientDisconnect:
        raise RequestError("client disconnected while sending the body") from None
    except TimeoutError:
        raise RequestTimeoutError(
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes received)"
        ) from None
    return b"".join(parts)


def parse_json_object(raw: bytes, where: str = "request body") -> dict[str, Any]:
    """``raw`` as a JSON object; a ``RequestError`` naming ``where`` if empty, not JSON or not an object."""
    if not raw:
        raise RequestError(f"{where} is empty; expected a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(f"{where} must be a JSON object, got {type(data).__name__}")
    return data


class TurnGate:
    """Pure-ASGI middleware: each ``POST`` request starts by taking a loop turn (see ``LoopTurns``).

    A burst of thousands of requests would otherwise run thousands of routing, validation and
    admission steps in one event-loop iteration, and ``/live`` would wait behind all of them. Here a
    request's first step only queues; the turn is handed on when the request reads its body, waits
    on the engine or ends. Other methods (``GET /live``, ``/health``, ``/metrics``) pass straight
    through.

    That first step (routing, admission, up to reading the body) is short, so it takes an urgent
    turn: arrivals are not queued behind the prompt work of the cold requests before them, and a
    follow-up of a recent conversation reaches its own (urgent) prompt turn at once (``read_json``).
    """

    def __init__(self, app: ASGIApp, turns: Any) -> None:
        self.app = app
        self.turns = turns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        token = CURRENT_TURN.set(await self.turns.take(urgent=True))
        try:
            await self.app(scope, receive, send)
        finally:
            release_current_turn()
            CURRENT_TURN.reset(token)


class RequestTracker:
    """Per-request bookkeeping: in-flight gauge, status counter, e2e latency, one log line.

    ``finish`` is idempotent: the wrapper calls it for plain responses, a streaming
    response calls it when its body ends (``deferred`` set by the endpoint).
    """

    __slots__ = (
        "_done",
        "_release",
        "deferred",
        "endpoint",
        "grant",
        "key_name",
        "key_usage",
        "metrics",
        "model",
        "on_done",
        "request_id",
        "started",
        "stream_error",
        "trace",
    )

    def __init__(self, metrics: FrontendMetrics, endpoint: str, request_id: str) -> None:
        self.metrics = metrics
        self.endpoint = endpoint
        self.request_id = request_id
        self.started = time.perf_counter()
        self.deferred = False
        #: error type of an in-band error event a stream ended with ('' if none)
        self.stream_error = ""
        #: the API key's name in logs (api/logs.key_name), '' without API keys
        self.key_name = ""
        self._done = False
        #: gives the request's admission slot back (set once admitted)
        self._release: Callable[[], None] | None = None
        #: called once when the request is done (a large request's MemoryReleaser.finished)
        self.on_done: Callable[[], None] | None = None
        #: the request's spans (tracing on), ended by :meth:`finish`
        self.trace: RequestTrace | None = None
        #: the model the request was routed to (:meth:`route`)
        self.model: ServedModel | None = None
        #: the API key's rate-limit admission (rate_limits.Admitted), given back by :meth:`finish`
        self.grant: Any = None
        #: where the key's usage is counted (with API keys)
        self.key_usage: KeyUsageMetrics | None = None
        metrics.in_flight.labels(endpoint).inc()

    def route(self, model: ServedModel) -> None:
        """The request goes to ``model``: from here on it is counted in that model's metrics."""
        if model.metrics is not self.metrics:
            self.metrics.in_flight.labels(self.endpoint).dec()
            self.metrics = model.metrics
            self.metrics.in_flight.labels(self.endpoint).inc()
        model.enter()
        self.model = model

    def finish(self, status: int, error_type: str = "", message: str = "") -> None:
        """Count the request by status and log its "request done" line (idempotent).

        ``message`` is the error message the client got (it names the field and what is
        wrong, never the API key or message contents), logged at the default level so an
        operator sees why a 4xx happened.
        """
        if self._done:
            return
        self._done = True
        release, self._release = self._release, None
        if release is not None:
            release()
        done, self.on_done = self.on_done, None
        if done is not None:
            done()
        m = self.metrics
        elapsed = time.perf_counter() - self.started
        m.in_flight.labels(self.endpoint).dec()
        m.requests.labels(self.endpoint, str(status), error_type).inc()
        m.e2e.observe(elapsed)
        figures = m.ledger.take(self.request_id)
        model, self.model = self.model, None
        if model is not None:
            model.leave()
        charge = self.hand_over_key_charge()
        if charge is not None:
            charge.settle(status, figures, model.name if model is not None else "")
        trace = self.trace
        if trace is not None:
            self.trace = None
            trace.finish(status, error_type, message, _span_figures(figures, self.key_name))
        log_request_done(
            self.request_id, self.endpoint, status, error_type, message, elapsed, figures, self.key_name
        )

    def hand_over_key_charge(self) -> KeyCharge | None:
        """What the request owes its API key (its limits' admission, its usage), taken from the
        tracker: a background response settles it when its generation ends, not when the request
        that queued it does. None without API keys (or when handed over already)."""
        grant, self.grant = self.grant, None
        usage, self.key_usage = self.key_usage, None
        if grant is None and usage is None:
            return None
        return KeyCharge(grant, usage, self.key_name)


class KeyCharge:
    """A request's debt to its API key: the rate limits' admission to give back with the tokens
    used, and the usage counters to add to. :meth:`settle` once, when the generation is over."""

    __slots__ = ("grant", "key_name", "usage")

    def __init__(self, grant: Any, usage: KeyUsageMetrics | None, key_name: str) -> None:
        self.grant = grant
        self.usage = usage
        self.key_name = key_name

    def settle(self, status: int, figures: RequestFigures | None, model: str) -> None:
        prompt = figures.prompt_tokens if figures is not None else 0
        cached = figures.cached_tokens if figures is not None else 0
        output = figures.completion_tokens if figures is not None else 0
        grant, self.grant = self.grant, None
        if grant is not None:
            grant.release(prompt + output)  # the key's tokens per minute count what was used
        if self.usage is not None and self.key_name:
            self.usage.record(self.key_name, model, str(status), prompt, cached, output)


def _span_figures(figures: RequestFigures | None, key_name: str) -> dict[str, Any]:
    """The server span's closing attributes (OpenTelemetry's GenAI names where there is one)."""
    out: dict[str, Any] = {}
    if key_name:
        out["deepseek.key_name"] = key_name
    if figures is not None:
        if figures.model:
            out["gen_ai.request.model"] = figures.model
        out["gen_ai.usage.input_tokens"] = figures.prompt_tokens
        out["gen_ai.usage.output_tokens"] = figures.completion_tokens
        out["deepseek.cached_tokens"] = figures.cached_tokens
        if figures.ttft is not None:
            out["deepseek.ttft_seconds"] = figures.ttft
    return out


def log_request_done(
    request_id: str,
    endpoint: str,
    status: int,
    error_type: str,
    message: str,
    seconds: float,
    figures: RequestFigures | None = None,
    key_name: str = "",
) -> None:
    """The one "request done" line of a request (INFO, WARNING for 5xx), with the error message if any.

    Fields: ``request_id``, ``endpoint``, ``status``, ``error_type``, ``model`` and ``key_name``
    (``-`` when unknown), ``prompt_tokens``, ``cached_tokens``, ``completion_tokens`` (0 when the
    request generated nothing), ``ttft_seconds`` (only when a token came) and ``seconds`` (total).
    """
    extra: dict[str, object] = {
        "request_id": request_id,
        "endpoint": endpoint,
        "status": status,
        "error_type": error_type or "-",
        "model": (figures.model if figures is not None else "") or "-",
        "key_name": key_name or "-",
        "prompt_tokens": figures.prompt_tokens if figures is not None else 0,
        "cached_tokens": figures.cached_tokens if figures is not None else 0,
        "completion_tokens": figures.completion_tokens if figures is not None else 0,
    }
    if figures is not None and figures.ttft is not None:
        extra["ttft_seconds"] = round(figures.ttft, 4)
    extra["seconds"] = round(seconds, 4)
    if message:
        extra["error"] = message
    log.log(logging.INFO if status < 500 else logging.WARNING, "request done", extra=extra)


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
                model = _route(request, state, selects_model)
                tracker.route(model)
                setattr(request.state, MODEL_ATTR, model)
                tenant = request.scope.get("state", {}).get("tenant")
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


#: where :class:`FrontendApp` puts the server's own ``send`` in the ASGI scope (see EventStreamResponse)
RAW_SEND_KEY = "deepseek_frontend.raw_send"


class FrontendApp(Starlette):
    """The Starlette app, which also hands the server's own ``send`` to the responses in the scope.

    Starlette's error middlewares wrap ``send`` only to learn whether a response has started; an
    event stream sends its start through them and its body parts -- one per engine chunk, the
    hot path -- straight to the server (two Python calls less per chunk and stream).
    """

    #: the server's shared state (also ``app.state.frontend``), set by ``create_app``
    frontend: FrontendState | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[RAW_SEND_KEY] = send
        try:
            await super().__call__(scope, receive, send)
        finally:
            # uvicorn's ``send`` is a method of the request cycle, which holds this scope: left in
            # place, every request would be a reference cycle only the cyclic GC frees
            scope.pop(RAW_SEND_KEY, None)


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` response that always closes its body iterator.

    The body iterator is closed, shielded from cancellation, when the response ends in any way --
    finished, failed, or the client went away -- so its ``finally`` (engine abort) runs at once,
    not whenever the garbage collector finalises a generator suspended at a ``yield``. The tracker
    records status 200 for a stream that ran to its end, 499 for one the client abandoned, and the
    error type a body generator reports through :attr:`error_type`.

    Starlette's ``StreamingResponse`` runs the body and a disconnect listener in an anyio task
    group: two tasks and a cancel scope per response, and its cancellation formats the task's repr
    -- about a tenth of a short request's cost. Here the body is written by the request's own task
    and a watcher task cancels it when the client disconnects.
    """

    def __init__(
        self,
        content: AsyncIterator[bytes],
        tracker: RequestTracker | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self._body_done = False
        super().__init__(content, media_type=MEDIA_TYPE, headers={**SSE_HEADERS, **(headers or {})})
        self._tracker = tracker
        if tracker is not None:
            tracker.deferred = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = DisconnectWatch(receive)
        body_send: Send = scope.get(RAW_SEND_KEY) or send
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for part in self.body_iterator:
                await body_send({"type": "http.response.body", "body": part, "more_body": True})
            watch.stop()  # the server answers http.disconnect once the response is complete
            await body_send({"type": "http.response.body", "body": b"", "more_body": False})
            self._body_done = True
        except asyncio.CancelledError:
            if not watch.absorb():  # the client went away: the normal end of an abandoned stream
                raise
        finally:
            watch.stop()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                # shielded only when a cancellation is under way (a cancel scope costs on every stream)
                writer = asyncio.current_task()
                shield = anyio.CancelScope(shield=True) if writer is None or writer.cancelling() else None
                with shield or contextlib.nullcontext(), contextlib.suppress(Exception):
                    await aclose()
            if self._tracker is not None:
                if self._tracker.stream_error:
                    self._tracker.finish(200, self._tracker.stream_error)
                elif self._body_done:
                    self._tracker.finish(200)
                else:
                    # the client went away before the end (nginx's "client closed request")
                    self._tracker.finish(499, "client_disconnected")


class ClientGoneError(FrontendError):
    """The client disconnected before a non-streaming answer was ready (logged as 499)."""

    status_code = 499
    error_type = "client_disconnected"


async def _disconnected(request: Request) -> None:
    """Return when the client has gone (its body read, the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Await ``work`` (e.g. folding a whole non-streaming answer) unless the client leaves first.

    The request body must already be read: the next ASGI message is then the disconnect.
    On a disconnect ``work`` is cancelled -- which closes its engine streams and so aborts
    the engine requests -- and ``ClientGoneError`` is raised.

    A warm request (``WARM_KEY``: a follow-up whose prompt came from the caches) awaits ``work``
    in the request's own task, so its engine request goes out in the step that prepared it. In a
    new task the work would start one loop iteration later, after that iteration's network reads
    -- during a burst, milliseconds of other connections' requests (bench_burst_stages.py
    --timeline).
    """
    if request.scope.get(WARM_KEY):
        return await _in_this_task_unless_disconnected(request, work)
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    if task.cancelled():
        raise ClientGoneError("the client disconnected before the response was ready")
    return task.result()


async def _in_this_task_unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """:func:`unless_disconnected` with ``work`` awaited in the calling task, which a watcher
    cancels when the client leaves first."""
    task = asyncio.current_task()
    assert task is not None
    finished = False
    # The request's loop turn is handed on at the next iteration, when a task of its own would
    # have started the work and given the turn up: ``work`` runs now, but a burst's pacing (at
    # most ``LOOP_TURN_SLOTS`` requests' prompt work per iteration) stays what it was. Given up
    # at once instead, twice as many requests' preparing and engine calls ran per iteration and
    # /live stalled for 300 ms in tests/reliability/test_burst.py.
    release = CURRENT_TURN.get()
    if release is not None:
        CURRENT_TURN.set(None)
        asyncio.get_running_loop().call_soon(release)

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        # Runs as a loop callback, so the task is suspended in ``await work`` -- or done with it
        if not finished and not watcher.cancelled() and watcher.exception() is None:
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(on_disconnect)
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled() and watcher.exception() is None:
            task.uncancel()  # this cancellation was ours, not the caller's
            raise ClientGoneError("the client disconnected before the response was ready") from None
        raise
    finally:
        finished = True
        watcher.cancel()


def stream_error_body(
    exc: BaseException, render: ErrorBodyRenderer = openai_error_body
) -> tuple[FrontendError, Any]:
    """The error a stream reports in-band, and its JSON body in the protocol's shape."""
    err = as_frontend_error(exc)
    return err, render(err)
