"""The frontend's own serving cost, with the simulated engine, at 1 to 1,024 concurrent streams.

Usage::

    python benchmarks/bench_serving.py                    # 1/64/256/1024 streams x 1/4 tokens/chunk
    python benchmarks/bench_serving.py --quick            # smaller runs
    python benchmarks/bench_serving.py --concurrency 256 --tokens-per-chunk 1
    python benchmarks/bench_serving.py --workers 1 2 --bare               # + serve --workers N, ASGI ceiling
    python benchmarks/bench_serving.py --ttft-ms 20 --itl-ms 10 --tokens 128 # the 20 ms / 10 ms timings
    python benchmarks/bench_serving.py --compare --dynamo-venv /work/.venv-dynamo  # next to Dynamo 1.6.1
    python benchmarks/bench_serving.py --compare --dynamo-venv V --mode unique --concurrency 1024
    python benchmarks/bench_serving.py --compare http://127.0.0.1:9000 --compare-pid PID --repeats 3
    python benchmarks/bench_serving.py --burst 256                        # cached-prefix TTFT in a burst
    python benchmarks/bench_serving.py --guard --guard-report guard.md    # CI's cost guard (_guard.py)

What runs: for each tokens-per-chunk setting, mode and concurrency, the targets of a row run back
to back, ``--repeats`` times (A B C A B C ...: interleaved, so that a shared machine's load hits
them alike; compare ratios within one run, not across runs):

* ``ours (1 process, stamped)`` -- this script's ``--serve`` process: the normal app with the
  built-in simulated engine (``--ttft-ms``/``--itl-ms``, default zero delay) plus two timestamps
  per chunk, for the added-latency columns;
* ``ours, serve --workers N`` (``--workers N ...``) -- ``deepseek-frontend serve --workers N``
  exactly as deployed, in-process simulated engine (one per process); CPU time summed over the
  supervisor and its processes;
* ``bare ASGI ceiling`` (``--bare``) -- uvicorn + uvloop + httptools streaming the same number of
  chunks of the same size with no frontend work: the floor of any Python ASGI frontend's cost;
* ``compare`` -- another OpenAI-compatible frontend, same requests. ``--compare URL``: one already
  running (``--compare-model`` names its model; ``--compare-pid`` / ``--compare-engine-pid`` let its
  frontend's and its engine's CPU time be counted). ``--compare`` alone with ``--dynamo-venv PATH``:
  NVIDIA Dynamo 1.6.1's frontend in front of its mocker, started by this script from that virtualenv
  with the same engine timings (``_dynamo.py`` says exactly what it starts).

``--compare`` measures real traffic unless told otherwise: modes ``unique`` and ``agentic``, 150
completion tokens per request, 20 ms to the first token and 10 ms per token, 256 and 1,024 streams,
``serve --workers 1`` and ``--workers 2``, 2 repeats, 1 token per engine chunk. Every stream of a
row starts at once; a stream sends its requests one after another (a closed loop, no think time).
The modes (``--mode``, several allowed):

* ``short`` (the default without ``--compare``) -- one request per stream, a prompt of a few
  tokens (``write N words i``, 7 distinct prompts): the per-token streaming cost alone;
* ``unique`` -- one request per stream whose user message is ``--prompt-words`` (default 1,000:
  about 1,000 tokens) ordinary English words drawn at random after a salt: every prompt of every
  run is new to the frontend's caches, so each is rendered and tokenized cold;
* ``agentic`` -- ``--agent-turns`` (default 4) requests per stream on one keep-alive connection: a
  coding agent's conversation (a system prompt and 12 tools shared by every stream, then the
  stream's own task, assistant tool calls and their results: code and command output), resent
  whole every turn with the new calls and results appended, growing from ``--agent-min-chars`` to
  ``--agent-max-chars`` of JSON (default 70,000 to 100,000: about 21K to 30K prompt tokens). Each
  stream's first request is cold past the shared system prompt and tools; its follow-ups extend
  the conversation the frontend saw the turn before (as ``bench_fleet.py``'s agents do).

Every request asks for thinking off (``thinking: {type: disabled}`` and
``chat_template_kwargs.thinking: false``, which Dynamo's, vLLM's and SGLang's DeepSeek templates
read), ``max_tokens``, ``ignore_eos`` and ``stream_options.include_usage``; the usage chunk gives
the token counts. Before each run a few streams' first requests warm the target up (not counted).

The load generator is this process: raw uvloop ``asyncio.Protocol`` HTTP/1.1 clients, one connection
per stream (per request outside the agentic mode), no SSE parsing (only the tail of the body is kept
for the usage chunk), so it stays cheap next to what it measures; its own CPU time is a column.

Metrics (definitions):

* **tokens/s** -- completion tokens of all streams / wall time from the first request sent to the
  last stream closed.
* **requests**, **prompt tokens** -- requests of the run, and their mean prompt tokens as each
  server's usage chunk counts them.
* **frontend CPU s**, **engine CPU s**, **CPU s per 1000 tokens** -- user + system CPU time the
  frontend process(es) used during the throughput run (/proc; for ``serve`` the supervisor and every
  process, the in-process simulated engine included), that of a separate engine process (Dynamo's
  mocker; ``-`` when the engine is in process), and both together per 1,000 completion tokens: on a
  machine shared with other work this, not wall-clock tokens/s, says what a dedicated core sustains.
* **frontend CPU split s** -- the frontend CPU seconds of each of its processes that used any
  (``serve --workers 2``: the supervisor's share, if any, then each process): how evenly the
  kernel's ``SO_REUSEPORT`` hashing spread the connections' work.
* **load generator CPU s**, **% of machine** -- this process's CPU time over the run, and that over
  the run's wall time x the machine's cores: on a 2-core machine the client competes with the server.
* **other CPU s** -- the whole machine's busy CPU time over the run (/proc/stat) less that of every
  process of this benchmark (the measured target, the idle ones, the load generator): other jobs
  sharing the cores, a measure of the noise each row ran in.
* **added latency per chunk** (stamped target only) -- measured in a second run of the same load
  (timestamps cost a few percent, so the throughput run goes without): for each engine chunk, the
  time from the engine handing it to the frontend (the simulated engine's async iterator yielding)
  to the frontend handing the chunk's SSE bytes to the HTTP server (the ASGI ``send`` of that body
  part): detokenize + parse + serialise + event-loop queueing behind other streams. p50 / p99 over
  all chunks of the run except each stream's first.
* **first chunk** -- client side, every target: from the connection being made (request written)
  to the first body bytes of the stream (the frontend sends its headers with the first engine
  chunk). With a zero-delay engine this is the frontend's time to first token, including waiting
  for the event loop while the other streams of the row start; with ``--ttft-ms`` it includes that.
* **burst** (``--burst N``) -- against ``serve`` with a separate ``sim-engine`` process: one
  conversation of ~60K characters is served once (its prefix is then in the tokenizer's caches),
  then N requests with unique prompts (``--burst-words`` ordinary words) and ``--burst-probes``
  follow-ups of that conversation are sent at the same instant; first-chunk p50 / p99 / max of the
  follow-ups and of the cold requests. ``--burst 0``: the follow-ups alone. With ``--bare``, the
  same burst against the bare-ASGI server, interleaved round by round: uvicorn's own floor.
* **TTFT overhead, 100K-token prompt** -- in-process: ``orjson.loads`` of the request
  body + request mapping + ``ChatPipeline.prepare`` (render + tokenize + checks) for a
  conversation of about 100K tokens that extends one already served (the tokenizer's
  prefix and run caches hold the earlier turns). Median of 20 requests; "cold" empties
  both caches first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _conversations import SALT, conversation_bodies, unique_prompt_body
from _streams import KeepAliveStream, StreamClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

#: completion tokens per stream at each concurrency (total work ~ comparable across rows)
STREAM_TOKENS = {1: 20_000, 64: 1_000, 256: 400, 1024: 100}
QUICK_STREAM_TOKENS = {1: 4_000, 64: 300, 256: 100, 1024: 50}
#: chunk samples kept by the server per run (bounded memory)
MAX_SAMPLES = 2_000_000


# --------------------------------------------------------------------------- instrumented server


def serve(port_file: str, tokens_per_chunk: int, ttft_ms: float = 0.0, itl_ms: float = 0.0) -> None:
    """Run the frontend with the in-process sim engine and chunk timestamps (``--serve`` mode)."""
    import orjson
    import uvicorn
    from starlette.responses import Response
    from starlette.routing import Route

    from deepseek_frontend.engines.base import Engine
    from deepseek_frontend.engines.config import EngineConfig
    from deepseek_frontend.engines.sim.engine import SimulatedEngine
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
    from deepseek_frontend.server.app import create_app
    from deepseek_frontend.tokenization import PromptTokenizer

    tokenizer = PromptTokenizer.load()
    engine = SimulatedEngine(tokenizer, tokens_per_chunk=tokens_per_chunk, ttft_ms=ttft_ms, itl_ms=itl_ms)
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

    class StampedEngine(Engine):
        """The sim engine, stamping the moment each chunk is handed to the frontend (it reports no
        capabilities, so requests are checked against the frontend's own settings)."""

        name = "sim"

        def generate(self, request: Any) -> Any:
            return stamped_chunks(request) if stamping["on"] else engine.generate(request)

        def supports_constraint(self, kind: Any) -> bool:
            return engine.supports_constraint(kind)

        def capabilities(self) -> Any:
            return None

        def statuses(self) -> Any:
            return engine.statuses()

        async def start(self) -> None:
            await engine.start()

        async def aclose(self) -> None:
            await engine.aclose()

    config = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash"), engine=EngineConfig(kind="sim"))
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
    import gc

    gc.set_threshold(10_000, 20, 10)  # as `serve` sets it (api/serve_command.py)
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


# --------------------------------------------------------------------------- bare ASGI ceiling


def serve_bare(port_file: str, tokens_per_chunk: int) -> None:
    """The bare-ASGI ceiling (``--serve-bare``): uvicorn + uvloop + httptools streaming chunks of the
    same size and count as the frontend's, with no frontend work at all (reads the body, answers
    ``max_tokens`` / ``tokens_per_chunk`` pre-built chat chunks, one ``send`` each, yielding to
    the loop between chunks like the zero-delay engine). What any Python ASGI frontend could reach."""
    import orjson
    import uvicorn

    chunk = (
        b'data: {"id":"chatcmpl-0123456789abcdef0123456789abcdef","object":"chat.completion.chunk",'
        b'"created":1700000000,"model":"deepseek-v4-flash","choices":[{"index":0,"delta":'
        b'{"content":" word"},"logprobs":null,"finish_reason":null}]}\n\n'
    )

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        tokens = int(orjson.loads(body).get("max_tokens", 16))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for _ in range(0, tokens, tokens_per_chunk):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await asyncio.sleep(0)
        usage = b'data: {"usage":{"completion_tokens":%d}}\n\ndata: [DONE]\n\n' % tokens
        await send({"type": "http.response.body", "body": usage, "more_body": False})

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    Path(port_file).write_text(str(sock.getsockname()[1]))
    uvicorn.Server(
        uvicorn.Config(app, loop="auto", http="auto", access_log=False, log_level="warning", lifespan="on")
    ).run(sockets=[sock])


# --------------------------------------------------------------------------- load generator


@dataclass(frozen=True)
class Target:
    """A frontend to drive: where, which model name, and which processes' CPU time to count."""

    label: str
    host: str
    port: int
    model: str = "deepseek-v4-flash"
    #: the frontend's processes (their descendants are counted too)
    pids: tuple[int, ...] = ()
    #: a separate engine's processes (Dynamo's mocker), counted apart
    engine_pids: tuple[int, ...] = ()
    #: supports /bench/latency (the instrumented server of this script)
    stamped: bool = False
    path: str = "/v1/chat/completions"

    def post(self, body: bytes, keep_alive: bool = False) -> bytes:
        """``body`` as one HTTP/1.1 POST to :attr:`path`; on a connection the server closes after,
        unless ``keep_alive``."""
        return (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n".encode()
            + b"Content-Type: application/json\r\nConnection: "
            + (b"keep-alive" if keep_alive else b"close")
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )


#: what every request asks besides its own fields: thinking off as Dynamo's, vLLM's and SGLang's
#: DeepSeek chat templates read it (this frontend reads ``thinking``, which the bodies carry too)
EXTRA_FIELDS: dict[str, object] = {"chat_template_kwargs": {"thinking": False}}


@dataclass(frozen=True)
class Workload:
    """What the streams of a row send: per stream, its requests' body templates in order
    (placeholders ``@MODEL@`` and :data:`_conversations.SALT`, filled per run and stream)."""

    mode: str
    streams: tuple[tuple[bytes, ...], ...]
    #: one keep-alive connection per stream for all its requests (agentic), else one per request
    keep_alive: bool = False

    def prefix(self, count: int, turns: int | None = None) -> Workload:
        """The first ``count`` streams, each cut to its first ``turns`` requests."""
        streams = tuple(stream[:turns] for stream in self.streams[:count])
        return Workload(self.mode, streams, self.keep_alive)


def build_workload(mode: str, concurrency: int, tokens: int, args: argparse.Namespace) -> Workload:
    """``mode``: ``short`` (one request per stream, a prompt of a few tokens, the same few
    prompts for every stream), ``unique`` (one request per stream, ``--prompt-words`` new words),
    ``agentic`` (``--agent-turns`` requests per stream, a coding agent's conversation resent whole
    every turn, growing from ``--agent-min-chars`` to ``--agent-max-chars`` of JSON)."""
    if mode == "short":
        streams = tuple((_short_body(tokens, i),) for i in range(concurrency))
        return Workload(mode, streams)
    if mode == "unique":
        streams = tuple(
            (unique_prompt_body(i, args.prompt_words, tokens, EXTRA_FIELDS),) for i in range(concurrency)
        )
        return Workload(mode, streams)
    if mode == "agentic":
        streams = tuple(
            tuple(
                conversation_bodies(
                    i, args.agent_turns, args.agent_min_chars, args.agent_max_chars, tokens, EXTRA_FIELDS
                )
            )
            for i in range(concurrency)
        )
        return Workload(mode, streams, keep_alive=True)
    raise ValueError(f"unknown mode {mode!r}")


def _short_body(tokens: int, index: int) -> bytes:
    body = {
        "model": "@MODEL@",
        "messages": [{"role": "user", "content": f"write {tokens * 2} words {index % 7}"}],
        "max_tokens": tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "thinking": {"type": "disabled"},
        **EXTRA_FIELDS,
        # servers that honour these produce exactly max_tokens (vLLM, SGLang, this frontend)
        "ignore_eos": True,
    }
    return json.dumps(body).encode()


@dataclass
class LoadResult:
    """One run of a workload: per request its completion tokens, first-chunk seconds and prompt
    tokens, and the wall time from the first request sent to the last stream ended."""

    seconds: float
    completions: list[int]
    firsts: list[float]
    prompts: list[int]


async def run_load(target: Target, workload: Workload, salt: str) -> LoadResult:
    """Every stream of ``workload`` at once, each sending its requests one after another (a
    closed loop: the next when the last has ended). ``salt``: 10 characters, new per run."""
    loop = asyncio.get_running_loop()
    model = target.model.encode()

    async def stream(index: int, templates: tuple[bytes, ...]) -> list[tuple[int, float, int]]:
        own_salt = f"{salt[:10]}{index:06d}".encode()
        assert len(own_salt) == len(SALT)
        out: list[tuple[int, float, int]] = []
        conn: KeepAliveStream | None = None
        if workload.keep_alive:
            _, conn = await loop.create_connection(KeepAliveStream, target.host, target.port)
        try:
            for template in templates:
                body = template.replace(SALT, own_salt).replace(b"@MODEL@", model)
                request = target.post(body, keep_alive=conn is not None)
                if conn is not None:
                    first, tail = await conn.send(request)
                    completion = _COMPLETION.findall(tail)
                    if not completion:
                        raise RuntimeError(f"{target.label}: a stream without usage: {tail[-300:]!r}")
                    prompt = _PROMPT.findall(tail)
                    out.append((int(completion[-1]), first, int(prompt[-1]) if prompt else 0))
                else:
                    done: asyncio.Future[tuple[int, float]] = loop.create_future()
                    client = StreamClient(request, done)
                    await loop.create_connection(lambda c=client: c, target.host, target.port)
                    completion_tokens, first = await done
                    out.append((completion_tokens, first, client.prompt_tokens))
        finally:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
        return out

    started = time.perf_counter()
    per_stream = await asyncio.gather(*(stream(i, t) for i, t in enumerate(workload.streams)))
    seconds = time.perf_counter() - started
    requests = [r for results in per_stream for r in results]
    return LoadResult(seconds, [r[0] for r in requests], [r[1] for r in requests], [r[2] for r in requests])


_COMPLETION = re.compile(rb'"completion_tokens":(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens":(\d+)')


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
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> tuple[int, ...]:
    """``pid`` and its descendants (Linux /proc children lists)."""
    out = [pid]
    for p in out:
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                out.extend(int(c) for c in (task / "children").read_text().split())
    return tuple(dict.fromkeys(out))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _wait_healthy(proc: subprocess.Popen[bytes], port: int) -> None:
    import httpx

    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("benchmark server did not start")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)


