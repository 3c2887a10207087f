"""Prefill/decode disaggregation vs aggregated workers, on simulated engines behind ``serve``.

Usage::

    python benchmarks/bench_disagg.py                 # the mixed trace, then the prompt-length sweep
    python benchmarks/bench_disagg.py --quick         # shorter runs, a smaller sweep
    python benchmarks/bench_disagg.py --sweep         # only the sweep (fixed long-prompt lengths)
    python benchmarks/bench_disagg.py --quick --coupling 80000   # prefill held by a full decode pool

What runs (all real processes on loopback):

* **aggregated**: two ``sim-engine`` workers (``--itl-ms``, ``--kv-cache-tokens``,
  ``--prefill-us-per-token``, default ``--chunked-prefill-size`` 8192): a long prompt's prefill
  holds the decode steps of every other stream on its worker, chunk by chunk
  (engines/sim/clock.py), behind ``serve --worker A --worker B``.
* **disaggregated**: one ``sim-engine --disaggregation-mode prefill`` and one ``--disaggregation-mode
  decode`` worker -- the same two simulated GPUs' worth -- behind ``serve --prefill-worker P
  --decode-worker D``. The decode worker fetches each room's KV from the prefill worker's bootstrap
  port over TCP, ``--kv-bytes-per-token`` bytes a token paced to ``--transfer-bandwidth-mbps``
  (defaults: 64 B at 400 Mbit/s, i.e. the time a ~70 KB/token MLA cache takes at ~45 GB/s).
* **trace**: ``--streams`` steady streams (chat completions, ``ignore_eos``, ``--stream-tokens``
  tokens each, re-sent as soon as one ends) and, among them, long prompts (``/v1/completions`` with
  token ids, ``--long-tokens`` output tokens) arriving as a Poisson process every
  ``--long-every-s`` on average, their lengths uniform in ``--long-min``..``--long-max`` tokens.
  After ``--duration-s`` no new request starts and the run waits for the ones in flight.

Columns: **TTFT p50/p99** of the long prompts (request sent -> first content chunk), **ITL
p50/p99** of the steady streams (gaps between consecutive content chunks), **tokens/s** (output
tokens of all requests / wall time), **lost** (requests that failed or ended without ``[DONE]``),
**frontend CPU ms/req** (the serve process's CPU time / requests: the difference between the two
setups is what PD orchestration costs per request). The sweep repeats the trace with one fixed
long-prompt length per row. ``--coupling TOKENS`` runs only the mixed trace on the PD pair, once with
an unbounded decode pool and once with a pool of TOKENS tokens (the decode sim's ``--max-total-tokens``),
adding **prefill wait ms/req**: how long the prefill sim's legs waited, on average, for their decode
to pre-allocate before computing (SGLang's ``early`` allocation policy couples prefill to decode
memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from _servers import free_port, wait_healthy

REPO = Path(__file__).resolve().parents[1]
_ADDRESS = re.compile(r"listening on (http://[0-9.]+:\d+)")
#: token ids of the long prompts: ordinary vocabulary (no special tokens)
VOCAB = (1000, 100_000)


@dataclass
class Run:
    """Measurements of one setup on one trace."""

    ttft_long: list[float] = field(default_factory=list)
    ttft_streams: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    lost: int = 0
    wall_s: float = 0.0
    frontend_cpu_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    #: disaggregated: ms the prefill sim's legs waited for their decode's pre-allocation, per transfer
    prefill_wait_ms: float = 0.0


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Proc:
    """A ``deepseek-frontend`` subprocess whose log is a temp file."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self.handle = log.open("wb")
        cmd = [sys.executable, "-m", "deepseek_frontend", *args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.handle, stderr=subprocess.STDOUT)

    def url(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.log} exited:\n{self.log.read_text()[-3000:]}")
            match = _ADDRESS.search(self.log.read_text(errors="replace"))
            if match:
                return match.group(1)
            time.sleep(0.05)
        raise RuntimeError(f"{self.log}: no address")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.handle.close()


def decode_pool(args: argparse.Namespace) -> list[str]:
    """The decode sim's KV pool flag (``--decode-max-total-tokens``; none: unbounded)."""
    tokens = getattr(args, "decode_max_total_tokens", None)
    return ["--max-total-tokens", str(tokens)] if tokens else []


