"""``bench_serving.py --guard``: a short form of the Dynamo comparison that needs no Dynamo, for CI.

What it measures: ``serve --workers 1`` (in-process simulated engine, 20 ms to the first token,
10 ms per token, 150 tokens a stream, thinking off, every stream of a row at once) under the two
kinds of traffic of the comparison, at a small scale -- ``unique`` (64 streams, one new 1,000-word
prompt each) and ``agentic`` (8 streams, 2 turns each of a growing 21K-30K-token conversation) --
as **completion tokens per CPU-second** of the serving process (every thread, from
``/proc/PID/task/*/schedstat``, nanoseconds). CPU time, not wall time: it does not depend on what
else runs on the machine, only on how fast the machine is. To take that out, the same load runs
against the bare ASGI server of ``--bare`` (uvicorn + uvloop + httptools streaming as many chunks
with no frontend work at all, unique prompts): **ratio** = ours / bare, the frontend's tokens per
CPU-second in units of the Python ASGI floor of the same machine.

The ratios are compared with the ones stored in ``guard_baseline.json`` (``--guard-record``
writes the current run there) and the table is printed and written to ``--guard-report``. It is
a report, not a test: a ratio well below its baseline is flagged, the exit status stays 0 (only
a server that fails to start or to answer is an error). Best of ``--guard-rounds`` interleaved
rounds (serve, bare, serve, bare): a neighbour's burst inflates CPU time a little too (caches),
so the best round is the least disturbed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

import bench_serving as bs

BASELINE = Path(__file__).with_name("guard_baseline.json")
#: (mode, streams, turns per stream)
ROWS = (("unique", 64, 1), ("agentic", 8, 2))
TOKENS = 150
#: a ratio this far below its baseline is flagged in the report
FLAG_BELOW = 0.85


def process_cpu_ns(root: int) -> int:
    """Nanoseconds of CPU every thread of ``root`` and its descendants has used (schedstat)."""
    total = 0
    for pid in bs.process_tree(root):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                pass
    return total


def _tokens_per_cpu_s(target: bs.Target, workload: bs.Workload) -> float:
    """Completion tokens of one run of ``workload`` over the CPU-seconds ``target`` used for it."""
    bs._run(bs.run_load(target, workload.prefix(4, 1), os.urandom(5).hex()))  # warm-up
    before = process_cpu_ns(target.pids[0])
    load = bs._run(bs.run_load(target, workload, os.urandom(5).hex()))
    used = (process_cpu_ns(target.pids[0]) - before) / 1e9
    return sum(load.completions) / used if used > 0 else float("nan")


def measure(rounds: int) -> dict[str, float]:
    """tokens per CPU-second: ``ours/MODE`` per row and ``bare`` (best of ``rounds``)."""
    wargs = argparse.Namespace(
        prompt_words=1000, agent_turns=max(turns for _, _, turns in ROWS),
        agent_min_chars=70_000, agent_max_chars=100_000,
    )  # fmt: skip
    workloads = {
        mode: bs.build_workload(mode, streams, TOKENS, wargs).prefix(streams, turns)
        for mode, streams, turns in ROWS
    }
    procs: list[subprocess.Popen[bytes]] = []
    best: dict[str, float] = {}
    try:
        proc, port = bs.start_serve_command(1, 1, 20.0, 10.0)
        procs.append(proc)
        ours = bs.Target("serve --workers 1", "127.0.0.1", port, pids=(proc.pid,))
        proc, port = bs.start_server(1, bare=True)
        procs.append(proc)
        bare = bs.Target("bare ASGI", "127.0.0.1", port, pids=(proc.pid,))
        for _ in range(rounds):
            for mode, workload in workloads.items():
                key = f"ours/{mode}"
                best[key] = max(best.get(key, 0.0), _tokens_per_cpu_s(ours, workload))
            best["bare"] = max(best.get("bare", 0.0), _tokens_per_cpu_s(bare, workloads["unique"]))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
    return best


def report(measured: dict[str, float], baseline: dict[str, Any] | None) -> str:
    lines = [
        "### Serving cost guard (`python benchmarks/bench_serving.py --guard`)",
        "",
        f"`serve --workers 1`, simulated engine 20 ms / 10 ms, {TOKENS} tokens a stream; tokens per "
        "CPU-second of the serving process, and that over the bare ASGI server's on the same machine "
        f"(bare: {measured['bare']:,.0f} tokens per CPU-second). Machine: {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}.",
        "",
        "| traffic | streams x turns | tokens per CPU-second | ratio to bare | baseline ratio | change |",
        "|---|---|---:|---:|---:|---|",
    ]
    for mode, streams, turns in ROWS:
        value = measured[f"ours/{mode}"]
        ratio = value / measured["bare"]
        base = (baseline or {}).get("ratios", {}).get(mode)
        if base:
            change = ratio / base - 1
            flag = " **below the baseline: check**" if ratio < FLAG_BELOW * base else ""
            cells = f"{base:.3f} | {change:+.0%}{flag}"
        else:
            cells = "- | -"
        lines.append(f"| {mode} | {streams} x {turns} | {value:,.0f} | {ratio:.3f} | {cells} |")
    if baseline:
        lines += ["", f"Baseline: {baseline.get('recorded', '?')}."]
    return "\n".join(lines) + "\n"


def guard_main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    measured = measure(args.guard_rounds)
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else None
    if args.guard_record:
        baseline = {
            "ratios": {mode: measured[f"ours/{mode}"] / measured["bare"] for mode, _, _ in ROWS},
            "recorded": f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.2f}, best of {args.guard_rounds} rounds",
        }
        BASELINE.write_text(json.dumps(baseline, indent=2) + "\n")
    text = report(measured, baseline)
    text += f"\n({time.monotonic() - started:.0f} s)\n"
    print(text, flush=True)
    if args.guard_report:
        Path(args.guard_report).write_text(text)
    return 0
