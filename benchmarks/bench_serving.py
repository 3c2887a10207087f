"""The frontend's own serving cost, with the simulated engine at zero delay.

Usage::

    python benchmarks/bench_serving.py                    # full table: 1/64/256 streams x 1/4 tokens/chunk
    python benchmarks/bench_serving.py --quick            # smaller runs
    python benchmarks/bench_serving.py --concurrency 256 --tokens-per-chunk 1

What runs: for each tokens-per-chunk setting the script starts one frontend process
(``python bench_serving.py --serve ...``: the normal app with the built-in simulated
engine at zero delay, plus two timestamps per chunk) and drives it from this process with
raw asyncio HTTP/1.1 clients (no SSE parsing on the client side, so the load generator
stays cheap). Each stream asks for thinking off, ``max_tokens`` = the stream length and
``stream_options.include_usage``; the usage chunk gives the token count.

Metrics (definitions):

* **tokens/s** -- completion tokens of all streams / wall time from the first request sent
  to the last stream closed.
* **tokens per CPU-second** -- the same tokens / CPU time the frontend process used during
  the run (user + system, from /proc). On a machine shared with other work this is the
  figure that says what one dedicated core sustains; wall-clock tokens/s depends on how
  much CPU the process was given.
* **added latency per chunk** -- measured in a second run of the same load (timestamps
  cost a few percent, so the throughput run goes without): for each engine chunk, the
  time from the engine handing it to the frontend (the simulated engine's async iterator
  yielding) to the frontend handing the chunk's SSE bytes to the HTTP server (the ASGI
  ``send`` of that body part):
  detokenize + parse + stop strings + serialise + event-loop queueing behind other
  streams. p50 / p99 over all chunks of the run except each stream's first.
* **first chunk** -- the same for each stream's first engine chunk, which the frontend
  awaits before it commits the HTTP status (so a worker failing before the first token is
  still an error status); its latency also covers building the response and waiting for
  the event loop while the other streams start: time-to-first-token overhead.
* **TTFT overhead, 100K-token prompt** -- in-process: ``orjson.loads`` of the request
  body + request mapping + ``ChatPipeline.prepare`` (render + tokenize + checks) for a
  conversation of about 100K tokens that extends one already served (the tokenizer's
  prefix and run caches hold the earlier turns). Median of 20 requests; "cold" empties
  both caches first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

#: completion tokens per stream at each concurrency (total work ~ comparable across rows)
STREAM_TOKENS = {1: 20_000, 64: 1_000, 256: 400}
QUICK_STREAM_TOKENS = {1: 4_000, 64: 300, 256: 100}
#: chunk samples kept by the server per run (bounded memory)
MAX_SAMPLES = 2_000_000
_USAGE = re.compile(rb'"completion_tokens":(\d+)')


# --------------------------------------------------------------------------- instrumented server


def serve(port_file: str, tokens_per_chunk: int) -> None:
    """Run the frontend with the in-process sim engine and chunk timestamps (``--serve`` mode)."""
    import orjson
    import uvicorn
    from starlette.responses import Response
    from starlette.routing import Route

    from deepseek_frontend.api.app import create_app
    from deepseek_frontend.api.config import ServerConfig
    from deepseek_frontend.engines.sim.engine import SimulatedEngine
    from deepseek_frontend.tokenization import PromptTokenizer

    tokenizer = PromptTokenizer.load()
    engine = SimulatedEngine(tokenizer, tokens_per_chunk=tokens_per_chunk)
    engine_times: dict[str, list[float]] = defaultdict(list)
    send_times: dict[str, list[float]] = defaultdict(list)
    clock = time.perf_counter
    # Stamping costs a few percent per chunk, so throughput runs switch it off (POST /bench/stamp).
    stamping = {"on": False}

    async def stamped_chunks(request: Any) -> Any:
        stamps = engine_times[request.request_id]
        async for chunk in engine.generate(request):
            stamps.append(clock())
            yield chunk

    class StampedEngine:
        """The sim engine, stamping the moment each chunk is handed to the frontend."""

        name = "sim"
        stats = engine.stats

        def generate(self, request: Any) -> Any:
            return stamped_chunks(request) if stamping["on"] else engine.generate(request)

    config = ServerConfig(served_model_name="deepseek-v4-flash", engine="sim")
    app = create_app(config, tokenizer=tokenizer, backend=StampedEngine())

    async def latency(_: Any) -> Response:
        added: list[float] = []
        first: list[float] = []
        for rid, sends in send_times.items():
            stamps = engine_times.get(rid, [])
            # body parts: role chunk, one per engine chunk, then usage and [DONE] (maybe joined)
            pairs = list(zip(stamps, sends[1:], strict=False))
            if pairs:
                # The first engine chunk is awaited before the response starts (so a failure can
                # still be an error status): its wait is time-to-first-token overhead, kept apart.
                first.append(pairs[0][1] - pairs[0][0])
                added.extend(send_t - engine_t for engine_t, send_t in pairs[1:])
        engine_times.clear()
        send_times.clear()
        return Response(orjson.dumps({"added": added[:MAX_SAMPLES], "first": first}))

    async def set_stamping(request: Any) -> Response:
        stamping["on"] = bool(orjson.loads(await request.body())["on"])
        return Response(b"{}")

    app.router.routes.append(Route("/bench/latency", latency, methods=["POST"]))
    app.router.routes.append(Route("/bench/stamp", set_stamping, methods=["POST"]))

    async def stamped(scope: Any, receive: Any, send: Any) -> None:
        if not stamping["on"] or scope["type"] != "http" or scope["path"] != "/v1/chat/completions":
            await app(scope, receive, send)
            return
        sends: list[float] | None = None

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal sends
            if message["type"] == "http.response.start":
                for k, v in message["headers"]:
                    if k == b"x-request-id":
                        sends = send_times[v.decode()]
            elif sends is not None and message.get("body"):
                sends.append(clock())
            await send(message)

        await app(scope, receive, send_wrapper)

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    Path(port_file).write_text(str(sock.getsockname()[1]))
    server = uvicorn.Server(
        uvicorn.Config(
            stamped, loop="auto", http="auto", access_log=False, log_level="warning", lifespan="on"
        )
    )
    profile_path = os.environ.get("BENCH_PROFILE")
    if profile_path:
        import cProfile
        import signal

        profiler = cProfile.Profile(time.process_time)  # CPU time, not wall time (shared machines)

        def dump(*_: Any) -> None:
            profiler.disable()
            profiler.dump_stats(profile_path)
            os._exit(0)

        signal.signal(signal.SIGTERM, dump)
        profiler.enable()
    server.run(sockets=[sock])


# --------------------------------------------------------------------------- load generator


async def one_stream(port: int, tokens: int, index: int) -> int:
    body = json.dumps(
        {
            "model": "deepseek-v4-flash",
            "messages": [{"role": "user", "content": f"write {tokens * 2} words {index % 7}"}],
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "thinking": {"type": "disabled"},
        }
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    tail = b""
    while True:
        data = await reader.read(1 << 16)
        if not data:
            break
        tail = (tail + data)[-4096:]
    writer.close()
    match = _USAGE.search(tail)
    if match is None or b"[DONE]" not in tail:
        raise RuntimeError(f"stream {index} did not complete: {tail[-300:]!r}")
    return int(match.group(1))


async def run_load(port: int, concurrency: int, tokens: int) -> tuple[int, float]:
    await one_stream(port, 50, 0)  # warm-up (plans cached, connections primed)
    started = time.perf_counter()
    counts = await asyncio.gather(*(one_stream(port, tokens, i) for i in range(concurrency)))
    return sum(counts), time.perf_counter() - started


def fetch_latency(port: int) -> tuple[list[float], list[float]]:
    """(added latency of every chunk but each stream's first, first-chunk latencies)."""
    import httpx

    data = httpx.post(f"http://127.0.0.1:{port}/bench/latency", timeout=60).json()
    return data["added"], data["first"]


def set_stamping(port: int, on: bool) -> None:
    import httpx

    httpx.post(f"http://127.0.0.1:{port}/bench/stamp", json={"on": on}, timeout=10).raise_for_status()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_server(tokens_per_chunk: int) -> tuple[subprocess.Popen[bytes], int]:
    port_file = Path(f"/tmp/bench_serving_{os.getpid()}_{tokens_per_chunk}.port")
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port_file), "--tokens-per-chunk", str(tokens_per_chunk)]
    )
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("benchmark server did not start")
        time.sleep(0.05)
    port = int(port_file.read_text())
    import httpx

    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    port_file.unlink(missing_ok=True)
    return proc, port