def start_setup(disaggregated: bool, args: argparse.Namespace, tag: str) -> tuple[list[Proc], Proc, str]:
    """The workers and ``serve`` of one setup; returns (workers, frontend, frontend URL)."""
    common = [
        "--itl-ms", str(args.itl_ms), "--kv-cache-tokens", str(args.kv_cache_tokens),
        "--prefill-us-per-token", str(args.prefill_us_per_token),
    ]  # fmt: skip
    logs = Path(f"/tmp/bench_disagg_{os.getpid()}_{tag}")
    logs.mkdir(exist_ok=True)
    if disaggregated:
        transfer = [
            "--kv-bytes-per-token", str(args.kv_bytes_per_token),
            "--transfer-bandwidth-mbps", str(args.transfer_bandwidth_mbps),
        ]  # fmt: skip
        roles = (
            ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0", *transfer],
            ["--disaggregation-mode", "decode", *transfer, *decode_pool(args)],
        )
    else:
        roles = ([], [])
    workers = [
        Proc(["sim-engine", "--port", "0", *common, *role], logs / f"worker{i}.log")
        for i, role in enumerate(roles)
    ]
    urls = [w.url() for w in workers]
    for url, worker in zip(urls, workers, strict=True):
        wait_healthy(url, worker.proc, worker.log)
    port = free_port()
    if disaggregated:
        placement = ["--prefill-worker", urls[0], "--decode-worker", urls[1]]
    else:
        placement = ["--worker", *urls]
    serve = Proc(
        [
            "serve", "--port", str(port), *placement, "--log-level", "warning",
            "--max-concurrent-requests", "100000",
        ],
        logs / "serve.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, serve.proc, serve.log)
    return workers, serve, url


async def _stream(
    client: httpx.AsyncClient, path: str, body: dict[str, object] | bytes, run: Run, long: bool
) -> None:
    """One streamed request: its TTFT, its gaps between content chunks, its tokens."""
    started = time.perf_counter()
    last: float | None = None
    done = False
    tokens = 0
    run.requests += 1
    try:
        sent = (
            {"content": body, "headers": {"content-type": "application/json"}}
            if isinstance(body, bytes)
            else {"json": body}
        )
        async with client.stream("POST", path, **sent) as response:  # type: ignore[arg-type]
            if response.status_code != 200:
                run.lost += 1
                run.errors.append(f"{response.status_code} {(await response.aread())[:200]!r}")
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    run.errors.append(str(event["error"])[:200])
                    continue
                choice = (event.get("choices") or [{}])[0]
                text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                if not text:
                    continue
                now = time.perf_counter()
                tokens += 1
                if last is None:
                    (run.ttft_long if long else run.ttft_streams).append(now - started)
                elif not long:
                    run.gaps.append(now - last)
                last = now
    except httpx.HTTPError as exc:
        run.errors.append(repr(exc)[:200])
    run.tokens += tokens
    if not done:
        run.lost += 1


async def drive(url: str, args: argparse.Namespace, lengths: Sequence[int] | None, seed: int) -> Run:
    """The trace against one frontend (see the module docstring)."""
    run = Run()
    rng = random.Random(seed)
    # the long prompts' arrivals and bodies, made before the run: encoding a 64K-id body on the
    # client's loop would show up as a gap in every stream it reads
    arrivals: list[tuple[float, bytes]] = []
    at = rng.expovariate(1 / args.long_every_s)
    while at < args.duration_s:
        n = rng.choice(lengths) if lengths else rng.randint(args.long_min, args.long_max)
        prompt = [rng.randrange(*VOCAB) for _ in range(n)]
        body = {
            "model": "deepseek-v4-flash",
            "prompt": prompt,
            "max_tokens": args.long_tokens,
            "stream": True,
        }
        arrivals.append((at, json.dumps(body).encode()))
        at += rng.expovariate(1 / args.long_every_s)
    limits = httpx.Limits(max_connections=args.streams + 64, max_keepalive_connections=args.streams + 64)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        stop_at = time.perf_counter() + args.duration_s

        async def steady(index: int) -> None:
            turn = 0
            while time.perf_counter() < stop_at:
                body = {
                    "model": "deepseek-v4-flash",
                    "messages": [{"role": "user", "content": f"Story {index}.{turn}: write a long story."}],
                    "max_tokens": args.stream_tokens,
                    "ignore_eos": True,
                    "stream": True,
                }
                await _stream(client, "/v1/chat/completions", body, run, long=False)
                turn += 1

        async def longs() -> None:
            pending: list[asyncio.Task[None]] = []
            begin = time.perf_counter()
            for at, body in arrivals:
                await asyncio.sleep(max(0.0, begin + at - time.perf_counter()))
                pending.append(asyncio.create_task(_stream(client, "/v1/completions", body, run, long=True)))
            await asyncio.gather(*pending)

        started = time.perf_counter()
        await asyncio.gather(*(steady(i) for i in range(args.streams)), longs())
        run.wall_s = time.perf_counter() - started
    return run


def measure(disaggregated: bool, args: argparse.Namespace, lengths: Sequence[int] | None, tag: str) -> Run:
    workers, serve, url = start_setup(disaggregated, args, tag)
    try:
        cpu = _cpu_seconds(serve.proc.pid)
        run = asyncio.run(drive(url, args, lengths, seed=args.seed))
        run.frontend_cpu_s = _cpu_seconds(serve.proc.pid) - cpu
        if disaggregated:
            stats = httpx.get(workers[0].url() + "/sim/stats", timeout=10).json()
            run.prefill_wait_ms = stats["pd_bootstrap_wait_ms"] / max(1, stats["pd_transfers_sent"])
        return run
    finally:
        serve.stop()
        for worker in workers:
            worker.stop()


def row(name: str, run: Run) -> str:
    ms = 1000
    return (
        f"| {name} | {len(run.ttft_long)} | {percentile(run.ttft_long, 0.5) * ms:.0f} | "
        f"{percentile(run.ttft_long, 0.99) * ms:.0f} | {percentile(run.gaps, 0.5) * ms:.1f} | "
        f"{percentile(run.gaps, 0.99) * ms:.0f} | {max(run.gaps, default=0) * ms:.0f} | "
        f"{run.tokens / run.wall_s:.0f} | {run.lost} | {run.frontend_cpu_s * ms / max(run.requests, 1):.2f} |"
    )


HEADER = (
    "| setup | long prompts | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | ITL max ms | tokens/s "
    "| lost | frontend CPU ms/req |\n|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 s runs, a 3-point sweep")
    parser.add_argument("--sweep", action="store_true", help="only the prompt-length sweep")
    parser.add_argument("--no-sweep", action="store_true", help="only the mixed trace")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--stream-tokens", type=int, default=100)
    parser.add_argument("--itl-ms", type=float, default=40.0)
    parser.add_argument("--prefill-us-per-token", type=float, default=15.0)
    parser.add_argument("--kv-cache-tokens", type=int, default=4_000_000)
    parser.add_argument("--kv-bytes-per-token", type=int, default=64)
    parser.add_argument("--transfer-bandwidth-mbps", type=float, default=400.0)
    parser.add_argument("--long-every-s", type=float, default=1.0)
    parser.add_argument("--long-min", type=int, default=16_384)
    parser.add_argument("--long-max", type=int, default=65_536)
    parser.add_argument("--long-tokens", type=int, default=16)
    parser.add_argument("--duration-s", type=float, default=40.0)
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16_384, 65_536])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--decode-max-total-tokens",
        type=int,
        default=None,
        help="the decode sim's KV pool in tokens (its --max-total-tokens; default unbounded)",
    )
    parser.add_argument(
        "--coupling",
        type=int,
        metavar="TOKENS",
        default=None,
        help="only the mixed trace on the PD pair, with an unbounded decode pool and one of TOKENS tokens: "
        "the prefill waits for the decode's pre-allocation (SGLang's early policy)",
    )
    args = parser.parse_args(argv)
    # a terminated run still stops its workers and frontend (the finally blocks run on SystemExit)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    if args.quick:
        args.duration_s = 20.0
        args.lengths = [2048, 16_384, 65_536]
    print(
        f"# {args.streams} steady streams x {args.stream_tokens} tokens at {args.itl_ms:g} ms; "
        f"long prompts every {args.long_every_s:g} s (Poisson); "
        f"prefill {args.prefill_us_per_token:g} us/token, "
        f"chunks of 8192; KV {args.kv_bytes_per_token} B/token at {args.transfer_bandwidth_mbps:g} Mbit/s; "
        f"{args.duration_s:g} s per run; {os.cpu_count()} CPUs",
        flush=True,
    )
    if args.coupling:
        header = HEADER.replace(" |\n", " | prefill wait ms/req |\n", 1) + "---|"
        print(
            f"\nprefill coupled to decode memory: mixed trace, long prompts {args.long_min}-{args.long_max} "
            f"tokens\n\n{header}",
            flush=True,
        )
        for pool in (None, args.coupling):
            args.decode_max_total_tokens = pool
            name = f"PD, decode pool {pool if pool else 'unbounded'}"
            run = measure(True, args, None, f"coupling{pool}")
            print(f"{row(name, run)} {run.prefill_wait_ms:.0f} |", flush=True)
            if run.errors:
                print(f"  errors: {run.errors[:3]}", file=sys.stderr)
        return 0
    if not args.sweep:
        print(f"\nmixed trace: long prompts {args.long_min}-{args.long_max} tokens\n\n{HEADER}", flush=True)
        for disaggregated, name in ((False, "2 aggregated"), (True, "1 prefill + 1 decode")):
            run = measure(disaggregated, args, None, name.split()[0])
            print(row(name, run), flush=True)
            if run.errors:
                print(f"  errors: {run.errors[:3]}", file=sys.stderr)
    if not args.no_sweep:
        print(f"\nsweep: one long-prompt length per row\n\n{HEADER.replace('| setup', '| length, setup')}")
        for length in args.lengths:
            for disaggregated, name in ((False, "aggregated"), (True, "PD")):
                run = measure(disaggregated, args, [length], f"{length}{name}")
                print(row(f"{length}, {name}", run), flush=True)
                if run.errors:
                    print(f"  errors: {run.errors[:3]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
