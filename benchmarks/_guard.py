"""``bench_serving.py --guard``: a short form of the Dynamo comparison that needs no Dynamo, for CI.

What it measures: ``serve --workers 1`` (in-process simulated engine, 20 ms to the first token,
10 ms per token, 150 tokens a stream, thinking off, every stream of a row at once) under the two
kinds of traffic of the comparison, at a small scale -- ``unique`` (64 streams, one new 1,000-word
prompt each) and ``agentic`` (8 streams, 2 turns each of a growing 21K-30K-token conversation) --
as **completion tokens per CPU-second** of the serving process (every thread, from
``/proc/PID/task/*/schedstat``, nanoseconds). CPU time, not wall time: it does not depend on what
else runs on the machine, only on how fast the machine is.

Each figure is compared with the one stored in ``guard_baseline.json`` (``--guard-record`` writes
the current run there): **ratio** = now / baseline, above 1 cheaper per token. CI runs on one kind
of machine (2 cores); so that a different machine is seen for what it is, the report also gives
the CPU time of a fixed piece of pure-Python work (:func:`calibrate`) next to the baseline's, and
flags a ratio 15% below its baseline only when that calibration is within 10% of the baseline's.
It is a report, not a test: the exit status stays 0 (only a server that fails to start or to
answer is an error). Best of ``--guard-rounds`` rounds: a neighbour's burst inflates CPU time a
little too (caches), so the best round is the least disturbed. (The bare ASGI server of ``--bare``
was tried as the machine's yardstick: its figure moved by up to 2x between runs, with how the
client's reads batched its writes.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
#: how far the machine's calibration may be from the baseline's for a ratio to be flagged
CALIBRATION_TOLERANCE = 0.10


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


def calibrate(rounds: int = 5) -> float:
    """CPU seconds of a fixed piece of pure-Python work (best of ``rounds``): the machine's speed."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        table: dict[str, int] = {}
        for i in range(300_000):
            key = f"k{i % 5000}"
            table[key] = table.get(key, 0) + i * i % 7
        best = min(best, time.process_time() - started)
    return best


def measure(rounds: int) -> dict[str, float]:
    """tokens per CPU-second per mode (best of ``rounds``)."""
    wargs = argparse.Namespace(
        prompt_words=1000, agent_turns=max(turns for _, _, turns in ROWS),
        agent_min_chars=70_000, agent_max_chars=100_000,
    )  # fmt: skip
    workloads = {
        mode: bs.build_workload(mode, streams, TOKENS, wargs).prefix(streams, turns)
        for mode, streams, turns in ROWS
    }
    best: dict[str, float] = {}
    proc, port = bs.start_serve_command(1, 1, 20.0, 10.0)
    try:
        ours = bs.Target("serve --workers 1", "127.0.0.1", port, pids=(proc.pid,))
        for _ in range(rounds):
            for mode, workload in workloads.items():
                best[mode] = max(best.get(mode, 0.0), _tokens_per_cpu_s(ours, workload))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return best


def report(measured: dict[str, float], calibration: float, baseline: dict[str, Any] | None) -> str:
    base_cal = (baseline or {}).get("calibration_s")
    same_speed = bool(base_cal) and abs(calibration / base_cal - 1) <= CALIBRATION_TOLERANCE
    lines = [
        "### Serving cost guard (`python benchmarks/bench_serving.py --guard`)",
        "",
        f"`serve --workers 1`, simulated engine 20 ms / 10 ms, {TOKENS} tokens a stream: completion "
        "tokens per CPU-second of the serving process (all its threads), best of the rounds. "
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"calibration {calibration * 1000:.0f} ms"
        + (f" (baseline's {base_cal * 1000:.0f} ms)" if base_cal else "")
        + ("" if same_speed or not base_cal else ": **another machine speed, compare with care**")
        + ".",
        "",
        "| traffic | streams x turns | tokens per CPU-second | baseline | ratio |",
        "|---|---|---:|---:|---|",
    ]
    for mode, streams, turns in ROWS:
        value = measured[mode]
        base = (baseline or {}).get("tokens_per_cpu_s", {}).get(mode)
        if base:
            ratio = value / base
            flag = " **below the baseline: check**" if same_speed and ratio < FLAG_BELOW else ""
            cells = f"{base:,.0f} | {ratio:.2f}{flag}"
        else:
            cells = "- | -"
        lines.append(f"| {mode} | {streams} x {turns} | {value:,.0f} | {cells} |")
    if baseline:
        lines += ["", f"Baseline: {baseline.get('recorded', '?')}."]
    return "\n".join(lines) + "\n"


def guard_main(args: argparse.Namespace) -> int:
    started = time.monotonic()
    calibration = calibrate()
    measured = measure(args.guard_rounds)
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else None
    if args.guard_record:
        baseline = {
            "tokens_per_cpu_s": {mode: round(measured[mode]) for mode, _, _ in ROWS},
            "calibration_s": round(calibration, 4),
            "recorded": f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.2f}, best of {args.guard_rounds} rounds",
        }
        BASELINE.write_text(json.dumps(baseline, indent=2) + "\n")
    text = report(measured, calibration, baseline)
    text += f"\n({time.monotonic() - started:.0f} s)\n"
    print(text, flush=True)
    if args.guard_report:
        Path(args.guard_report).write_text(text)
    return 0