def start_server(
    tokens_per_chunk: int, ttft_ms: float = 0.0, itl_ms: float = 0.0, bare: bool = False
) -> tuple[subprocess.Popen[bytes], int]:
    """This script's instrumented server (or the bare-ASGI one) on a free port."""
    port_file = Path(f"/tmp/bench_serving_{os.getpid()}_{tokens_per_chunk}.port")
    port_file.unlink(missing_ok=True)
    mode = "--serve-bare" if bare else "--serve"
    proc = subprocess.Popen(
        [
            sys.executable, __file__, mode, str(port_file), "--tokens-per-chunk", str(tokens_per_chunk),
            "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
        ]
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("benchmark server did not start")
        time.sleep(0.05)
    port = int(port_file.read_text())
    port_file.unlink(missing_ok=True)
    _wait_healthy(proc, port)
    return proc, port


def start_serve_command(
    processes: int, tokens_per_chunk: int, ttft_ms: float, itl_ms: float, worker: str | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """``deepseek-frontend serve --workers N`` exactly as deployed (in-process sim engine, or the
    SGLang-protocol ``worker`` URL)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "deepseek_frontend", "serve", "--port", str(port),
            "--workers", str(processes),
            "--sim-tokens-per-chunk", str(tokens_per_chunk), "--sim-ttft-ms", str(ttft_ms),
            "--sim-itl-ms", str(itl_ms), "--log-level", "warning",
            # the load is the point here: no admission queueing in front of 1,024 streams
            "--max-concurrent-requests", "100000",
            # no stored responses here: the load does not store, and the user's state store is left alone
            "--state-store", "none",
            *(["--worker", worker] if worker else []),
        ],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _wait_healthy(proc, port)
    return proc, port


def machine_busy_seconds() -> float:
    """CPU seconds all of this machine's cores have spent not idle since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """User + system CPU time of this process: the load generator."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(target: Target, workload: Workload, idle: tuple[Target, ...] = ()) -> dict[str, Any]:
    """One row: a throughput run (no stamps), then, for a stamped target, a latency run.

    Besides the load's own figures: the CPU seconds of the target's processes (each process of
    the tree apart, for the split), of its separate engine, of this process (the load
    generator), and of the whole machine over the run; what none of them nor the ``idle``
    targets' processes used is other jobs'."""
    pids = process_tree(target.pids[0]) if target.pids else ()
    engine_pids = process_tree(target.engine_pids[0]) if target.engine_pids else ()
    idle_roots = [root for t in idle for root in (*t.pids[:1], *t.engine_pids[:1])]
    idle_pids = tuple(p for root in idle_roots for p in process_tree(root))
    if target.stamped:
        set_stamping(target.port, False)
    # warm-up: a few streams' first requests (connections, the simulated engine's memoised plans,
    # the shared system prompt and tools of the agentic mode), with a salt of their own
    _run(run_load(target, workload.prefix(7, 1), os.urandom(5).hex()))
    before = {p: cpu_seconds(p) for p in (*pids, *engine_pids, *idle_pids)}
    client_before, machine_before = own_cpu_seconds(), machine_busy_seconds()
    load = _run(run_load(target, workload, os.urandom(5).hex()))
    client_cpu = own_cpu_seconds() - client_before
    machine_cpu = machine_busy_seconds() - machine_before
    used = {p: cpu_seconds(p) - before[p] for p in before}
    cpu = sum(used[p] for p in pids) if pids else float("nan")
    engine_cpu = sum(used[p] for p in engine_pids) if engine_pids else float("nan")
    added: list[float] = []
    if target.stamped:
        set_stamping(target.port, True)
        fetch_latency(target.port)
        _run(run_load(target, workload, os.urandom(5).hex()))
        added, _ = fetch_latency(target.port)
        set_stamping(target.port, False)
    return {
        "label": target.label, "mode": workload.mode, "streams": len(workload.streams), "load": load,
        "cpu": cpu, "engine_cpu": engine_cpu, "split": [used[p] for p in pids if used[p] >= 0.005],
        "client_cpu": client_cpu, "machine_cpu": machine_cpu, "added": added,
        "idle_cpu": sum(used[p] for p in idle_pids),
    }  # fmt: skip


def _run(coro: Any) -> Any:
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


HEADER = (
    "| frontend | mode | tokens/chunk | streams | requests | prompt tokens | tokens | seconds | tokens/s "
    "| first chunk p50 (ms) | first chunk p99 (ms) | frontend CPU s | engine CPU s "
    "| CPU s per 1000 tokens | frontend CPU split s | load generator CPU s | load generator % of machine "
    "| other CPU s | added p50 (ms) | added p99 (ms) |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
)


def row(tpc: int, r: dict[str, Any]) -> str:
    """One line of :data:`HEADER` (the docstring defines the columns)."""
    ms = 1000.0
    load: LoadResult = r["load"]
    tokens, cpu, engine_cpu = sum(load.completions), r["cpu"], r["engine_cpu"]
    nan = float("nan")
    served_cpu = (0.0 if cpu != cpu else cpu) + (0.0 if engine_cpu != engine_cpu else engine_cpu)
    per_1000 = served_cpu / max(tokens, 1) * 1000 if cpu == cpu else nan
    cells = [
        r["label"], r["mode"], str(tpc), str(r["streams"]), str(len(load.completions)),
        f"{statistics.fmean(load.prompts):,.0f}" if load.prompts else "-", str(tokens),
        f"{load.seconds:.2f}", f"{tokens / load.seconds:,.0f}",
        f"{percentile(load.firsts, 0.5) * ms:,.1f}", f"{percentile(load.firsts, 0.99) * ms:,.1f}",
        _num(cpu), _num(engine_cpu), _num(per_1000, 3),
        " + ".join(f"{c:.2f}" for c in r["split"]) if len(r["split"]) > 1 else "-",
        _num(r["client_cpu"]), f"{r['client_cpu'] / (load.seconds * (os.cpu_count() or 1)):.0%}",
        _num(r["machine_cpu"] - served_cpu - r["client_cpu"] - r["idle_cpu"]),
    ]  # fmt: skip
    added = r["added"]
    if added:
        cells += [f"{percentile(added, 0.5) * ms:.3f}", f"{percentile(added, 0.99) * ms:.3f}"]
    else:
        cells += ["-", "-"]
    return "| " + " | ".join(cells) + " |"


def _num(value: float, digits: int = 2) -> str:
    return "-" if value != value else f"{value:,.{digits}f}"


# --------------------------------------------------------------------------- burst


def _chat_request(target: Target, messages: list[dict[str, str]], tokens: int) -> bytes:
    body = json.dumps(
        {
            "model": target.model,
            "messages": messages,
            "max_tokens": tokens,
            "stream": True,
            "thinking": {"type": "disabled"},
        }
    ).encode()
    return target.post(body)


_WORDS = [
    "the",
    "engine",
    "streams",
    "tokens",
    "while",
    "the",
    "frontend",
    "renders",
    "prompts",
    "and",
    "parses",
    "tool",
    "calls",
    "from",
    "every",
    "chunk",
    "so",
    "that",
    "clients",
    "see",
    "reasoning",
    "text",
    "and",
    "structured",
    "calls",
    "arrive",
]


async def run_burst(
    target: Target,
    arrivals: int,
    probes: int,
    cold_words: int,
    probe_stamps: dict[int, tuple[float, float]] | None = None,
) -> tuple[list[float], list[float]]:
    """``arrivals`` simultaneous requests with unique (cold) prompts of ``cold_words`` words, plus
    ``probes`` requests among them that extend an already served conversation (its prefix is in
    the tokenizer's caches): (first-chunk seconds of the probes, of the cold requests).

    ``probe_stamps``, when given, gets for probe ``k`` (its last turn is ``Follow-up <salt> <k>?``)
    the ``time.perf_counter()`` of its connection and of its first body bytes."""
    loop = asyncio.get_running_loop()
    history = [
        {"role": "user", "content": "Summarise the design notes. " + "The frontend streams tokens. " * 2000},
        {"role": "assistant", "content": "Done."},
    ]

    async def one(request: bytes) -> tuple[float, float]:
        done: asyncio.Future[tuple[int, float]] = loop.create_future()
        stream = StreamClient(request, done)
        await loop.create_connection(lambda: stream, target.host, target.port)
        first = (await done)[1]
        return stream.started, first

    # serve the conversation once: its prefix is now cached
    await one(_chat_request(target, [*history, {"role": "user", "content": "First question?"}], 4))
    salt = time.monotonic_ns()
    requests: list[tuple[int | None, bytes]] = []  # (probe number or None, request)
    for i in range(arrivals):
        # ordinary words (about one token each), unique per request and run from the first word on
        words = f"Request {salt} {i}. " + " ".join(
            _WORDS[(i * 31 + j * 7) % len(_WORDS)] for j in range(cold_words)
        )
        requests.append((None, _chat_request(target, [{"role": "user", "content": words}], 4)))
    step = max(1, arrivals // max(probes, 1))
    for k in range(probes):
        question = [*history, {"role": "user", "content": f"Follow-up {salt} {k}?"}]
        requests.insert(min(len(requests), (k + 1) * step), (k, _chat_request(target, question, 4)))
    results = await asyncio.gather(*(one(r) for _, r in requests))
    probe_t: list[float] = []
    cold_t: list[float] = []
    for (k, _), (started, first) in zip(requests, results, strict=True):
        if k is None:
            cold_t.append(first)
            continue
        probe_t.append(first)
        if probe_stamps is not None:
            probe_stamps[k] = (started, started + first)
    return probe_t, cold_t


# --------------------------------------------------------------------------- TTFT overhead


def ttft_overhead(target_tokens: int = 100_000, repeats: int = 20) -> tuple[int, float, float]:
    """(prompt tokens, median ms cold-extension, median ms first-time whole prompt)."""
    import orjson

    from deepseek_frontend.api.openai.chat_request import to_chat_request
    from deepseek_frontend.engines.config import EngineConfig
    from deepseek_frontend.engines.sim.engine import SimulatedEngine
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
    from deepseek_frontend.server.app import create_app
    from deepseek_frontend.tokenization import PromptTokenizer

    tokenizer = PromptTokenizer.load()
    config = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash"), engine=EngineConfig(kind="sim"))
    app = create_app(config, tokenizer=tokenizer, backend=SimulatedEngine(tokenizer))
    pipeline = app.state.frontend.models.default.pipeline
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


def burst_main(args: argparse.Namespace) -> int:
    """``--burst N``: first-chunk latency of cached-prefix requests inside a burst of cold ones.

    With ``--bare`` the same burst also goes to the bare-ASGI server, round by round interleaved
    with ``serve``: what uvicorn alone takes to answer the last of N simultaneous arrivals on this
    machine, a floor for any Python ASGI frontend (its "follow-ups" are no cheaper than the rest).
    """
    print(
        f"burst: {args.burst} simultaneous cold requests ({args.burst_words} words each) with "
        f"{args.burst_probes} cached-prefix requests among them; engine ttft {args.ttft_ms:g} ms"
    )
    print(
        "| frontend | round | cached-prefix first chunk p50 (ms) | p99 (ms) | max (ms) "
        "| cold p50 (ms) | cold p99 (ms) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_sim_engine import start_engine

    # the engine in its own process: its planning of each cold prompt is not the frontend's work
    engine, engine_port = start_engine(1, args.itl_ms)
    procs: list[subprocess.Popen[bytes]] = [engine]
    targets: list[Target] = []
    try:
        for n in args.workers or [1]:
            proc, port = start_serve_command(
                n, 1, args.ttft_ms, args.itl_ms, f"http://127.0.0.1:{engine_port}"
            )
            procs.append(proc)
            targets.append(Target(f"serve --workers {n} --worker sim-engine", "127.0.0.1", port))
        if args.bare:
            proc, port = start_server(1, bare=True)
            procs.append(proc)
            targets.append(Target("bare ASGI ceiling", "127.0.0.1", port))
        for round_ in range(args.repeats):
            for target in targets:
                probes, cold = _run(run_burst(target, args.burst, args.burst_probes, args.burst_words))
                ms = 1000.0
                cold_cells = "| - | - |"  # --burst 0: the follow-ups alone
                if cold:
                    cold_cells = f"| {percentile(cold, 0.5) * ms:.1f} | {percentile(cold, 0.99) * ms:.1f} |"
                print(
                    f"| {target.label} | {round_ + 1} | {percentile(probes, 0.5) * ms:.1f} "
                    f"| {percentile(probes, 0.99) * ms:.1f} | {max(probes) * ms:.1f} {cold_cells}",
                    flush=True,
                )
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
    return 0


#: ``--compare``'s defaults for what the command line leaves unsaid: the traffic of the comparison
COMPARE_DEFAULTS = {
    "mode": ["unique", "agentic"], "tokens": 150, "ttft_ms": 20.0, "itl_ms": 10.0,
    "concurrency": [256, 1024], "workers": [1, 2], "repeats": 2, "tokens_per_chunk": [1],
}  # fmt: skip
#: the defaults without ``--compare`` (the frontend's own cost per token, as in earlier tables)
PLAIN_DEFAULTS = {
    "mode": ["short"], "tokens": None, "ttft_ms": 0.0, "itl_ms": 0.0,
    "concurrency": [1, 64, 256, 1024], "workers": [], "repeats": 1, "tokens_per_chunk": [1, 4],
}  # fmt: skip


def compare_target(args: argparse.Namespace, procs: list[Any]) -> Target:
    """``--compare URL`` as given, or Dynamo started from ``--dynamo-venv`` (``procs`` gets it)."""
    if args.compare != "dynamo":
        url = urlsplit(args.compare)
        prefix = url.path.rstrip("/")
        if not prefix.endswith("/v1"):
            prefix += "/v1"
        return Target(
            f"compare {url.netloc}", url.hostname or "127.0.0.1", url.port or 80, args.compare_model,
            (args.compare_pid,) if args.compare_pid else (),
            (args.compare_engine_pid,) if args.compare_engine_pid else (),
            path=prefix + "/chat/completions",
        )  # fmt: skip
    if not args.dynamo_venv:
        raise SystemExit("--compare without a URL starts Dynamo: give --dynamo-venv PATH")
    from _dynamo import start_dynamo

    workdir = Path(args.dynamo_workdir or tempfile.mkdtemp(prefix="bench-dynamo-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dynamo = start_dynamo(Path(args.dynamo_venv), workdir, port, args.ttft_ms, args.itl_ms)
    procs.append(dynamo)
    print(f"Dynamo: frontend pid {dynamo.frontend.pid}, mocker pid {dynamo.mocker.pid}, logs in {workdir}")
    return Target(
        "Dynamo 1.6.1 (frontend + mocker)", "127.0.0.1", port, "deepseek-v4-flash",
        (dynamo.frontend.pid,), (dynamo.mocker.pid,),
    )  # fmt: skip


def _stop(procs: list[Any]) -> None:
    for proc in reversed(procs):
        if isinstance(proc, subprocess.Popen):
            proc.terminate()
            proc.wait(timeout=30)
        else:
            proc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--serve-bare", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--tokens-per-chunk", type=int, nargs="*", default=None)
    parser.add_argument("--concurrency", type=int, nargs="*", default=None, help="streams at once, per row")
    parser.add_argument(
        "--mode", nargs="*", choices=["short", "unique", "agentic"], default=None,
        help="what each stream sends (see the docstring); default short, with --compare unique agentic",
    )  # fmt: skip
    parser.add_argument("--prompt-words", type=int, default=1000, help="unique mode: words per prompt")
    parser.add_argument("--agent-turns", type=int, default=4, help="agentic mode: requests per stream")
    parser.add_argument("--agent-min-chars", type=int, default=70_000, help="agentic: first body, chars")
    parser.add_argument("--agent-max-chars", type=int, default=100_000, help="agentic: last body, chars")
    parser.add_argument("--quick", action="store_true", help="shorter streams")
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--ttft-ms", type=float, default=None, help="simulated engine time to first token")
    parser.add_argument("--itl-ms", type=float, default=None, help="simulated engine time between chunks")
    parser.add_argument("--tokens", type=int, default=None, help="completion tokens per stream (all rows)")
    parser.add_argument(
        "--workers", type=int, nargs="*", default=None, metavar="N",
        help="also run `deepseek-frontend serve --workers N` for each N (client-side latencies only)",
    )  # fmt: skip
    parser.add_argument("--bare", action="store_true", help="also run the bare-ASGI ceiling")
    parser.add_argument("--no-instrumented", action="store_true", help="skip this script's stamped server")
    parser.add_argument(
        "--compare", metavar="URL", nargs="?", const="dynamo", default=None,
        help="side by side with another OpenAI-compatible frontend, interleaved: the one at URL, or "
        "without URL NVIDIA Dynamo started from --dynamo-venv; real traffic by default",
    )  # fmt: skip
    parser.add_argument("--compare-model", default="deepseek-v4-flash", help="model name it serves")
    parser.add_argument("--compare-pid", type=int, default=None, help="its process id, to count its CPU time")
    parser.add_argument(
        "--compare-engine-pid", type=int, default=None, help="its engine's process id, counted apart"
    )
    parser.add_argument("--dynamo-venv", metavar="PATH", help="a virtualenv with ai-dynamo 1.6.1")
    parser.add_argument("--dynamo-workdir", metavar="DIR", help="Dynamo's model dir, logs (default: temp)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats per row")
    parser.add_argument(
        "--burst", type=int, default=None, metavar="N",
        help="instead of the table: N simultaneous cold arrivals with cached-prefix probes among them "
        "(0: the probes alone)",
    )  # fmt: skip
    parser.add_argument("--burst-probes", type=int, default=16, help="cached-prefix requests per burst")
    parser.add_argument("--burst-words", type=int, default=1500, help="words of each cold prompt")
    parser.add_argument(
        "--guard", action="store_true",
        help="instead of the table: serve's tokens per CPU-second at a small scale, next to "
        "guard_baseline.json (a report for CI, never a failure; see _guard.py)",
    )  # fmt: skip
    parser.add_argument("--guard-rounds", type=int, default=2, help="--guard: interleaved rounds (best kept)")
    parser.add_argument("--guard-report", metavar="PATH", help="--guard: also write the report here")
    parser.add_argument("--guard-record", action="store_true", help="--guard: store this run as the baseline")
    args = parser.parse_args()
    if args.guard:
        from _guard import guard_main

        return guard_main(args)
    defaults = COMPARE_DEFAULTS if args.compare else PLAIN_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.compare:
        args.no_instrumented = True  # the stamped server is for the added-latency columns
        args.skip_ttft = True
    if args.serve:
        serve(args.serve, args.tokens_per_chunk[0], args.ttft_ms, args.itl_ms)
        return 0
    if args.serve_bare:
        serve_bare(args.serve_bare, args.tokens_per_chunk[0])
        return 0

    if args.burst is not None:
        return burst_main(args)
    lengths = QUICK_STREAM_TOKENS if args.quick else STREAM_TOKENS
    print(
        f"engine: simulated, ttft {args.ttft_ms:g} ms, itl {args.itl_ms:g} ms; "
        f"load generator: this process (pid {os.getpid()}), {os.cpu_count()} CPUs; "
        f"load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True,
    )
    print(HEADER, flush=True)
    shared: list[Any] = []  # the compared frontend: one for all rows
    try:
        compare = compare_target(args, shared) if args.compare else None
        for tpc in args.tokens_per_chunk:
            procs: list[Any] = []
            targets: list[Target] = []
            try:
                if not args.no_instrumented:
                    proc, port = start_server(tpc, args.ttft_ms, args.itl_ms)
                    procs.append(proc)
                    targets.append(
                        Target("ours (1 process, stamped)", "127.0.0.1", port, pids=(proc.pid,), stamped=True)
                    )
                for n in args.workers:
                    proc, port = start_serve_command(n, tpc, args.ttft_ms, args.itl_ms)
                    procs.append(proc)
                    targets.append(Target(f"ours, serve --workers {n}", "127.0.0.1", port, pids=(proc.pid,)))
                if args.bare:
                    proc, port = start_server(tpc, bare=True)
                    procs.append(proc)
                    targets.append(Target("bare ASGI ceiling", "127.0.0.1", port, pids=(proc.pid,)))
                if compare is not None:
                    targets.append(compare)
                for mode in args.mode:
                    for conc in args.concurrency:
                        tokens = args.tokens or lengths.get(conc, max(100, 100_000 // conc))
                        workload = build_workload(mode, conc, tokens, args)
                        for _ in range(args.repeats):
                            for target in targets:  # interleaved: each row's targets run back to back
                                idle = tuple(t for t in targets if t is not target)
                                print(row(tpc, measure(target, workload, idle)), flush=True)
                                time.sleep(1.0)  # closed connections settle between runs
            finally:
                _stop(procs)
    finally:
        _stop(shared)
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
