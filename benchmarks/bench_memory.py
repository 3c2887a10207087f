"""Memory of a long-running ``serve`` under unique long prompts: does RSS flatten at the cache budget?

Usage::

    python benchmarks/bench_memory.py                      # 20,000 requests, default and small budgets
    python benchmarks/bench_memory.py --requests 3000 --budgets small

What runs: for each budget setting the script starts ``deepseek-frontend serve`` (built-in
simulated engine) as its own process with ``--prefix-cache-bytes`` / ``--run-cache-bytes``
set, then sends ``--requests`` non-streamed chat requests, each a unique conversation of
about ``--prompt-tokens`` tokens (random words: nothing is shared between requests, so
every prompt is cold and every cache entry is new), 8 at a time, ``max_tokens`` 4.

Every ``--sample-every`` requests it records the server's resident set size
(``VmRSS`` from ``/proc/<pid>/status``) and the caches' own estimate of what they hold
(``deepseek_frontend_cache_bytes`` from ``/metrics``). After the last request it waits
for the idle expiry (the server runs with ``--cache-idle-seconds`` = ``--idle``) and
samples once more: the caches must be empty and RSS back near its start.

The table has one row per sample: requests sent, RSS (MiB), prefix + run cache bytes
(MiB). A flat RSS column once the cache columns reach their budget is the result.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from _servers import free_port

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
#: budget settings: (prefix cache bytes, run cache bytes); None = the server's defaults
BUDGETS: dict[str, tuple[int, int] | None] = {"default": None, "small": (64 * MIB, 32 * MIB)}
_CACHE_BYTES = re.compile(r'^deepseek_frontend_cache_bytes\{cache="(\w+)"\} (\S+)$', re.M)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cache_mib(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    return sum(float(v) for _, v in _CACHE_BYTES.findall(text)) / MIB


def unique_prompt(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of random lowercase words (a word is ~1.3 tokens)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ("".join(rng.choices(letters, k=rng.randint(3, 9))) for _ in range(int(tokens / 1.3)))
    return " ".join(words)


def start_server(port: int, budget: tuple[int, int] | None, idle_s: float) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "deepseek_frontend", "serve", "--port", str(port), "--log-level", "warning"]
    cmd += ["--cache-idle-seconds", str(idle_s)]
    if budget is not None:
        cmd += ["--prefix-cache-bytes", str(budget[0]), "--run-cache-bytes", str(budget[1])]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/live", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)  # the server is still starting; nothing to wait on but the port
    proc.kill()
    raise RuntimeError("server did not start")


async def send_all(port: int, n: int, prompt_tokens: int, seed: int, on_done: Callable[[int], None]) -> int:
    rng = random.Random(seed)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    failures = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal failures
        while not queue.empty():
            i = queue.get_nowait()
            body = {
                "model": "deepseek-v4-flash",
                "messages": [{"role": "user", "content": unique_prompt(rng, prompt_tokens)}],
                "max_tokens": 4,
                "thinking": {"type": "disabled"},
            }
            r = await client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                failures += 1
            on_done(i + 1)

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
        await asyncio.gather(*(worker(client) for _ in range(8)))
    return failures


def run_budget(name: str, args: argparse.Namespace) -> None:
    port = free_port()
    proc = start_server(port, BUDGETS[name], args.idle)
    rows: list[tuple[str, float, float]] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as probe:
            rows.append(("0", rss_mib(proc.pid), cache_mib(probe)))

            def on_done(done: int) -> None:
                if done % args.sample_every == 0:
                    rows.append((str(done), rss_mib(proc.pid), cache_mib(probe)))

            failures = asyncio.run(send_all(port, args.requests, args.prompt_tokens, 7, on_done))
            deadline = time.monotonic() + args.idle * 3 + 30
            while cache_mib(probe) > 0 and time.monotonic() < deadline:
                time.sleep(1)  # waiting on the server's idle expiry, checked by condition
            rows.append((f"idle {args.idle:g}s", rss_mib(proc.pid), cache_mib(probe)))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    budget = BUDGETS[name]
    label = "defaults" if budget is None else f"prefix {budget[0] // MIB} MiB, run {budget[1] // MIB} MiB"
    print(
        f"\n### budget: {name} ({label}); {args.prompt_tokens}-token unique prompts, failures: {failures}\n"
    )
    print("| requests | RSS (MiB) | cache estimate (MiB) |")
    print("| ---: | ---: | ---: |")
    for done, rss, cache in rows:
        print(f"| {done} | {rss:.0f} | {cache:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--prompt-tokens", type=int, default=10_000)
    parser.add_argument("--sample-every", type=int, default=2_000)
    parser.add_argument(
        "--idle",
        type=float,
        default=120.0,
        help="the server's --cache-idle-seconds (entries younger than this are only dropped for the budget)",
    )
    parser.add_argument("--budgets", nargs="+", choices=sorted(BUDGETS), default=["small", "default"])
    args = parser.parse_args()
    for name in args.budgets:
        run_budget(name, args)


if __name__ == "__main__":
    main()
