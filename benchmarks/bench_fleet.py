"""What serving several models and API keys costs per request: five ``serve`` setups, interleaved.

Usage::

    python benchmarks/bench_fleet.py                      # 1 and 8 agents, 8 interleaved repeats
    python benchmarks/bench_fleet.py --quick              # 8 agents, 3 repeats, 8 turns (under a minute)
    python benchmarks/bench_fleet.py --agents 16 --repeats 9 --keys 1000
    python benchmarks/bench_fleet.py --setups a d e --new-connections

The setups (every one ``deepseek-frontend serve`` in its own process, the built-in simulated engine
in process, ``--sim-ttft-ms`` / ``--sim-itl-ms`` 0 unless ``--ttft-ms`` / ``--itl-ms`` say,
``--state-store none``, admission unbounded):

* **(a)** one model from flags, no keys: ``serve --served-model-name deepseek-v4-flash``;
* **(b)** ``--config`` with two models, ``deepseek-v4-flash`` and ``deepseek-v4-flash-canary``
  (both V4, so both do the same work per request: what differs from (a) is the routing -- the body
  is parsed before admission to find its ``model`` -- and a second model's caches and engine);
* **(c)** (b) plus ``keys:`` -- ``--keys`` entries (default 100) without limits; every request
  sends one as ``Authorization: Bearer`` (the table compares every entry's digest per request);
* **(d)** (b) plus the same keys, each with ``requests_per_minute``, ``tokens_per_minute`` and
  ``concurrent_requests`` limits far above the load (nothing is refused; a refusal fails the run);
* **(e)** (d) with ``--workers 2``: two processes, the limits in their shared memory segment.

The load: ``--agents`` agents at once (a closed loop: each sends its next request when the last
one ended), each working through one conversation of ``--turns`` requests on its own keep-alive
connection, as agent clients do. A conversation is a coding agent's: a system prompt, 12 tools with
JSON schemas, a task, then per turn an assistant tool call and its tool result (code and command
output), growing from ``--min-chars`` to ``--max-chars`` characters of JSON body (default 20,000
to 100,000: about 5K to 31K prompt tokens). Every request streams (``stream_options.include_usage``),
thinking off, ``max_tokens`` = ``--tokens``, ``ignore_eos``, ``--tokens-per-chunk`` tokens per
engine chunk. Every conversation of every repeat and setup is new (a salt in every message), so its
first request tokenizes cold and its follow-ups extend a cached prefix, as a fresh agent session's
do. With two models, agent ``i`` talks to model ``(i + repeat) % 2``: half the conversations go to
each model, interleaved in time. ``--new-connections``: one connection per request instead
(``Connection: close``, the client of bench_serving.py), which with ``--workers 2`` lands follow-ups
on either process and so on a process that has not seen the conversation.

One repeat runs every setup back to back (the order rotated each repeat) so that a shared
machine's load hits them alike. A warm-up round per setup and table (at least 4 agents, so that
both processes of (e) serve some) is not counted.

Columns (pooled over the repeats):

* **requests/s** -- requests / the summed wall time of the setup's repeats (first request sent to
  last stream ended);
* **first chunk p50 / p99** -- per request, from the request being written to the first SSE
  bytes (the frontend sends its headers with the first engine chunk);
* **CPU ms / request** -- user + system CPU time of the server's processes (for (e) the supervisor
  and both processes) per request, the simulated engine's work included: on a shared machine this,
  not wall-clock requests/s, says what a dedicated core sustains;
* **x (a)** -- the figure over the same figure of (a).

Last, the added steps alone, timed in this process with the server's own code (best of 5 runs of
20,000 calls): finding the presented key among ``--keys`` entries, and a limited key's admit +
release (the 3 limits, OpenAI headers rendered, the tokens of an 18,000-token request taken) with
the state in process memory (one process) and in the shared mmap of ``--workers 2``; for scale,
parsing a request body of the run, which every setup does once (with several models before
admission, to find ``model``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from _conversations import SALT, conversation_bodies
from _servers import free_port, wait_healthy
from _streams import KeepAliveStream, StreamClient
from bench_serving import cpu_seconds, percentile, process_tree

REPO = Path(__file__).resolve().parents[1]
MODELS = ("deepseek-v4-flash", "deepseek-v4-flash-canary")
#: limits of setup (d) and (e): per key, far above what one benchmark run asks
LIMITS = {"requests_per_minute": 10_000_000, "tokens_per_minute": 10**12, "concurrent_requests": 100_000}
#: agents of the uncounted warm-up round: each its own connection, so --workers 2 warms both processes
WARM_UP_AGENTS = 4
_COMPLETION = re.compile(rb'"completion_tokens":(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens":(\d+)')


# --------------------------------------------------------------------------- the servers


@dataclass
class Setup:
    """One server configuration to measure."""

    name: str
    label: str
    models: int = 1
    keys: bool = False
    limits: bool = False
    workers: int = 1
    proc: subprocess.Popen[bytes] | None = None
    port: int = 0
    #: per repeat: (wall seconds, CPU seconds, first-chunk seconds per request, prompt tokens)
    runs: list[tuple[float, float, list[float], list[int]]] = field(default_factory=list)


SETUPS = {
    "a": Setup("a", "(a) one model from flags, no keys"),
    "b": Setup("b", "(b) `--config`, two models", models=2),
    "c": Setup("c", "(c) (b) + keys, no limits", models=2, keys=True),
    "d": Setup("d", "(d) (b) + keys with limits", models=2, keys=True, limits=True),
    "e": Setup("e", "(e) (d) with `--workers 2`", models=2, keys=True, limits=True, workers=2),
}


def api_keys(count: int) -> list[str]:
    return [f"sk-bench-{i:05d}-{os.urandom(8).hex()}" for i in range(count)]


def start(setup: Setup, args: argparse.Namespace, keys: list[str], directory: Path) -> None:
    """Start ``setup``'s ``serve`` on a free port and wait until it is healthy."""
    port = free_port()
    command = [
        sys.executable, "-m", "deepseek_frontend", "serve", "--port", str(port),
        "--workers", str(setup.workers), "--state-store", "none", "--log-level", "warning",
        "--sim-tokens-per-chunk", str(args.tokens_per_chunk), "--sim-ttft-ms", str(args.ttft_ms),
        "--sim-itl-ms", str(args.itl_ms), "--max-concurrent-requests", "100000",
    ]  # fmt: skip
    if setup.models == 1:
        command += ["--served-model-name", MODELS[0]]
    else:
        config: dict[str, object] = {"models": [{"name": name, "family": "deepseek_v4"} for name in MODELS]}
        if setup.keys:
            limits = LIMITS if setup.limits else {}
            config["keys"] = [{"name": f"agent-{i}", "key": key, **limits} for i, key in enumerate(keys)]
        path = directory / f"fleet-{setup.name}.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        command += ["--config", str(path)]
    log = directory / f"serve-{setup.name}.log"
    with log.open("wb") as out:
        setup.proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    setup.port = port
    wait_healthy(f"http://127.0.0.1:{port}", setup.proc, log)


