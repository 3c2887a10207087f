"""What OpenTelemetry tracing costs per request (src/deepseek_frontend/_tracing.py).

Usage::

    python benchmarks/bench_tracing.py                  # 5 rounds of 400 requests per setup
    python benchmarks/bench_tracing.py --requests 2000 --rounds 7

The real app (``create_app``) over the in-process simulated engine (no delays), driven through
httpx's ASGI transport one request at a time (a chat completion of 16 tokens, streamed), in three
setups taken in turn each round:

* **off**: no ``OTEL_*`` variable (no tracer, nothing imported);
* **off + traceparent**: tracing off, the client sends a ``traceparent`` (passed through to the engine);
* **on, nothing exported**: the SDK's spans made and batched, then dropped (a no-op exporter): what
  making the spans costs, without the exporter's encoding;
* **on**: the OTLP/HTTP exporter of the ``otel`` extra, batching to a receiver in another process
  that discards what it gets (``OTEL_BSP_SCHEDULE_DELAY`` 200 ms), the client's ``traceparent`` continued.

Output: median over rounds of microseconds per request, and the difference to **off**.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _discard(port_out: Any) -> None:
    """An OTLP/HTTP receiver that reads and drops every export (run in its own process)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port_out.put(server.server_address[1])
    server.serve_forever()


async def per_request_us(app: Any, requests: int, headers: dict[str, str]) -> float:
    import httpx

    body = {
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": "Say something about the sea."}],
        "max_tokens": 16,
        "stream": True,
    }
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for _ in range(20):  # warm-up
            (await client.post("/v1/chat/completions", json=body, headers=headers)).raise_for_status()
        started = time.perf_counter()
        for _ in range(requests):
            r = await client.post("/v1/chat/completions", json=body, headers=headers)
            assert r.status_code == 200
        return (time.perf_counter() - started) / requests * 1e6


def _dropping_tracer() -> Any:
    """A tracer whose spans are batched as the real one's, then dropped."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from deepseek_frontend._tracing import Tracer

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping()))
    return Tracer(provider)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from deepseek_frontend._tracing import tracer_from_env
    from deepseek_frontend.engines.config import EngineConfig
    from deepseek_frontend.engines.sim.engine import SimulatedEngine
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
    from deepseek_frontend.server.app import create_app
    from deepseek_frontend.tokenization import PromptTokenizer

    ports: Any = multiprocessing.Queue()
    receiver = multiprocessing.Process(target=_discard, args=(ports,), daemon=True)
    receiver.start()
    port = ports.get(timeout=30)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
    }
    os.environ.update(env)  # the exporter reads its endpoint from the environment

    tokenizer = PromptTokenizer.load()
    config = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash"), engine=EngineConfig(kind="sim"))
    app = create_app(config, tokenizer=tokenizer, backend=SimulatedEngine(tokenizer))
    state = app.state.frontend
    tracer = tracer_from_env(env)
    assert tracer is not None
    setups: list[tuple[str, Any, dict[str, str]]] = [
        ("off", None, {}),
        ("off + traceparent", None, {"traceparent": TRACEPARENT}),
        ("on, nothing exported", _dropping_tracer(), {"traceparent": TRACEPARENT}),
        ("on", tracer, {"traceparent": TRACEPARENT}),
    ]
    results: dict[str, list[float]] = {name: [] for name, _, _ in setups}
    for _ in range(args.rounds):
        for name, t, headers in setups:
            state.tracer = t
            results[name].append(asyncio.run(per_request_us(app, args.requests, headers)))
    tracer.shutdown()
    receiver.terminate()
    base = statistics.median(results["off"])
    print(f"{'setup':<20} {'us/request':>12} {'vs off':>10}")
    for name, samples in results.items():
        med = statistics.median(samples)
        print(f"{name:<20} {med:>12.0f} {med - base:>+10.0f}")


if __name__ == "__main__":
    main()