# --------------------------------------------------------------------------- TTFT overhead


def ttft_overhead(target_tokens: int = 100_000, repeats: int = 20) -> tuple[int, float, float]:
    """(prompt tokens, median ms cold-extension, median ms first-time whole prompt)."""
    import orjson

    from deepseek_frontend.api.app import create_app
    from deepseek_frontend.api.config import ServerConfig
    from deepseek_frontend.api.openai.chat import to_chat_request
    from deepseek_frontend.engines.sim.engine import SimulatedEngine
    from deepseek_frontend.tokenization import PromptTokenizer

    tokenizer = PromptTokenizer.load()
    config = ServerConfig(served_model_name="deepseek-v4-flash", engine="sim")
    app = create_app(config, tokenizer=tokenizer, backend=SimulatedEngine(tokenizer))
    pipeline = app.state.frontend.pipeline
    paragraph = (
        "The frontend renders the conversation, tokenizes it with cached runs, and streams token ids "
        "to the engine workers, which answer with ids that are detokenized and parsed. "
    )
    messages: list[dict[str, Any]] = []
    turn = 0
    while True:
        messages.append({"role": "user", "content": f"Turn {turn}. " + paragraph * 40})
        messages.append({"role": "assistant", "content": f"Answer {turn}. " + paragraph * 40})
        turn += 1
        prepared = pipeline.prepare(to_chat_request({"messages": messages}, config, "bench"))
        if prepared.prompt_tokens >= target_tokens:
            break
    timings = []
    first = []
    for i in range(repeats):
        messages = [*messages, {"role": "user", "content": f"Follow-up question {i}?"}]
        body = orjson.dumps({"model": "deepseek-v4-flash", "messages": messages, "stream": True})
        t0 = time.perf_counter()
        req = to_chat_request(orjson.loads(body), config, f"bench-{i}")
        prepared = pipeline.prepare(req)
        timings.append(time.perf_counter() - t0)
        messages.append({"role": "assistant", "content": f"Reply {i}."})
    for i in range(3):
        tokenizer.cache.clear()
        tokenizer.prefix_cache.clear()
        t0 = time.perf_counter()
        pipeline.prepare(to_chat_request({"messages": messages}, config, f"cold-{i}"))
        first.append(time.perf_counter() - t0)
    return prepared.prompt_tokens, statistics.median(timings) * 1000, statistics.median(first) * 1000


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--tokens-per-chunk", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 64, 256])
    parser.add_argument("--quick", action="store_true", help="shorter streams")
    parser.add_argument("--skip-ttft", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.tokens_per_chunk[0])
        return 0

    lengths = QUICK_STREAM_TOKENS if args.quick else STREAM_TOKENS
    print(
        "| tokens/chunk | streams | tokens | seconds | tokens/s | server CPU s | tokens per CPU-second "
        "| added p50 (ms) | added p99 (ms) | first chunk p50 (ms) | first chunk p99 (ms) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tpc in args.tokens_per_chunk:
        proc, port = start_server(tpc)
        try:
            for conc in args.concurrency:
                tokens = lengths.get(conc, max(100, 100_000 // conc))
                # throughput run: no instrumentation
                set_stamping(port, False)
                cpu_before = cpu_seconds(proc.pid)
                total, seconds = asyncio.run(run_load(port, conc, tokens))
                cpu = cpu_seconds(proc.pid) - cpu_before
                # latency run: the same load with per-chunk timestamps
                set_stamping(port, True)
                fetch_latency(port)
                asyncio.run(run_load(port, conc, tokens))
                added, first = fetch_latency(port)
                print(
                    f"| {tpc} | {conc} | {total} | {seconds:.2f} | {total / seconds:,.0f} | {cpu:.2f} | "
                    f"{total / max(cpu, 1e-9):,.0f} | "
                    f"{percentile(added, 0.5) * 1000:.3f} | {percentile(added, 0.99) * 1000:.3f} | "
                    f"{percentile(first, 0.5) * 1000:.2f} | {percentile(first, 0.99) * 1000:.2f} |",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    if not args.skip_ttft:
        tokens, warm_ms, cold_ms = ttft_overhead()
        print()
        print(
            "| prompt tokens | TTFT overhead, extends a cached conversation (ms) "
            "| same prompt, cold cache (ms) |"
        )
        print("|---:|---:|---:|")
        print(f"| {tokens:,} | {warm_ms:.2f} | {cold_ms:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
