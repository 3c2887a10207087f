"""OpenTelemetry traces of requests: off unless the standard ``OTEL_*`` variables ask for them.

Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp`` or ``console``) or an OTLP
endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and
``OTEL_SDK_DISABLED`` is not ``true``. Only then is the OpenTelemetry SDK imported (the ``otel``
extra): with tracing off nothing of it is loaded and no exporter thread runs.

The span tree of one request (every phase a child of the server span)::

    POST /v1/chat/completions   (SERVER; the client's ``traceparent`` is its parent)
      admission                 the wait for an admission slot
      render                    the chat format renders the prompt
      tokenize                  the prompt text the caches do not hold is tokenized
      routing                   a worker is chosen (attributes: worker, router)
      engine                    one choice's engine call (CLIENT); its context goes to the worker
        engine.first_token      from the call to the first token (the worker's queue and prefill)
        engine.stream           from the first token to the stream's end
      response                  from the handler's answer to the last byte of the body

The layers below the API reach the request's trace through a context variable (:func:`current`,
:func:`phase`) set by the API layer for the request's task; with tracing off it holds ``None`` (or a
:class:`PassThrough` when the client sent a ``traceparent``), and every hook is one lookup.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar, Token
from typing import Any

__all__ = [
    "TRACE_HEADERS",
    "EngineCall",
    "PassThrough",
    "RequestTrace",
    "Tracer",
    "check_env",
    "current",
    "enter",
    "leave",
    "phase",
    "tracer_from_env",
    "tracing_configured",
]

#: the W3C trace context headers, read from clients and sent to workers
TRACE_HEADERS = ("traceparent", "tracestate")

_NULL: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
_CURRENT: ContextVar[RequestTrace | PassThrough | None] = ContextVar("deepseek_frontend_trace", default=None)


def tracing_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the ``OTEL_*`` variables in ``environ`` turn tracing on (see the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


#: the exporters this module can build, and the module each needs (the ``otel`` extra)
_EXPORTER_MODULES = {
    "otlp": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "console": "opentelemetry.sdk.trace.export",
}


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters ``OTEL_TRACES_EXPORTER`` names (``otlp`` when unset); raises ``RuntimeError`` naming
    the variable for an exporter or an OTLP protocol this module cannot build."""
    raw = environ.get("OTEL_TRACES_EXPORTER", "otlp")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()] or ["otlp"]
    for name in names:
        if name not in _EXPORTER_MODULES and name != "none":
            raise RuntimeError(f"OTEL_TRACES_EXPORTER={name!r}: 'otlp', 'console' or 'none'")
    if "otlp" in names:
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip()
        if protocol != "http/protobuf":
            raise RuntimeError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: only 'http/protobuf' is supported")
    return [n for n in names if n != "none"]


def check_env(environ: Mapping[str, str] = os.environ) -> None:
    """Raise ``RuntimeError`` (naming the variable or the extra) when the ``OTEL_*`` variables turn
    tracing on in a way this installation cannot export; nothing when tracing is off. ``serve`` calls
    it before it binds, so a wrong configuration stops the start-up with that message."""
    if not tracing_configured(environ):
        return
    for name in _exporter_names(environ):
        try:
            found = importlib.util.find_spec(_EXPORTER_MODULES[name]) is not None
        except ImportError:  # a parent package is missing
            found = False
        if not found:
            raise RuntimeError(
                f"OTEL_* variables turn tracing on ({name} exporter), but the OpenTelemetry SDK and "
                "exporter are not installed: pip install 'deepseek-frontend[otel]'"
            )