def stop(setup: Setup) -> None:
    if setup.proc is not None and setup.proc.poll() is None:
        setup.proc.terminate()
        try:
            setup.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            setup.proc.kill()
            setup.proc.wait()


# --------------------------------------------------------------------------- the load


def http_request(port: int, body: bytes, key: str | None, keep_alive: bool) -> bytes:
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n"
    )
    if key is not None:
        head += f"Authorization: Bearer {key}\r\n"
    return head.encode() + b"\r\n" + body


async def run_agents(
    setup: Setup, bodies: list[list[bytes]], salt: str, round_: int, keys: list[str], keep_alive: bool
) -> tuple[float, list[float], list[int]]:
    """Every agent's conversation once: (wall seconds, first-chunk seconds, prompt tokens)."""
    loop = asyncio.get_running_loop()

    async def agent(index: int) -> list[tuple[float, int]]:
        model = MODELS[(index + round_) % setup.models].encode()
        own_salt = f"{salt}{index:04d}"[-len(SALT) :].rjust(len(SALT), "-").encode()
        key = keys[index % len(keys)] if setup.keys else None
        results = []
        conn: KeepAliveStream | None = None
        if keep_alive:
            _, conn = await loop.create_connection(KeepAliveStream, "127.0.0.1", setup.port)
        try:
            for template in bodies[index]:
                body = template.replace(SALT, own_salt).replace(b"@MODEL@", model)
                request = http_request(setup.port, body, key, keep_alive)
                if conn is not None:
                    first, tail = await conn.send(request)
                else:
                    done: asyncio.Future[tuple[int, float]] = loop.create_future()
                    stream = StreamClient(request, done, tokens_required=True)
                    await loop.create_connection(lambda s=stream: s, "127.0.0.1", setup.port)
                    _, first = await done
                    tail = stream.tail
                if not _COMPLETION.search(tail):
                    raise RuntimeError(f"{setup.label}: a stream without usage: {tail[-300:]!r}")
                match = _PROMPT.search(tail)
                results.append((first, int(match.group(1)) if match else 0))
        finally:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
        return results

    started = time.perf_counter()
    per_agent = await asyncio.gather(*(agent(i) for i in range(len(bodies))))
    wall = time.perf_counter() - started
    pairs = [pair for results in per_agent for pair in results]
    return wall, [p[0] for p in pairs], [p[1] for p in pairs]


