"""Interactive agents beside a large batch on the same worker, with and without priorities; a replica
restart and a replica kill in the middle of the batch.

Usage::

    python benchmarks/bench_priorities.py                          # 10,000 lines, 8 agents (long)
    python benchmarks/bench_priorities.py --lines 300 --agents 4   # a sanity run (a few minutes)
    python benchmarks/bench_priorities.py --modes with --no-faults

The setup, per mode (each from scratch): one simulated SGLang worker (``sim-engine``) with
``--max-running-requests`` places in its running batch (``--ttft-ms``, ``--itl-ms`` per step);
a private PostgreSQL server (tests/support/postgres.py: the ``pgserver`` wheel's binaries or the
machine's) with a fresh database; two ``serve`` replicas on it (``--state-store postgresql://...``),
both sending to that worker, each running up to ``--batch-concurrency`` batch lines at once.

* **without priorities**: the worker schedules first come first served (no
  ``--enable-priority-scheduling``), so a batch line and an agent's turn queue alike at its batch.
  The frontends' admission is not the bottleneck (``--max-concurrent-requests`` is above the load),
  so their own queue order plays no part: this is what the same deployment did before priorities.
* **with priorities**: the worker runs ``--enable-priority-scheduling``; the frontends discover it
  in ``/server_info`` and send each request's priority -- batch lines the lowest, agents the
  default -- so an agent's turn goes ahead of waiting lines and preempts a running one.

The load: a batch of ``--lines`` chat completions (``/v1/batches``, uploaded to replica 0), each
``--batch-tokens`` output tokens (``ignore_eos``); and ``--agents`` interactive agents, each a
closed loop of streamed chat turns (``--agent-tokens`` output tokens, a session header each, agent
``i`` on replica ``i % 2``, moving to the other when its replica is gone) for as long as the batch
runs. Faults (unless ``--no-faults``): when a quarter of the lines are done, replica 1 is restarted
(SIGTERM, then started again); when half are (and replica 1 is back), replica 0 is killed (SIGKILL)
and stays down --
replica 1 finishes the batch, taking over the dead one's lines when their leases
(``--batch-lease-timeout``) run out.

Columns: agents' time to first token p50 / p99 (ms from sending a turn to its first content or
reasoning event; turns that started while the batch ran) and their turns; batch output tokens/s
(output tokens of all lines / from the batch's creation to its completion); agents' failed turns
(an agent whose replica died retries its turn on the other, counted here only when that fails
too); whether every line has exactly one result in the output file (and none failed); the worker's
preemptions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.support.postgres import create_database, start_postgres  # noqa: E402
from tests.support.servers import Server, start, start_frontend, start_sim_engine  # noqa: E402

MODEL = "deepseek-v4-flash"


@dataclass
class Run:
    """What one mode measured."""

    mode: str
    ttfts: list[float] = field(default_factory=list)
    turns: int = 0
    failed_turns: int = 0
    output_tokens: int = 0
    batch_seconds: float = 0.0
    lines_ok: bool = False
    line_note: str = ""
    preempted: int = 0
    events: list[str] = field(default_factory=list)


class Replicas:
    """The two ``serve`` replicas: their current URLs (None while down), restart and kill."""

    def __init__(self, servers: list[Server]) -> None:
        self.servers: list[Server | None] = list(servers)

    def url(self, index: int) -> str | None:
        server = self.servers[index]
        return server.url if server is not None else None

    def live(self, preferred: int) -> list[str]:
        order = [preferred, *(i for i in range(len(self.servers)) if i != preferred)]
        return [url for i in order if (url := self.url(i)) is not None]

    async def restart(self, index: int) -> None:
        server = self.servers[index]
        assert server is not None
        self.servers[index] = None
        await asyncio.to_thread(server.stop)  # SIGTERM: it gives its batch lines back
        self.servers[index] = await asyncio.to_thread(start, server.args, "/health")

    def kill(self, index: int) -> None:
        server = self.servers[index]
        assert server is not None
        self.servers[index] = None
        server.proc.kill()  # SIGKILL: its leases run out, the other replica takes its lines
        server.proc.wait(timeout=30)

    def stop_all(self) -> None:
        for server in self.servers:
            if server is not None:
                server.stop()


def batch_file(lines: int, tokens: int) -> bytes:
    rows = []
    for i in range(lines):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Summarise document {i} of the archive in detail."}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "thinking": {"type": "disabled"},
        }
        rows.append(
            orjson.dumps(
                {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            )
        )
    return b"\n".join(rows) + b"\n"


async def create_batch(url: str, lines: int, tokens: int) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        upload = await client.post(
            "/v1/files", files={"file": ("batch.jsonl", batch_file(lines, tokens))}, data={"purpose": "batch"}
        )
        upload.raise_for_status()
        batch = await client.post(
            "/v1/batches",
            json={
                "input_file_id": upload.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        batch.raise_for_status()
        return str(batch.json()["id"])


def _has_text(line: str) -> bool:
    """Whether an SSE data line is a chunk with answer or reasoning text (not the role delta)."""
    event = orjson.loads(line[6:])
    return any(
        choice["delta"].get("content") or choice["delta"].get("reasoning_content")
        for choice in event.get("choices") or ()
    )


async def agent(index: int, replicas: Replicas, tokens: int, running: asyncio.Event, run: Run) -> None:
    """One interactive agent: streamed turns back to back while ``running`` is set."""
    session = f"agent-{index}"
    turn = 0
    async with httpx.AsyncClient(timeout=120) as client:
        while running.is_set():
            turn += 1
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": f"Agent {index}, step {turn}: what next?"}],
                "max_tokens": tokens,
                "ignore_eos": True,
                "stream": True,
                "thinking": {"type": "disabled"},
            }
            headers = {"x-claude-code-session-id": session}
            for url in replicas.live(index % 2) or []:
                started = time.perf_counter()
                first: float | None = None
                try:
                    async with client.stream(
                        "POST", url + "/v1/chat/completions", json=body, headers=headers
                    ) as answer:
                        if answer.status_code != 200:
                            await answer.aread()
                            continue
                        async for line in answer.aiter_lines():
                            if first is None and line.startswith("data: {") and _has_text(line):
                                first = time.perf_counter() - started
                    if first is not None:
                        run.ttfts.append(first)
                        run.turns += 1
                        break
                except httpx.HTTPError:
                    continue
            else:
                run.failed_turns += 1
                await asyncio.sleep(0.2)


async def batch_state(replicas: Replicas, batch_id: str) -> dict[str, Any] | None:
    for url in replicas.live(1):
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                answer = await client.get(f"/v1/batches/{batch_id}")
                if answer.status_code == 200:
                    return answer.json()  # type: ignore[no-any-return]
    return None


async def check_output(replicas: Replicas, batch: dict[str, Any], lines: int, run: Run) -> None:
    (url,) = replicas.live(1)[:1]
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        content = (await client.get(f"/v1/files/{batch['output_file_id']}/content")).content
    ids: list[str] = []
    for raw in content.splitlines():
        row = orjson.loads(raw)
        ids.append(row["custom_id"])
        if row["response"]["status_code"] == 200:
            run.output_tokens += row["response"]["body"]["usage"]["completion_tokens"]
    counts = batch["request_counts"]
    unique = len(set(ids))
    run.lines_ok = unique == len(ids) == lines and counts["completed"] == lines and counts["failed"] == 0
    run.line_note = f"{unique}/{lines} answered once, {counts['failed']} failed"


async def run_mode(mode: str, args: argparse.Namespace, store: str) -> Run:
    run = Run(mode)
    worker_flags = ["--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms)]
    worker_flags += ["--max-running-requests", str(args.running)]
    if mode == "with":
        worker_flags.append("--enable-priority-scheduling")
    worker = start_sim_engine(*worker_flags)
    serve_flags = [
        "--worker", worker.url, "--served-model-name", MODEL, "--state-store", store,
        "--batch-concurrency", str(args.batch_concurrency), "--batch-lease-timeout", str(args.lease),
        "--max-concurrent-requests", "4096", "--max-queued-requests", "4096",
    ]  # fmt: skip
    replicas = Replicas([start_frontend(*serve_flags), start_frontend(*serve_flags)])
    try:
        batch_id = await create_batch(replicas.live(0)[0], args.lines, args.batch_tokens)
        created = time.perf_counter()
        running = asyncio.Event()
        running.set()
        agents = [
            asyncio.create_task(agent(i, replicas, args.agent_tokens, running, run))
            for i in range(args.agents)
        ]
        restarted = killed = args.no_faults
        batch: dict[str, Any] | None = None
        while True:
            await asyncio.sleep(0.5)
            batch = await batch_state(replicas, batch_id) or batch
            if batch is None:
                continue
            done = batch["request_counts"]["completed"] + batch["request_counts"]["failed"]
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                break
            if not restarted and done >= args.lines / 4:
                restarted = True
                run.events.append(f"replica 1 restarted at {done} lines")
                await replicas.restart(1)
                continue
            if not killed and done >= args.lines / 2:
                killed = True
                run.events.append(f"replica 0 killed at {done} lines")
                replicas.kill(0)
        if not killed:
            run.events.append("the batch ended before replica 0 was to be killed")
        run.batch_seconds = time.perf_counter() - created
        running.clear()
        await asyncio.gather(*agents)
        assert batch is not None
        await check_output(replicas, batch, args.lines, run)
        async with httpx.AsyncClient(timeout=10) as client:
            run.preempted = int((await client.get(worker.url + "/sim/stats")).json().get("preempted", 0))
    finally:
        replicas.stop_all()
        worker.stop()
    return run


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=10_000, help="batch lines (default %(default)s)")
    parser.add_argument("--agents", type=int, default=8, help="interactive agents (default %(default)s)")
    parser.add_argument("--batch-tokens", type=int, default=64, help="output tokens per line")
    parser.add_argument("--agent-tokens", type=int, default=32, help="output tokens per agent turn")
    parser.add_argument("--running", type=int, default=16, help="the worker's --max-running-requests")
    parser.add_argument("--batch-concurrency", type=int, default=32, help="batch lines per replica at once")
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--lease", type=float, default=10.0, help="--batch-lease-timeout, seconds")
    parser.add_argument("--modes", nargs="+", choices=("without", "with"), default=["without", "with"])
    parser.add_argument("--no-faults", action="store_true", help="no restart, no kill")
    args = parser.parse_args()
    # a SIGTERM (a CI timeout, kill) unwinds through the finally blocks that stop the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    postgres = start_postgres()
    try:
        runs = [asyncio.run(run_mode(mode, args, create_database(postgres))) for mode in args.modes]
    finally:
        postgres.stop()
    print(
        f"{args.lines} batch lines x {args.batch_tokens} tokens, "
        f"{args.agents} agents x {args.agent_tokens} tokens; "
        f"worker: {args.running} running, ttft {args.ttft_ms:g} ms, itl {args.itl_ms:g} ms; "
        f"{args.batch_concurrency} lines at once per replica, 2 replicas on PostgreSQL"
    )
    print()
    print(
        "| priorities | agent turns | agent TTFT p50 ms | agent TTFT p99 ms | failed turns "
        "| batch output tok/s | batch s | every line once | preempted |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        ttfts = [t * 1000 for t in run.ttfts]
        rate = run.output_tokens / run.batch_seconds if run.batch_seconds else 0.0
        print(
            f"| {run.mode} | {run.turns} | {statistics.median(ttfts) if ttfts else float('nan'):.0f} "
            f"| {percentile(ttfts, 0.99):.0f} | {run.failed_turns} | {rate:,.0f} | {run.batch_seconds:.1f} "
            f"| {'yes' if run.lines_ok else 'NO'} ({run.line_note}) | {run.preempted} |"
        )
    for run in runs:
        if run.events:
            print(f"\n{run.mode}: " + "; ".join(run.events))


if __name__ == "__main__":
    main()