def tracer_from_env(environ: Mapping[str, str] = os.environ) -> Tracer | None:
    """A :class:`Tracer` exporting as ``environ`` says, or None when tracing is off.

    Raises ``RuntimeError`` as :func:`check_env` does. The OTLP exporter reads its endpoint, headers
    and timeout from the process environment itself (``OTEL_EXPORTER_OTLP_*``).
    """
    if not tracing_configured(environ):
        return None
    check_env(environ)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    exporters: list[SpanExporter] = []
    for name in _exporter_names(environ):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        else:
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter())
    # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    resource = Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME") or "deepseek-frontend"})
    provider = TracerProvider(resource=resource)  # the sampler: OTEL_TRACES_SAMPLER(_ARG)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* tune it
    return Tracer(provider)


class Tracer:
    """The process's tracer provider and the factory of :class:`RequestTrace` objects."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("deepseek_frontend")
        self.propagator = TraceContextTextMapPropagator()
        self.set_span_in_context = set_span_in_context
        self.kind = SpanKind
        self.error_status = Status(StatusCode.ERROR)
        self.status = Status
        self.error_code = StatusCode.ERROR

    def start_request(
        self, method: str, route: str, path: str, headers: Mapping[str, str], request_id: str
    ) -> RequestTrace:
        """Start the server span of a request to ``route`` (the path template: span names stay few);
        a valid ``traceparent`` in ``headers`` is its parent."""
        carrier = {k: v for k in TRACE_HEADERS if (v := headers.get(k))}
        parent = self.propagator.extract(carrier) if carrier else None
        span = self.tracer.start_span(
            f"{method} {route}",
            context=parent,
            kind=self.kind.SERVER,
            attributes={
                "http.request.method": method,
                "http.route": route,
                "url.path": path,
                "deepseek.request_id": request_id,
            },
        )
        return RequestTrace(self, span)

    def shutdown(self) -> None:
        """Export what is buffered and stop the exporter threads."""
        self.provider.shutdown()


class RequestTrace:
    """The spans of one request (tracing on). Not thread-safe: used on the event loop."""

    __slots__ = ("_ctx", "_response", "_tracer", "span")

    def __init__(self, tracer: Tracer, span: Any) -> None:
        self._tracer = tracer
        self.span = span
        self._ctx = tracer.set_span_in_context(span)
        self._response: Any = None

    def child(self, name: str, attributes: Mapping[str, Any] | None = None, *, client: bool = False) -> Any:
        """Start a child span of the server span (ended by the caller)."""
        kind = self._tracer.kind.CLIENT if client else self._tracer.kind.INTERNAL
        return self._tracer.tracer.start_span(name, context=self._ctx, kind=kind, attributes=attributes)

    @contextlib.contextmanager
    def phase(self, name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Any]:
        """A child span around the block (an exception escaping it is recorded on the span)."""
        span = self.child(name, attributes)
        try:
            yield span
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(self._tracer.error_status)
            raise
        finally:
            span.end()

    def engine_call(self, request_id: str, index: int) -> EngineCall:
        return EngineCall(
            self,
            self.child("engine", {"deepseek.request_id": request_id, "deepseek.choice": index}, client=True),
        )

    def worker_headers(self, span: Any) -> dict[str, str]:
        """The ``traceparent`` (and ``tracestate``) naming ``span`` as the parent, for a worker."""
        carrier: dict[str, str] = {}
        self._tracer.propagator.inject(carrier, context=self._tracer.set_span_in_context(span))
        return carrier

    def responding(self) -> None:
        """The handler has answered: the ``response`` span runs until :meth:`finish`."""
        if self._response is None:
            self._response = self.child("response")

    def finish(self, status: int, error_type: str, message: str, attributes: Mapping[str, Any]) -> None:
        """End the response and server spans with the request's status, model and token counts."""
        span = self.span
        span.set_attribute("http.response.status_code", status)
        span.set_attributes(dict(attributes))
        if error_type:
            span.set_attribute("error.type", error_type)
        if status >= 500 or error_type:
            span.add_event("error", {"error.type": error_type or str(status), "message": message})
        if status >= 500:
            span.set_status(self._tracer.status(self._tracer.error_code, message or None))
        if self._response is not None:
            self._response.end()
            self._response = None
        span.end()


