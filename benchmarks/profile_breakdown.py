"""Where a frontend process's CPU goes, by stage: a py-spy profile of ``serve``, or a perf profile of
Dynamo's Rust frontend, turned into one table.

Usage (``serve``: py-spy for the stacks, /proc for each thread's CPU time)::

    python benchmarks/profile_breakdown.py --snapshot PID > before.txt
    py-spy record --native --threads --rate 100 --format raw -o serve.txt --pid PID &
    python benchmarks/bench_serving.py --compare http://127.0.0.1:PORT --compare-pid PID --workers \\
        --mode unique --concurrency 1024            # the load; then stop py-spy (Ctrl-C)
    python benchmarks/profile_breakdown.py --snapshot PID > after.txt
    python benchmarks/profile_breakdown.py serve.txt --threads before.txt after.txt --requests N

Usage (Dynamo's frontend, a native process: perf with DWARF call graphs)::

    perf record -e cpu-clock -F 199 --call-graph dwarf,16384 -p PID -o fe.data   # during the load
    perf script -i fe.data > fe.txt
    python benchmarks/profile_breakdown.py --perf fe.txt --cpu-s S --requests N

How samples become CPU time. py-spy samples every Python thread that is not idle, and on a
loaded machine that includes threads that are runnable but waiting for a core, or blocked on the
GIL in a way py-spy does not recognise as idle (``pthread_cond_*wait`` inside ``take_gil`` /
pyo3's ``PyEval_RestoreThread``): those samples are counted apart as "waiting for the GIL" and
left out. The rest of a thread's samples are scaled to that thread's own CPU seconds between the
two ``--snapshot`` files (/proc/PID/task/TID/stat), so each thread weighs what it really used;
threads py-spy never sampled (native threads: the Rust tokenizer's pool, where the batched cold prompts
are encoded) count as tokenization. perf samples only on-CPU time,
so its shares are CPU shares as they are.

Each sample goes to the stage of the innermost frame that names one, walking from the leaf to the
root (a tokenizer's Rust frames called from ``encode_texts`` are tokenization, a socket
``write`` called from the SSE path is SSE writes); frames naming no stage (the event loop's own
work, uvicorn's HTTP protocol and httptools, the interpreter; for Dynamo: tokio, hyper, the
allocator without a caller) fall to the last row. With ``--requests`` (requests served over the
profiled interval) the table gives CPU milliseconds per request.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

Stages = list[tuple[str, tuple[str, ...]]]

#: the tokenization stage; ``serve``'s threads py-spy never samples are the Rust tokenizer's pool
#: (``encode_batch_fast`` of the batched cold prompts runs there), so their CPU counts here
TOKENIZE = "tokenize the prompt (cold, unique)"

#: ``serve``'s stages: (stage, substrings of a py-spy frame "function (file:line)"), tried in order
SERVE_STAGES: Stages = [
    (
        "request body: read + JSON parse + validate",
        (
            "edge/body.py",
            "edge/body_readers.py",
            "openai/chat_request.py",
            "api/validation.py",
            "api/schemas.py",
        ),
    ),
    ("render (prompt format)", ("deepseek_frontend/formats/",)),
    (
        TOKENIZE,
        (
            "deepseek_frontend/tokenization/tokenizer.py",
            "deepseek_frontend/tokenization/segment_encoding.py",
            "deepseek_frontend/tokenization/text_encoding.py",
            "deepseek_frontend/tokenization/caches.py",
            "deepseek_frontend/pipeline/offload.py",
        ),
    ),
    (
        "routing + admission",
        (
            "deepseek_frontend/routing/",
            "edge/route.py",
            "fleet/admission.py",
            "edge/turns.py",
            "edge/arrivals.py",
            "server/http_protocol.py",
        ),
    ),
    ("engine (simulated, in process)", ("deepseek_frontend/engines/",)),
    (
        "detokenize + output parse",
        ("deepseek_frontend/tokenization/detokenization.py", "deepseek_frontend/parsing/"),
    ),
    (
        "response chunks + SSE writes (socket write included)",
        (
            "openai/chat_response.py",
            "edge/streaming.py",
            "edge/sse.py",
            "api/event_stream.py",
            "RequestResponseCycle.send",
            "UVStream__try_write",
        ),
    ),
    (
        "pipeline + request bookkeeping (logs, metrics, tracking)",
        (
            "deepseek_frontend/pipeline/",
            "edge/tracking.py",
            "fleet/metrics.py",
            "server/logs.py",
            "openai/chat.py",
            "edge/context.py",
            "edge/request.py",
            "state/continuity.py",
        ),
    ),
]

#: Dynamo's frontend stages, over perf frames (Rust symbols), tried in order
DYNAMO_STAGES: Stages = [
    ("request body: JSON parse + validate", ("serde_json::de", "axum::extract", "validate")),
    ("render (prompt format)", ("dynamo_renderer", "formatter", "minijinja", "prompt_formatter")),
    (
        "tokenize the prompt (cold, unique)",
        (
            "as dynamo_tokenizers::traits::Encoder>::encode",
            "tokenizers::tokenizer::TokenizerImpl<M,N,PT,PP,D>::encode",
        ),
    ),
    (
        "routing + admission",
        ("kv_router", "push_router", "PushRouter", "dynamo_llm::discovery", "Client::round_robin"),
    ),
    (
        "request plane to the mocker (TCP, (de)serialisation)",
        (
            "dynamo_runtime::pipeline::network",
            "dynamo_runtime::pipeline::network",
            "tcp::",
            "rmp_serde",
            "bincode",
        ),
    ),
    (
        "detokenize + output parse",
        (
            "Decoder>::decode",
            "dynamo_llm::backend::Decoder",
            "dynamo_parsers",
            "reasoning",
            "tool_parser",
            "jail",
        ),
    ),
    (
        "response chunks + SSE writes (socket write included)",
        ("axum::response::sse", "serde_json::ser", "h1::io::Buffered<T,B>::poll_flush", "poll_write"),
    ),
    (
        "pipeline + request bookkeeping (metrics, tracing)",
        ("dynamo_llm::", "prometheus", "tracing", "metrics"),
    ),
]
OTHER = "event loop / runtime, HTTP server, accept, interpreter or allocator without a known caller"
GIL_WAIT = ("pthread_cond_timedwait", "pthread_cond_wait", "PyThread_acquire_lock_timed", "take_gil")
_COUNT = re.compile(r"^(.*) (\d+)$")
_THREAD = re.compile(r"^thread \((\d+)\): ?(.*)$")


def stage_of(frames: list[str], stages: Stages) -> str:
    """The stage of one stack (root first)."""
    for frame in reversed(frames):
        for stage, needles in stages:
            if any(n in frame for n in needles):
                return stage
    return OTHER


def is_gil_wait(frames: list[str]) -> bool:
    """A thread blocked on the GIL or a lock (its innermost few frames)."""
    return any(w in frame for frame in frames[-4:] for w in GIL_WAIT)


def snapshot(pid: int) -> str:
    """Each thread of ``pid``: ``TID NAME CPU-TICKS`` lines (utime + stime)."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda p: int(p.name)):
        try:
            stat = (task / "stat").read_text()
            comm = (task / "comm").read_text().strip().replace(" ", "_")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        lines.append(f"{task.name} {comm} {int(fields[11]) + int(fields[12])}")
    return "\n".join(lines)