def measure(
    setup: Setup, bodies: list[list[bytes]], round_: int, keys: list[str], args: argparse.Namespace
) -> None:
    assert setup.proc is not None
    pids = process_tree(setup.proc.pid)
    cpu_before = sum(cpu_seconds(p) for p in pids)
    salt = f"{setup.name}{round_}{os.urandom(4).hex()}"
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        wall, firsts, prompts = runner.run(
            run_agents(setup, bodies, salt, round_, keys, not args.new_connections)
        )
    cpu = sum(cpu_seconds(p) for p in pids) - cpu_before
    if round_ >= 0:  # round -1: the warm-up
        setup.runs.append((wall, cpu, firsts, prompts))


def _loop_factory():  # type: ignore[no-untyped-def]
    try:
        import uvloop

        return uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        return None


# --------------------------------------------------------------------------- the steps alone


def _best_us(step: object, calls: int = 20_000, rounds: int = 5) -> float:
    """The best of ``rounds`` timings of ``calls`` calls of ``step()``, in microseconds a call."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(calls):
            step()  # type: ignore[operator]
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


def step_costs(keys: list[str], prompt_tokens: int, body: bytes) -> list[tuple[str, float]]:
    """What the added steps cost per request in process, outside the server: (step, µs). Last, for
    scale, parsing ``body``: every setup does it once; with several models before admission."""
    sys.path.insert(0, str(REPO / "src"))
    from deepseek_frontend.edge.auth import presented_key
    from deepseek_frontend.edge.body import parse_json_object
    from deepseek_frontend.keys.limit_state import SharedLimitState
    from deepseek_frontend.keys.rate_limits import RateLimiter
    from deepseek_frontend.keys.tenants import TenantTable

    headers = [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {keys[-1]}".encode())]
    plain = TenantTable.from_entries([{"name": f"agent-{i}", "key": k} for i, k in enumerate(keys)])
    limited = TenantTable.from_entries(
        [{"name": f"agent-{i}", "key": k, **LIMITS} for i, k in enumerate(keys)]
    )
    tenant = limited.authenticate(presented_key(headers) or b"")
    assert tenant is not None
    shared = SharedLimitState.create(processes=2)
    limiters = {"one process": RateLimiter(), "shared memory, 2 processes": RateLimiter(shared, 1)}

    def admit_release(limiter: RateLimiter) -> None:
        limiter.admit(tenant).release(prompt_tokens + 64)  # type: ignore[union-attr]

    find = f"find the key among {len(keys)} (`Authorization` header, SHA-256, compare all)"
    rows = [(find, _best_us(lambda: plain.authenticate(presented_key(headers) or b"")))]
    try:
        for where, limiter in limiters.items():
            admit = f"admit + release with 3 limits ({where})"
            rows.append((admit, _best_us(lambda lim=limiter: admit_release(lim))))
    finally:
        shared.close()
    parse = f"for scale: parse a {len(body):,}-byte body (once in every setup; moved, not added)"
    rows.append((parse, _best_us(lambda: parse_json_object(body), calls=200)))
    return rows


# --------------------------------------------------------------------------- the report


def machine() -> str:
    model = "unknown CPU"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        names = [ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")]
        model = names[0] if names else model
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0))
    return f"{cpus} CPUs (nproc), {model}, Python {platform.python_version()}, {platform.machine()}"


def table(setups: list[Setup]) -> list[str]:
    rows = [
        "| setup | requests/s | x (a) | first chunk p50 (ms) | x (a) | first chunk p99 (ms) | x (a) "
        "| CPU ms / request | x (a) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    figures = {}
    for setup in setups:
        firsts = [f for run in setup.runs for f in run[2]]
        wall = sum(run[0] for run in setup.runs)
        cpu = sum(run[1] for run in setup.runs)
        figures[setup.name] = (
            len(firsts) / wall,
            percentile(firsts, 0.5) * 1000,
            percentile(firsts, 0.99) * 1000,
            cpu / len(firsts) * 1000,
        )
    base = figures.get("a")
    for setup in setups:
        cells = []
        for i, value in enumerate(figures[setup.name]):
            ratio = f"{value / base[i]:.2f}" if base else "-"
            cells.append(f"{value:,.1f} | {ratio}")
        rows.append(f"| {setup.label} | " + " | ".join(cells) + " |")
    return rows


def run_section(
    setups: list[Setup], agents: int, bodies: list[list[bytes]], keys: list[str], args: argparse.Namespace
) -> None:
    """One table: a warm-up round, then ``args.repeats`` rounds of every setup, interleaved."""
    for setup in setups:
        setup.runs.clear()
        measure(setup, bodies[: max(WARM_UP_AGENTS, agents)], -1, keys, args)
    for round_ in range(args.repeats):
        shift = round_ % len(setups)
        for setup in setups[shift:] + setups[:shift]:
            measure(setup, bodies[:agents], round_, keys, args)
        print(f"  {agents} agents: repeat {round_ + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    prompts = [p for setup in setups for run in setup.runs for p in run[3]]
    print(
        f"\n{agents} agent(s) at once, {args.repeats} repeats x {agents * args.turns} requests a setup; "
        f"prompt tokens {min(prompts):,}-{max(prompts):,} (mean {sum(prompts) / len(prompts):,.0f})\n"
    )
    print("\n".join(table(setups)), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--agents", type=int, nargs="+", default=[1, 8], help="agents at once (one table each)"
    )
    parser.add_argument("--turns", type=int, default=12, help="requests per conversation")
    parser.add_argument("--repeats", type=int, default=8, help="interleaved repeats per table")
    parser.add_argument("--min-chars", type=int, default=20_000, help="first request's JSON body size")
    parser.add_argument("--max-chars", type=int, default=100_000, help="last request's JSON body size")
    parser.add_argument("--tokens", type=int, default=64, help="completion tokens per request")
    parser.add_argument("--tokens-per-chunk", type=int, default=4)
    parser.add_argument("--ttft-ms", type=float, default=0.0, help="simulated engine time to first token")
    parser.add_argument("--itl-ms", type=float, default=0.0, help="simulated engine time between chunks")
    parser.add_argument("--keys", type=int, default=100, help="entries in the key table of (c), (d), (e)")
    parser.add_argument("--setups", nargs="+", choices=sorted(SETUPS), default=sorted(SETUPS))
    parser.add_argument("--new-connections", action="store_true", help="one connection per request")
    parser.add_argument("--quick", action="store_true", help="8 agents, 3 repeats, 8 turns")
    args = parser.parse_args()
    if args.quick:
        args.agents, args.repeats, args.turns = [8], 3, 8
    setups = [SETUPS[name] for name in args.setups]
    keys = api_keys(max(1, args.keys))
    started = time.monotonic()
    print(f"machine: {machine()}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(
        f"load: {args.turns} requests per conversation, {args.min_chars:,}-{args.max_chars:,} chars, "
        f"{args.tokens} tokens at {args.tokens_per_chunk} per chunk, engine ttft {args.ttft_ms:g} ms "
        f"itl {args.itl_ms:g} ms; {args.keys} keys; "
        f"{'one connection per request' if args.new_connections else 'one keep-alive connection per agent'}",
        flush=True,
    )
    bodies = [
        conversation_bodies(i, args.turns, args.min_chars, args.max_chars, args.tokens)
        for i in range(max(WARM_UP_AGENTS, *args.agents))
    ]
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        try:
            for setup in setups:
                start(setup, args, keys, Path(tmp))
            for agents in args.agents:
                run_section(setups, agents, bodies, keys, args)
        finally:
            for setup in setups:
                stop(setup)
    print("\nThe added steps alone, in this process (best of 5 x 20,000 calls):\n")
    print("| step | µs per request |\n|---|---:|")
    middle = (
        bodies[0][len(bodies[0]) // 2].replace(SALT, b"-" * len(SALT)).replace(b"@MODEL@", MODELS[0].encode())
    )
    for step, micros in step_costs(keys, 18_000, middle):
        print(f"| {step} | {micros:.1f} |")
    print()
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"took {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