class EngineCall:
    """The ``engine`` span of one choice, with its first-token and stream children."""

    __slots__ = ("_first_at", "_started", "_trace", "span")

    def __init__(self, trace: RequestTrace, span: Any) -> None:
        self._trace = trace
        self.span = span
        self._started = time.time_ns()
        self._first_at: int | None = None

    def headers(self) -> dict[str, str]:
        """The trace context headers for the worker: this span is the worker's parent."""
        return self._trace.worker_headers(self.span)

    def first_token(self, cached_tokens: int) -> None:
        now = time.time_ns()
        self._first_at = now
        tracer = self._trace._tracer
        first = tracer.tracer.start_span(
            "engine.first_token",
            context=tracer.set_span_in_context(self.span),
            start_time=self._started,
            attributes={"deepseek.cached_tokens": cached_tokens},
        )
        first.end(end_time=now)
        self.span.add_event("first_token", timestamp=now)

    def fail(self, exc: BaseException) -> None:
        """Record why the call failed (ended by :meth:`end` as usual)."""
        tracer = self._trace._tracer
        self.span.record_exception(exc)
        self.span.set_status(tracer.status(tracer.error_code, str(exc) or type(exc).__name__))

    def end(self, prompt_tokens: int, completion_tokens: int) -> None:
        """End the call (once: :class:`ChoiceStream` closes once)."""
        now = time.time_ns()
        tracer = self._trace._tracer
        if self._first_at is not None:
            stream = tracer.tracer.start_span(
                "engine.stream",
                context=tracer.set_span_in_context(self.span),
                start_time=self._first_at,
                attributes={"gen_ai.usage.output_tokens": completion_tokens},
            )
            stream.end(end_time=now)
        self.span.set_attributes(
            {"gen_ai.usage.input_tokens": prompt_tokens, "gen_ai.usage.output_tokens": completion_tokens}
        )
        self.span.end(end_time=now)


class PassThrough:
    """Tracing off, but the client sent trace context: the workers get its headers unchanged (as
    SGLang's gateway forwards them), so a trace the client started still reaches the engines."""

    __slots__ = ("headers",)

    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


def enter(
    tracer: Tracer | None, method: str, route: str, path: str, headers: Mapping[str, str], request_id: str
) -> tuple[RequestTrace | None, Token[Any] | None]:
    """Start the request's trace (or its pass-through) and make it current; ``(None, None)`` when
    there is neither a tracer nor a client ``traceparent``."""
    if tracer is not None:
        trace = tracer.start_request(method, route, path, headers, request_id)
        return trace, _CURRENT.set(trace)
    parent = headers.get("traceparent")
    if parent is None:
        return None, None
    carried = {"traceparent": parent}
    state = headers.get("tracestate")
    if state:
        carried["tracestate"] = state
    return None, _CURRENT.set(PassThrough(carried))


def leave(token: Token[Any] | None) -> None:
    """Undo :func:`enter` for the request's task."""
    if token is not None:
        _CURRENT.reset(token)


def current() -> RequestTrace | PassThrough | None:
    """The current request's trace, its pass-through headers, or None."""
    return _CURRENT.get()


def phase(name: str, attributes: Mapping[str, Any] | None = None) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current request around a block (the block gets the span, or None)."""
    trace = _CURRENT.get()
    if trace is None or trace.__class__ is PassThrough:
        return _NULL
    assert isinstance(trace, RequestTrace)
    return trace.phase(name, attributes)


def engine_call(request_id: str, index: int) -> tuple[EngineCall | None, Mapping[str, str] | None]:
    """The engine span of a choice (None when not tracing) and the headers its worker request carries."""
    trace = _CURRENT.get()
    if trace is None:
        return None, None
    if trace.__class__ is PassThrough:
        assert isinstance(trace, PassThrough)
        return None, trace.headers
    assert isinstance(trace, RequestTrace)
    call = trace.engine_call(request_id, index)
    return call, call.headers()