def thread_cpu(before: Path, after: Path) -> dict[int, float]:
    """CPU seconds per thread between two snapshots (threads started in between: all of theirs)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")

    def read(path: Path) -> dict[int, int]:
        return {int(t): int(c) for t, _, c in (line.split() for line in path.read_text().splitlines())}

    start, end = read(before), read(after)
    return {tid: (ticks - start.get(tid, 0)) / tick for tid, ticks in end.items()}


def pyspy_stacks(path: Path) -> list[tuple[int | None, list[str], int]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        match = _COUNT.match(line)
        if not match:
            continue
        frames = match.group(1).split(";")
        tid = None
        head = _THREAD.match(frames[0])
        if head:
            tid = int(head.group(1))
            frames = frames[1:]
        out.append((tid, frames, int(match.group(2))))
    return out


def perf_stacks(path: Path) -> list[tuple[int | None, list[str], int]]:
    """``perf script`` output: one stack per sample, leaf first in the file (returned root first)."""
    out: list[tuple[int | None, list[str], int]] = []
    frames: list[str] = []
    for line in [*path.read_text(errors="replace").splitlines(), ""]:
        if not line.strip():
            if frames:
                out.append((None, frames[::-1], 1))
            frames = []
        elif line[0] in " \t":
            parts = line.strip().split(" ", 1)
            frames.append(parts[1] if len(parts) > 1 else parts[0])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", nargs="*", type=Path, help="py-spy --format raw outputs")
    parser.add_argument("--snapshot", type=int, metavar="PID", help="print PID's per-thread CPU ticks")
    parser.add_argument("--threads", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="snapshots")
    parser.add_argument("--perf", type=Path, help="a `perf script` output (Dynamo's frontend)")
    parser.add_argument("--cpu-s", type=float, help="perf: the process's CPU seconds over the interval")
    parser.add_argument("--requests", type=int, help="requests served over the profiled interval")
    args = parser.parse_args()
    if args.snapshot:
        print(snapshot(args.snapshot))
        return 0
    seconds: Counter[str] = Counter()
    waits = 0.0
    notes: list[str] = []
    if args.perf:
        stages = DYNAMO_STAGES
        stacks = perf_stacks(args.perf)
        counts = Counter(stage_of(frames, stages) for _, frames, _ in stacks)
        total = sum(counts.values()) or 1
        cpu = args.cpu_s if args.cpu_s else float(total)
        for stage, n in counts.items():
            seconds[stage] = n / total * cpu
        notes.append(f"{total} perf samples")
    else:
        stages = SERVE_STAGES
        per_thread: dict[int | None, Counter[str]] = defaultdict(Counter)
        names: dict[int | None, str] = {}
        wait_samples: Counter[int | None] = Counter()
        for path in args.profiles:
            for line in path.read_text(errors="replace").splitlines():
                head = _THREAD.match(line.split(";", 1)[0])
                if head:
                    names[int(head.group(1))] = head.group(2)
            for tid, frames, n in pyspy_stacks(path):
                if is_gil_wait(frames):
                    wait_samples[tid] += n
                else:
                    per_thread[tid][stage_of(frames, stages)] += n
        cpu_of = thread_cpu(*args.threads) if args.threads else {}
        for tid, counts in per_thread.items():
            total = sum(counts.values()) or 1
            cpu = cpu_of.get(tid, float(total)) if tid is not None else float(total)
            for stage, n in counts.items():
                seconds[stage] += n / total * cpu
            waited = wait_samples[tid]
            notes.append(
                f"thread {tid} {names.get(tid, '?')}: {cpu:.2f} CPU s, {total} samples on CPU, "
                f"{waited} samples waiting for the GIL/a lock (left out)"
            )
            waits += waited
        for tid, cpu in sorted(cpu_of.items()):
            if tid not in per_thread and tid in wait_samples and cpu > 0:
                notes.append(f"thread {tid} {names.get(tid, '?')}: {cpu:.2f} CPU s, only waits sampled")
                seconds[OTHER] += cpu
            elif tid not in per_thread and cpu > 0:
                notes.append(f"thread {tid} (never sampled by py-spy: the tokenizer's pool): {cpu:.2f} CPU s")
                seconds[TOKENIZE] += cpu
    total_s = sum(seconds.values()) or 1.0
    per_request = bool(args.requests)
    print("| stage | CPU s | share |" + (" CPU ms per request |" if per_request else ""))
    print("|---|---:|---:|" + ("---:|" if per_request else ""))
    order = [s for s, _ in stages] + [OTHER]
    for stage in order:
        if stage not in seconds:
            continue
        cells = f"| {stage} | {seconds[stage]:.2f} | {seconds[stage] / total_s:.1%} |"
        if per_request:
            cells += f" {seconds[stage] / args.requests * 1000:.2f} |"
        print(cells)
    last = f" {total_s / args.requests * 1000:.2f} |" if per_request else ""
    print(f"| all | {total_s:.2f} | 100% |" + last)
    for note in notes:
        print(f"* {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
