"""Throughput of ``deepseek-frontend sim-engine`` as a load generator's back end.

Usage::

    python benchmarks/bench_sim_engine.py                         # 256 streams, 1 and 4 tokens/chunk
    python benchmarks/bench_sim_engine.py --streams 64 256 1024 --itl-ms 0 10 --tokens 400

What runs: one ``sim-engine`` process (``python -m deepseek_frontend.engines.sim.command``) per
(tokens per chunk, inter-token delay) setting, driven from this process by raw uvloop
``asyncio.Protocol`` clients speaking HTTP/1.1 to ``POST /generate`` (no SSE parsing beyond
reading the last ``completion_tokens``, so the client stays cheap). Every request has
``ignore_eos`` and ``max_new_tokens`` = ``--tokens``, so each stream is exactly that long.

Columns (definitions):

* **tokens/s** -- output tokens of all streams / wall time from the first request sent to the
  last stream closed.
* **engine CPU s** -- user + system CPU time of the sim-engine process during the run (/proc).
* **tokens per engine CPU-second** -- what one dedicated core sustains; on a shared machine
  this, not wall-clock tokens/s, is the figure to compare with a target.
* **first chunk p50/p99** -- request sent to the first body bytes received, in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_COMPLETION = re.compile(rb'"completion_tokens":(\d+)')


class _Stream(asyncio.Protocol):
    """One streamed ``/generate`` request; ``done`` resolves to (tokens, first-chunk seconds)."""

    def __init__(self, request: bytes, done: asyncio.Future[tuple[int, float]]) -> None:
        self.request = request
        self.done = done
        self.tail = b""
        self.started = 0.0
        self.first = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.started = time.perf_counter()
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.first:
            self.first = time.perf_counter() - self.started
        self.tail = (self.tail + data)[-2048:]

    def connection_lost(self, exc: Exception | None) -> None:
        matches = _COMPLETION.findall(self.tail)
        if self.done.done():
            return
        if not matches or b"[DONE]" not in self.tail:
            self.done.set_exception(RuntimeError(f"stream did not complete: {self.tail[-300:]!r}"))
        else:
            self.done.set_result((int(matches[-1]), self.first))


def _request(port: int, tokens: int, index: int) -> bytes:
    import orjson

    body = orjson.dumps(
        {
            "rid": f"bench-{index}-{time.monotonic_ns()}",
            "input_ids": [0, 128803, 3, 4, 5 + index % 7, 128804],
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0},
            "stream": True,
        }
    )
    return (
        b"POST /generate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def run_load(port: int, streams: int, tokens: int) -> tuple[int, float, list[float]]:
    """(tokens received, wall seconds, first-chunk seconds per stream)."""
    loop = asyncio.get_running_loop()

    async def one(index: int) -> tuple[int, float]:
        done: asyncio.Future[tuple[int, float]] = loop.create_future()
        await loop.create_connection(lambda: _Stream(_request(port, tokens, index), done), "127.0.0.1", port)
        return await done

    await one(-1)  # warm-up: the plan for this prompt is memoised
    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(streams)))
    seconds = time.perf_counter() - started
    return sum(r[0] for r in results), seconds, [r[1] for r in results]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def start_engine(tokens_per_chunk: int | str, itl_ms: float) -> tuple[subprocess.Popen[str], int]:
    """A sim-engine on a free port; returns (process, port) once it prints its listening line."""
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "deepseek_frontend.engines.sim.command", "--port", "0",
            "--tokens-per-chunk", str(tokens_per_chunk), "--itl-ms", str(itl_ms),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()  # blocks until the server listens (or exits: empty line)
    match = re.search(r"http://[^:]+:(\d+)", line)
    if match is None:
        proc.kill()
        raise RuntimeError(f"sim-engine did not start: {line!r}")
    return proc, int(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="*", default=[256])
    parser.add_argument("--tokens-per-chunk", nargs="*", default=["1", "4", "1-4"], help="N or MIN-MAX")
    parser.add_argument("--itl-ms", type=float, nargs="*", default=[0.0, 10.0])
    parser.add_argument("--tokens", type=int, default=400, help="output tokens per stream (default 400)")
    args = parser.parse_args()
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None

    print(
        "| tokens/chunk | itl ms | streams | tokens | seconds | tokens/s | engine CPU s "
        "| tokens per engine CPU-second | first chunk p50 (ms) | first chunk p99 (ms) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tpc in args.tokens_per_chunk:
        for itl in args.itl_ms:
            proc, port = start_engine(tpc, itl)
            try:
                for streams in args.streams:
                    before = cpu_seconds(proc.pid)
                    with asyncio.Runner(loop_factory=loop_factory) as runner:
                        total, seconds, firsts = runner.run(run_load(port, streams, args.tokens))
                    cpu = cpu_seconds(proc.pid) - before
                    print(
                        f"| {tpc} | {itl:g} | {streams} | {total} | {seconds:.2f} | {total / seconds:,.0f} "
                        f"| {cpu:.2f} | {total / max(cpu, 1e-9):,.0f} | {percentile(firsts, 0.5) * 1000:.1f} "
                        f"| {percentile(firsts, 0.99) * 1000:.1f} |",
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
