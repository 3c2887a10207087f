"""Where a cached-prefix request's first-chunk time goes inside a burst, stage by stage.

Usage::

    python benchmarks/bench_burst_stages.py                      # 256 cold + 16 follow-ups, 5 rounds
    python benchmarks/bench_burst_stages.py --burst 256 --probes 1 --rounds 10

The same burst as ``bench_serving.py --burst`` (``serve --worker <sim-engine>``, the engine in its
own process, zero delay; one ~60K-character conversation served once, then N requests with unique
prompts and the follow-ups of that conversation sent at the same instant), with ``serve`` started
through this script so that it stamps each request as it passes the stages below. The client's
stamps and the server's are read from the same clock (``time.perf_counter``, CLOCK_MONOTONIC on
Linux, which every process of a host shares), so a follow-up's time splits without a gap:

* **connected -> accepted** -- the client's ``connection_made`` to the server protocol's
  ``connection_made`` (negative: the server saw the connection first).
* **accepted -> head parsed** -- to the protocol's ``on_headers_complete``: the loop reading it.
* **head parsed -> first step** -- to the ASGI call: the task waits behind the ready queue.
* **first step -> body parsed** -- routing, admission, the loop turn, reading and parsing the body.
* **body parsed -> prompt prepared** -- ``ChatPipeline.prepare_async`` (from the prompt caches).
* **prepared -> engine call** -- to the SGLang client's ``generate``.
* **engine call -> first engine chunk** -- the engine's queue and the loop reading its answer.
* **first engine chunk -> first body sent** -- to the ASGI ``send`` of the first SSE bytes.
* **sent -> client received** -- to the client's first body bytes.

p50 / p99 / max of each stage over the follow-ups of every round, and the client-side total.
The stamps wrap internal functions of the frontend (named in ``install_stamps``); they are a
benchmark's instrument, not part of ``serve``.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from bench_serving import REPO, Target, _run, _wait_healthy, percentile, run_burst  # noqa: E402
from bench_sim_engine import start_engine  # noqa: E402

#: (label, from stamp, to stamp); "connected" and "received" are the client's
STAGES = [
    ("connected -> accepted", "connected", "accepted"),
    ("accepted -> head parsed", "accepted", "head"),
    ("head parsed -> first step", "head", "asgi"),
    ("first step -> body parsed", "asgi", "body"),
    ("body parsed -> prompt prepared", "body", "prepared"),
    ("prepared -> engine call", "prepared", "engine_call"),
    ("engine call -> first engine chunk", "engine_call", "engine_first"),
    ("first engine chunk -> first body sent", "engine_first", "sent"),
    ("sent -> client received", "sent", "received"),
]
STAMPS_KEY = "bench.stamps"


# --------------------------------------------------------------------------- the stamped server


def install_stamps(dump_path: str) -> None:
    """Wrap the frontend's stage boundaries with stamps; SIGUSR1 writes the follow-ups' stamps
    (``{"k": probe number, stage: perf_counter, ...}`` per line) to ``dump_path`` and forgets all."""
    from deepseek_frontend.api.openai import chat as openai_chat
    from deepseek_frontend.edge import context as api_http
    from deepseek_frontend.engines import sglang
    from deepseek_frontend.pipeline import chat as pipeline_chat
    from deepseek_frontend.server import http_protocol

    clock = time.perf_counter
    current: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("stamps", default=None)
    probes: list[dict[str, Any]] = []
    protocol = http_protocol.GuardedHttpToolsProtocol

    connection_made = protocol.connection_made

    def stamped_connection_made(self: Any, transport: Any) -> None:
        self._bench_accepted = clock()
        connection_made(self, transport)

    headers_complete = protocol.on_headers_complete

    def stamped_headers_complete(self: Any) -> None:
        self.scope[STAMPS_KEY] = {"accepted": getattr(self, "_bench_accepted", None), "head": clock()}
        headers_complete(self)

    protocol.connection_made = stamped_connection_made  # type: ignore[method-assign]
    protocol.on_headers_complete = stamped_headers_complete  # type: ignore[method-assign]

    app_call = api_http.FrontendApp.__call__

    async def stamped_app_call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        stamps = scope.get(STAMPS_KEY)
        if stamps is None or scope.get("method") != "POST":
            return await app_call(self, scope, receive, send)
        stamps["asgi"] = clock()
        current.set(stamps)

        async def stamped_send(message: Any) -> None:
            if message["type"] == "http.response.body" and message.get("body") and "sent" not in stamps:
                stamps["sent"] = clock()
            await send(message)

        return await app_call(self, scope, receive, stamped_send)

    api_http.FrontendApp.__call__ = stamped_app_call  # type: ignore[method-assign]

    read_json = openai_chat.read_json

    async def stamped_read_json(request: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        body = await read_json(request, *args, **kwargs)
        stamps = current.get()
        messages = body.get("messages") or []
        last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
        if stamps is not None and isinstance(last, str) and last.startswith("Follow-up "):
            stamps["body"] = clock()
            stamps["k"] = int(last.rstrip("?").split()[-1])
            probes.append(stamps)
        return body

    openai_chat.read_json = stamped_read_json

    prepare_async = pipeline_chat.ChatPipeline.prepare_async

    async def stamped_prepare_async(self: Any, req: Any) -> Any:
        prepared = await prepare_async(self, req)
        stamps = current.get()
        if stamps is not None:
            stamps["prepared"] = clock()
        return prepared

    pipeline_chat.ChatPipeline.prepare_async = stamped_prepare_async  # type: ignore[method-assign]

    generate = sglang.SGLangClient.generate

    async def stamped_generate(self: Any, request: Any) -> Any:
        stamps = current.get()
        if stamps is not None:
            stamps["engine_call"] = clock()
        async for chunk in generate(self, request):
            if stamps is not None and "engine_first" not in stamps:
                stamps["engine_first"] = clock()
            yield chunk

    sglang.SGLangClient.generate = stamped_generate  # type: ignore[method-assign]

    def dump(*_: object) -> None:
        partial = dump_path + ".partial"
        with open(partial, "w") as out:
            for stamps in probes:
                out.write(json.dumps(stamps) + "\n")
        os.replace(partial, dump_path)  # the driver sees the file only once it is whole
        probes.clear()

    signal.signal(signal.SIGUSR1, dump)


def traced_serve(dump_path: str, argv: list[str]) -> int:
    install_stamps(dump_path)
    from deepseek_frontend.cli import main

    return main(argv)


# --------------------------------------------------------------------------- the driver


def start_traced_serve(engine_port: int, dump_path: str) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable, str(Path(__file__).resolve()), "--traced-serve", dump_path, "--",
            "serve", "--port", str(port), "--log-level", "warning",
            "--max-concurrent-requests", "100000", "--worker", f"http://127.0.0.1:{engine_port}",
        ],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    _wait_healthy(proc, port)
    return proc, port


def collect(proc: subprocess.Popen[bytes], dump_path: str) -> list[dict[str, Any]]:
    """The server's stamps of the follow-ups since the last call."""
    Path(dump_path).unlink(missing_ok=True)
    os.kill(proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 30
    while not Path(dump_path).exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the traced server wrote no stamps")
        time.sleep(0.05)
    return [json.loads(line) for line in Path(dump_path).read_text().splitlines()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traced-serve", metavar="DUMP_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--burst", type=int, default=256, help="cold requests per burst")
    parser.add_argument("--probes", type=int, default=16, help="cached-prefix follow-ups per burst")
    parser.add_argument("--burst-words", type=int, default=1500, help="words of each cold prompt")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--timeline", action="store_true", help="also print each follow-up's stamps of the last round"
    )
    args, rest = parser.parse_known_args()
    if args.traced_serve:
        return traced_serve(args.traced_serve, [a for a in rest if a != "--"])

    dump_path = f"/tmp/dsfe-burst-stages-{os.getpid()}.jsonl"
    engine, engine_port = start_engine(1, 0.0)
    procs: list[subprocess.Popen[Any]] = [engine]
    durations: dict[str, list[float]] = {label: [] for label, _, _ in STAGES}
    totals: list[float] = []
    try:
        serve, port = start_traced_serve(engine_port, dump_path)
        procs.append(serve)
        target = Target("serve --worker sim-engine (stamped)", "127.0.0.1", port)
        _run(run_burst(target, 0, 1, 10))  # warm up the server and the engine
        collect(serve, dump_path)
        last_round: list[dict[str, Any]] = []
        for _ in range(args.rounds):
            client: dict[int, tuple[float, float]] = {}
            _run(run_burst(target, args.burst, args.probes, args.burst_words, probe_stamps=client))
            last_round = collect(serve, dump_path)
            for stamps in last_round:
                connected_received = client.get(stamps["k"])
                if connected_received is None:
                    continue  # the warm-up's follow-up
                stamps["connected"], stamps["received"] = connected_received
                totals.append(stamps["received"] - stamps["connected"])
                for label, start, end in STAGES:
                    if stamps.get(start) is not None and stamps.get(end) is not None:
                        durations[label].append(stamps[end] - stamps[start])
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
        Path(dump_path).unlink(missing_ok=True)

    print(
        f"burst stages: {args.burst} cold requests ({args.burst_words} words) + {args.probes} "
        f"cached-prefix follow-ups, {args.rounds} rounds; {len(totals)} follow-ups measured"
    )
    print("| stage | p50 (ms) | p99 (ms) | max (ms) |")
    print("|---|---:|---:|---:|")
    rows = [(label, durations[label]) for label, _, _ in STAGES]
    for label, values in [*rows, ("**client: connected -> first chunk**", totals)]:
        if values:
            p50, p99, worst = (percentile(values, 0.5), percentile(values, 0.99), max(values))
            print(f"| {label} | {p50 * 1e3:.1f} | {p99 * 1e3:.1f} | {worst * 1e3:.1f} |")
    if args.timeline:
        print_timeline([stamps for stamps in last_round if "connected" in stamps])
    return 0


def print_timeline(probes: list[dict[str, Any]]) -> None:
    """Each follow-up's stamps in ms from the first follow-up's connection, in order of arrival:
    shows whether they are served one after another or all at once."""
    if not probes:
        return
    names = ["connected", *(end for _, _, end in STAGES)]
    zero = min(stamps["connected"] for stamps in probes)
    print(f"\nlast round, ms from the first follow-up's connection ({len(probes)} follow-ups)")
    print("| follow-up | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(names))
    for stamps in sorted(probes, key=lambda s: s["connected"]):
        cells = [f"{(stamps[n] - zero) * 1e3:.1f}" if stamps.get(n) is not None else "-" for n in names]
        print(f"| {stamps['k']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
