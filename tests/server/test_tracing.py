"""OpenTelemetry traces, end to end: a real ``serve`` exports OTLP/HTTP protobuf to a receiver in this
process, over a sim-engine process speaking SGLang's protocol.

* with the ``OTEL_*`` variables set, a request's spans arrive in one trace that continues the client's
  ``traceparent``: the server span is the client span's child, the admission, render, tokenize,
  routing, engine and response spans are the server span's, the engine span has its first-token and
  stream children; the worker got a ``traceparent`` with the client's trace id whose parent is the
  engine span (and the client's ``tracestate``);
* a refused request's server span carries its status and error type;
* tracing off (``OTEL_SDK_DISABLED``, or no variable at all): nothing reaches the receiver, the SDK is
  never imported, and a client's ``traceparent`` goes to the worker unchanged.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from deepseek_frontend._tracing import tracer_from_env, tracing_configured
from tests.support.servers import Server, start_frontend, start_sim_engine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"
TRACESTATE = "vendor=opaque1"
MESSAGES = [{"role": "user", "content": "Say something about the sea."}]


class Receiver:
    """An OTLP/HTTP trace receiver: ``POST /v1/traces`` with a protobuf ``ExportTraceServiceRequest``."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.resources: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                export = ExportTraceServiceRequest()
                export.ParseFromString(body)
                with receiver.lock:
                    for rs in export.resource_spans:
                        attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            receiver.spans.extend(ss.spans)
                            receiver.resources.extend(attrs for _ in ss.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def worker() -> Iterator[Server]:
    with start_sim_engine() as server:
        yield server


def _otel_env(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "frontend-under-test")


def _chat(frontend: Server, headers: dict[str, str], **fields: Any) -> httpx.Response:
    body = {"model": "deepseek-v4-flash", "messages": MESSAGES, "max_tokens": 12, **fields}
    return httpx.post(frontend.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def _trace_headers_seen(worker: Server) -> list[dict[str, str]]:
    return httpx.get(worker.url + "/sim/stats", timeout=5).json()["trace_headers"]


def _by_name(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def _attrs(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value"))
    return out


def test_a_traced_request_continues_the_clients_trace_down_to_the_worker(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver, worker: Server
) -> None:
    _otel_env(monkeypatch, receiver)
    seen_before = len(_trace_headers_seen(worker))
    with start_frontend("--engine", "sglang", "--worker", worker.url) as frontend:
        headers = {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
        with httpx.stream(
            "POST",
            frontend.url + "/v1/chat/completions",
            json={"model": "deepseek-v4-flash", "messages": MESSAGES, "max_tokens": 12, "stream": True},
            headers=headers,
            timeout=30,
        ) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            assert "[DONE]" in response.read().decode()

        def server_span_arrived() -> bool:
            return any(s.kind == Span.SPAN_KIND_SERVER for s in receiver.snapshot())

        wait_until(server_span_arrived, "the request's server span reached the OTLP receiver", timeout=20)
        spans = [s for s in receiver.snapshot() if s.trace_id.hex() == TRACE_ID]
        names = _by_name(spans)
        (server,) = names["POST /v1/chat/completions"]
        assert server.kind == Span.SPAN_KIND_SERVER
        assert server.parent_span_id.hex() == CLIENT_SPAN_ID
        attrs = _attrs(server)
        assert attrs["http.response.status_code"] == 200
        assert attrs["http.route"] == attrs["url.path"] == "/v1/chat/completions"
        assert attrs["deepseek.request_id"] == request_id
        assert attrs["gen_ai.request.model"] == "deepseek-v4-flash"
        assert attrs["gen_ai.usage.input_tokens"] > 0
        assert 0 < attrs["gen_ai.usage.output_tokens"] <= 12
        assert server.status.code != server.status.STATUS_CODE_ERROR

        # every phase is a child of the server span, inside its time
        for name in ("admission", "render", "tokenize", "routing", "engine", "response"):
            assert name in names, f"no {name} span among {sorted(names)}"
            for span in names[name]:
                assert span.parent_span_id == server.span_id, name
                assert server.start_time_unix_nano <= span.start_time_unix_nano
                assert span.end_time_unix_nano <= server.end_time_unix_nano
        (routing,) = names["routing"]
        assert _attrs(routing)["deepseek.worker"] == worker.url
        (engine,) = names["engine"]
        assert engine.kind == Span.SPAN_KIND_CLIENT
        assert _attrs(engine)["gen_ai.usage.output_tokens"] == attrs["gen_ai.usage.output_tokens"]
        (first,) = names["engine.first_token"]
        (stream,) = names["engine.stream"]
        assert first.parent_span_id == engine.span_id and stream.parent_span_id == engine.span_id
        assert first.end_time_unix_nano <= stream.start_time_unix_nano + 1
        assert [e.name for e in engine.events] == ["first_token"]
        (render,) = names["render"]
        (tokenize,) = names["tokenize"]
        assert render.end_time_unix_nano <= tokenize.start_time_unix_nano
        assert tokenize.end_time_unix_nano <= engine.start_time_unix_nano
        assert engine.end_time_unix_nano <= names["response"][0].end_time_unix_nano
        assert {r["service.name"] for r in receiver.resources} == {"frontend-under-test"}

        # the worker got the engine span as its parent, in the client's trace
        sent = _trace_headers_seen(worker)[seen_before:]
        assert len(sent) == 1
        version, trace_id, parent_id, flags = sent[0]["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", TRACE_ID, "01")
        assert parent_id == engine.span_id.hex()
        assert sent[0]["tracestate"] == TRACESTATE

        # a refused request: its server span says how, and nothing reached the worker
        refused = _chat(frontend, headers, max_tokens=-1)
        assert refused.status_code == 400

        def refused_span_arrived() -> bool:
            return any(_attrs(s).get("http.response.status_code") == 400 for s in receiver.snapshot())

        wait_until(refused_span_arrived, "the refused request's server span arrived", timeout=20)
        (bad,) = [s for s in receiver.snapshot() if _attrs(s).get("http.response.status_code") == 400]
        assert bad.trace_id.hex() == TRACE_ID and bad.parent_span_id.hex() == CLIENT_SPAN_ID
        assert _attrs(bad)["error.type"] == "invalid_request_error"
        assert len(_trace_headers_seen(worker)) == seen_before + 1

        # a request without trace context starts a trace of its own, still sent to the worker
        plain = _chat(frontend, {})
        assert plain.status_code == 200
        sent = _trace_headers_seen(worker)[seen_before + 1 :]
        assert len(sent) == 1
        assert sent[0]["traceparent"].split("-")[1] not in (TRACE_ID, "0" * 32)


def test_a_worker_failing_mid_stream_marks_the_engine_span_failed(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    with start_sim_engine() as failing:
        fault = {"fail_after": 2, "fail_mode": "error-event"}
        assert httpx.post(failing.url + "/sim/fault", json=fault, timeout=5).status_code == 200
        _otel_env(monkeypatch, receiver)
        with start_frontend("--engine", "sglang", "--worker", failing.url) as frontend:
            with httpx.stream(
                "POST",
                frontend.url + "/v1/chat/completions",
                json={"model": "deepseek-v4-flash", "messages": MESSAGES, "max_tokens": 12, "stream": True},
                headers={"traceparent": TRACEPARENT},
                timeout=30,
            ) as response:
                text = response.read().decode()
            assert '"error"' in text  # the stream's in-band error event

            def server_span_arrived() -> bool:
                return any(s.kind == Span.SPAN_KIND_SERVER for s in receiver.snapshot())

            wait_until(server_span_arrived, "the request's server span reached the OTLP receiver", timeout=20)
    engines = [s for s in receiver.snapshot() if s.name == "engine"]
    assert engines and all(s.trace_id.hex() == TRACE_ID for s in engines)
    assert engines[-1].status.code == engines[-1].status.STATUS_CODE_ERROR
    assert any(e.name == "exception" for e in engines[-1].events)
    (server,) = [s for s in receiver.snapshot() if s.kind == Span.SPAN_KIND_SERVER]
    assert _attrs(server).get("error.type"), _attrs(server)


def test_both_legs_of_a_disaggregated_request_get_the_engine_span_as_parent(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver
) -> None:
    pd = ("--disaggregation-bootstrap-port", "0")
    with (
        start_sim_engine("--disaggregation-mode", "prefill", *pd) as prefill,
        start_sim_engine(
            "--disaggregation-mode", "decode", "--disaggregation-handshake-timeout", "5"
        ) as decode,
    ):
        _otel_env(monkeypatch, receiver)
        with start_frontend("--prefill-worker", prefill.url, "--decode-worker", decode.url) as frontend:
            answer = _chat(frontend, {"traceparent": TRACEPARENT})
            assert answer.status_code == 200, answer.text

            def engine_span_arrived() -> bool:
                return any(s.name == "engine" for s in receiver.snapshot())

            wait_until(engine_span_arrived, "the engine span reached the OTLP receiver", timeout=20)
        (engine,) = [s for s in receiver.snapshot() if s.name == "engine"]
        assert engine.trace_id.hex() == TRACE_ID
        for leg in (prefill, decode):
            (sent,) = _trace_headers_seen(leg)
            assert sent["traceparent"] == f"00-{TRACE_ID}-{engine.span_id.hex()}-01"


def test_tracing_off_sends_nothing_and_passes_the_clients_trace_context_through(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver, worker: Server
) -> None:
    _otel_env(monkeypatch, receiver)
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    seen_before = len(_trace_headers_seen(worker))
    frontend = start_frontend("--engine", "sglang", "--worker", worker.url)
    try:
        answer = _chat(frontend, {"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
        assert answer.status_code == 200
        assert _chat(frontend, {}).status_code == 200
    finally:
        log = frontend.stop()  # a live exporter would flush at shutdown: the receiver would see it
    assert receiver.snapshot() == [], log
    # passed through unchanged (SGLang's gateway does the same); a request without one sends none
    expected = [{"traceparent": TRACEPARENT, "tracestate": TRACESTATE}]
    assert _trace_headers_seen(worker)[seen_before:] == expected


def test_without_otel_variables_the_sdk_is_never_imported() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import sys, threading\n"
        "from deepseek_frontend._tracing import tracer_from_env\n"
        "import deepseek_frontend.server.app\n"
        "assert tracer_from_env() is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
        "print(sorted(t.name for t in threading.enumerate() if 'Otel' in t.name or 'Batch' in t.name))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "[]"]


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ],
)
def test_a_configuration_that_cannot_be_met_is_refused_naming_the_variable(
    env: dict[str, str], variable: str
) -> None:
    with pytest.raises(RuntimeError, match=variable):
        tracer_from_env(env)


def test_serve_refuses_to_start_with_tracing_it_cannot_do() -> None:
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    cmd = [sys.executable, "-m", "deepseek_frontend", "serve", "--port", "0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='grpc': only 'http/protobuf' is supported" in out.stderr


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
        # only the metrics or logs signal configured: no traces
        ({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://collector:4318"}, False),
    ],
)
def test_which_variables_turn_tracing_on(env: dict[str, str], on: bool) -> None:
    assert tracing_configured(env) is on
