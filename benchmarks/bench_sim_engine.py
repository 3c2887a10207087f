"""Throughput of ``deepseek-frontend sim-engine`` as a load generator's back end.

Usage::

    python benchmarks/bench_sim_engine.py                         # 256 streams, 1 and 4 tokens/chunk
    python benchmarks/bench_sim_engine.py --streams 64 256 1024 --itl-ms 0 10 --tokens 400
    python benchmarks/bench_sim_engine.py --streams 16 256 --prompt-tokens 12000 --tokens 4 \
        --tokens-per-chunk 1 --itl-ms 0                            # long follow-up prompts

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
* **engine CPU ms per request** -- the engine's CPU time over the requests: with long prompts
  and short answers (``--prompt-tokens``), what reading one prompt costs the engine.
* **first chunk p50/p99** -- request sent to the first body bytes received, in ms.

``--prompt-tokens N``: every request is a follow-up of one conversation of about N tokens (the
same DeepSeek-V4 history, then a last user turn of its own), as an agent's requests are; the
default is a six-token prompt.
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

from _streams import StreamClient

REPO = Path(__file__).resolve().parents[1]


def conversation_ids(prompt_tokens: int) -> list[int]:
    """The ids of a DeepSeek-V4 conversation history of about ``prompt_tokens`` tokens ([] for a
    short prompt): a long user turn and a short answer, encoded by the real tokenizer."""
    if prompt_tokens <= 6:
        return []
    from deepseek_frontend.tokenization import PromptTokenizer

    tokenizer = PromptTokenizer.load()
    sentence = "The frontend streams tokens. "
    words = max(1, prompt_tokens // len(tokenizer.encode_text(sentence)))
    turns = "<｜User｜>" + sentence * words + "<｜Assistant｜></think>Done.<｜end▁of▁sentence｜>"
    return tokenizer.encode_raw("<｜begin▁of▁sentence｜>" + turns)


def _request(tokens: int, index: int, history: list[int]) -> bytes:
    import orjson

    # a short prompt, or a follow-up of ``history``: <｜User｜> 5+i%7 <｜Assistant｜> </think>
    ids = [0, 128803, 3, 4, 5 + index % 7, 128804]
    if history:
        ids = [*history, 128803, 5 + index, 128804, 128822]
    body = orjson.dumps(
        {
            "rid": f"bench-{index}-{time.monotonic_ns()}",
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0},
            "stream": True,
        }
    )
    return (
        b"POST /generate HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


async def run_load(
    port: int, streams: int, tokens: int, history: list[int]
) -> tuple[int, float, list[float]]:
    """(tokens received, wall seconds, first-chunk seconds per stream)."""
    loop = asyncio.get_running_loop()

    async def one(index: int) -> tuple[int, float]:
        done: asyncio.Future[tuple[int, float]] = loop.create_future()
        request = _request(tokens, index, history)
        # a /generate stream: its first bytes are the first chunk; every stream reports completion_tokens
        stream = StreamClient(request, done, first_marker=b"", tail_bytes=2048, tokens_required=True)
        await loop.create_connection(lambda: stream, "127.0.0.1", port)
        return await done

    # warm-up: the plan for a short prompt is memoised; a conversation's head is in the caches
    await one(-1)
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
    parser.add_argument(
        "--prompt-tokens", type=int, default=6, help="prompt length: follow-ups of one conversation this long"
    )
    args = parser.parse_args()
    history = conversation_ids(args.prompt_tokens)
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        loop_factory = None

    print(
        "| tokens/chunk | itl ms | streams | tokens | seconds | tokens/s | engine CPU s "
        "| tokens per engine CPU-second | engine CPU ms per request | first chunk p50 (ms) "
        "| first chunk p99 (ms) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for tpc in args.tokens_per_chunk:
        for itl in args.itl_ms:
            proc, port = start_engine(tpc, itl)
            try:
                for streams in args.streams:
                    before = cpu_seconds(proc.pid)
                    with asyncio.Runner(loop_factory=loop_factory) as runner:
                        total, seconds, firsts = runner.run(run_load(port, streams, args.tokens, history))
                    cpu = cpu_seconds(proc.pid) - before
                    print(
                        f"| {tpc} | {itl:g} | {streams} | {total} | {seconds:.2f} | {total / seconds:,.0f} "
                        f"| {cpu:.2f} | {total / max(cpu, 1e-9):,.0f} | {cpu / streams * 1000:.2f} "
                        f"| {percentile(firsts, 0.5) * 1000:.1f} "
                        f"| {percentile(firsts, 0.99) * 1000:.1f} |",
                        flush=True,
                    )
            finally:
                proc.terminate()
                proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
