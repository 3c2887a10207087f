"""Routing over several simulated workers: KV-aware vs session vs load-only routing.

Usage::

    python benchmarks/bench_routing.py            # the table in docs/performance.md (~3 min on 2 cores)
    python benchmarks/bench_routing.py --quick    # a smaller trace (~1 min)
    python benchmarks/bench_routing.py --modes kv least-outstanding --sessions 32

What runs (all in this process, on one event loop):

* **Workers**: 4 simulated workers. Each is a small engine client over the simulated engine's KV
  cache model (``engines/sim/kv.py`` -- the same code ``sim-engine --kv-cache-tokens`` runs): a
  bounded LRU prefix cache of ``--kv-cache-tokens`` tokens in 256-token pages, prefills one at a
  time costing ``--prefill-us-per-token`` per uncached prompt token, then ``--output-tokens``
  tokens at ``--itl-ms``. Each worker publishes its cache changes as SGLang-format KV events on a
  real ZMQ PUB socket on loopback (with a replay socket). Output text is not planned (the chat
  model of the simulated engine costs more CPU than 2 shared cores have for this load), which is
  the only difference from ``sim-engine``.
* **Frontend side**: the real :class:`~deepseek_frontend.engines.pool.WorkerPool` with the real
  :class:`~deepseek_frontend.routing.Router`; in ``kv`` mode the router subscribes to the workers'
  ZMQ events exactly as ``serve --router-mode kv`` does. The HTTP API layer is left out (its cost
  is measured by bench_serving.py and does not depend on the routing mode). Each session sets its
  session id the way the ``x-session-id`` header would.
* **Agentic trace**: ``--sessions`` concurrent sessions x ``--turns`` turns. A session starts with
  a ``--system-tokens`` system prompt shared by every session plus a ``--task-tokens`` task of its
  own; every turn appends the previous answer and a tool result of ``--tool-tokens`` tokens, then
  waits ``--think-ms`` +-50% (the tool running) before sending the next turn. Over a session's turns
  about 90% of each prompt was already sent in the previous turn.
* **Control trace**: the same number of requests with no reuse at all (fresh random prompts of the
  agentic trace's mean length), the same concurrency and think time.

* **Follow-up trace** (``--followups``): the agentic shape that decides whether KV events pay off --
  ``--fu-sessions`` (12) concurrent sessions x ``--fu-turns`` (6) turns on 4 workers, each turn
  resending the conversation plus ``--fu-new-tokens`` (1,500) new tokens; workers publish KV events
  as SGLang does (a prompt's after its prefill, a finished request's at the next prefill or after
  40 decode steps). It reports the **follow-up** first-token p50 (turns 2..N) of ``kv``,
  ``kv-approx`` and ``least-outstanding`` side by side and as a ratio to least-outstanding, over
  ``--repeats`` interleaved repeats (the modes' order rotates each repeat), and with
  ``--busy-cores N`` the same while N other processes spin on the machine's CPU.

Metrics: TTFT p50 / p99 (request handed to the pool -> first chunk), throughput (requests/s over
the wall time of the run), cache-hit tokens (``cached_tokens`` the workers reported / prompt
tokens), rejections (429s from the pool's per-worker limit ``--max-in-flight-per-worker`` after
``--capacity-wait-s`` of queueing; counted, never silent) and lost requests (any other failure).
**Routing cost**: median time of ``Router.choose`` for a 1M-token prompt that extends an earlier
one (4 workers, ``kv`` mode), and for its first sight (no cached hashes).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from deepseek_frontend.engines.base import EngineChunk, EngineClient, GenerateRequest, SamplingParams
from deepseek_frontend.engines.pool import StreamLimits, WorkerPool
from deepseek_frontend.engines.sim.kv import KvEventPublisher, SimKvCache
from deepseek_frontend.errors import FrontendError, OverloadedError
from deepseek_frontend.routing import Router, RouterConfig, use_session
from deepseek_frontend.routing.router import ROUTER_MODES

PAGE = 256
VOCAB = 120_000


class BenchWorker(EngineClient):
    """A simulated worker: the sim KV cache model for prefill, then fixed-rate decode (see docstring)."""

    def __init__(self, name: str, kv: SimKvCache, output_tokens: int, itl_s: float) -> None:
        kv.flush_s = 40 * itl_s  # SGLang flushes a finished request's events after 40 decode steps
        self.name = name
        self.kv = kv
        self.output_tokens = output_tokens
        self.itl_s = itl_s

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        prompt = request.input_ids
        cached = await self.kv.prefill(prompt)
        n = min(self.output_tokens, request.sampling.max_new_tokens)
        rng = random.Random(hash((len(prompt), prompt[-1])))
        out = [rng.randrange(VOCAB) for _ in range(n)]
        step = 8
        for start in range(0, n, step):
            last = start + step >= n
            yield EngineChunk(
                out[start : start + step],
                "length" if last else None,
                prompt_tokens=len(prompt),
                completion_tokens=min(n, start + step),
                cached_tokens=cached,
            )
            if not last:
                await asyncio.sleep(self.itl_s * step)
        self.kv.finished([*prompt, *out], len(prompt))

    async def abort(self, request_id: str) -> None:
        return None

    async def check_health(self) -> bool:
        return True


@dataclass
class Result:
    ttfts: list[float] = field(default_factory=list)
    #: first-token times of turns after a session's first
    followups: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    done: int = 0
    rejected: int = 0
    lost: int = 0
    wall_s: float = 0.0
    events: dict[str, dict[str, int]] = field(default_factory=dict)


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


#: token ids tool results and control prompts are cut from (generating fresh random ids for every
#: request would cost this process more CPU than the routing being measured)
_TEXT = random_ids(random.Random(11), 1 << 20)


def text_ids(rng: random.Random, n: int) -> list[int]:
    """``n`` ids from a random offset of a fixed random text: distinct per call, cheap to make."""
    start = rng.randrange(len(_TEXT) - n)
    return _TEXT[start : start + n]


async def one_request(
    pool: WorkerPool, prompt: list[int], rid: str, args: argparse.Namespace, result: Result
) -> list[int]:
    """Send one request; returns its output ids ([] when it failed)."""
    request = GenerateRequest(rid, prompt, SamplingParams(max_new_tokens=args.output_tokens))
    sent = time.perf_counter()
    out: list[int] = []
    try:
        first = True
        async for chunk in pool.generate(request):
            if first:
                result.ttfts.append(time.perf_counter() - sent)
                if not rid.endswith("-t0"):
                    result.followups.append(result.ttfts[-1])
                result.cached_tokens += chunk.cached_tokens or 0
                first = False
            out.extend(chunk.token_ids)
        result.prompt_tokens += len(prompt)
        result.done += 1
    except OverloadedError:
        result.rejected += 1
        return []
    except FrontendError:
        result.lost += 1
        return []
    return out


async def agentic_session(
    pool: WorkerPool, s: int, system: list[int], args: argparse.Namespace, result: Result
) -> None:
    use_session(f"session-{s}")
    rng = random.Random(1000 + s)
    prompt = [*system, *random_ids(rng, PAGE), *text_ids(rng, args.task_tokens - PAGE)]
    await asyncio.sleep(rng.random() * args.think_ms / 1000)  # sessions do not start in lockstep
    for turn in range(args.turns):
        out = await one_request(pool, prompt, f"s{s}-t{turn}", args, result)
        await asyncio.sleep(think_s(rng, args))
        prompt = [*prompt, *out, *text_ids(rng, args.tool_tokens)]


async def control_session(
    pool: WorkerPool, s: int, mean_tokens: int, args: argparse.Namespace, result: Result
) -> None:
    use_session(f"control-{s}")
    rng = random.Random(5000 + s)
    await asyncio.sleep(rng.random() * args.think_ms / 1000)
    for turn in range(args.turns):
        # a fresh first block makes every block of the prompt new (hashes are chained)
        prompt = [*random_ids(rng, PAGE), *text_ids(rng, mean_tokens - PAGE)]
        await one_request(pool, prompt, f"c{s}-t{turn}", args, result)
        await asyncio.sleep(think_s(rng, args))


def think_s(rng: random.Random, args: argparse.Namespace) -> float:
    """A tool's running time: ``--think-ms`` +-50% (uniform), so sessions drift out of step (in lockstep,
    round robin over a worker count that divides the session count would pin every session to one worker)."""
    return args.think_ms / 1000 * rng.uniform(0.5, 1.5)


def mean_agentic_prompt(args: argparse.Namespace) -> int:
    first = args.system_tokens + args.task_tokens
    per_turn = args.tool_tokens + args.output_tokens
    return first + per_turn * (args.turns - 1) // 2


async def run_mode(mode: str, trace: str, args: argparse.Namespace) -> Result:
    publishers: list[KvEventPublisher] = []
    workers: list[BenchWorker] = []
    endpoints: dict[str, str] = {}
    for w in range(args.workers):
        publisher = KvEventPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0") if mode == "kv" else None
        if publisher is not None:
            publisher.start()
            publishers.append(publisher)
        kv = SimKvCache(
            args.kv_cache_tokens,
            page_size=PAGE,
            prefill_us_per_token=args.prefill_us_per_token,
            publisher=publisher,
        )
        name = f"http://worker-{w}"
        workers.append(BenchWorker(name, kv, args.output_tokens, args.itl_ms / 1000))
        if publisher is not None:
            endpoints[name] = f"{publisher.endpoint};{publisher.replay_endpoint}"
    router = Router(RouterConfig(mode=mode, page_size=PAGE, kv_event_endpoints=endpoints))  # type: ignore[arg-type]
    limits = StreamLimits(
        max_in_flight_per_worker=args.max_in_flight_per_worker,
        capacity_wait_s=args.capacity_wait_s,
        first_token_timeout_s=None,
        idle_timeout_s=None,
        request_timeout_s=None,
    )
    pool = WorkerPool(workers, router=router, limits=limits, health_interval_s=0)
    await pool.start()
    for subs in router.subscribers().values():
        for sub in subs:
            await asyncio.wait_for(sub.ready.wait(), 10)
    result = Result()
    rng = random.Random(7)
    system = random_ids(rng, args.system_tokens)
    started = time.perf_counter()
    if trace == "agentic":
        tasks = [agentic_session(pool, s, system, args, result) for s in range(args.sessions)]
    else:
        mean = mean_agentic_prompt(args)
        tasks = [control_session(pool, s, mean, args, result) for s in range(args.sessions)]
    await asyncio.gather(*tasks)
    result.wall_s = time.perf_counter() - started
    result.events = router.event_stats()
    await pool.aclose()
    for publisher in publishers:
        await publisher.aclose()
    return result


def routing_cost() -> tuple[float, float]:
    """Median seconds of Router.choose for a 1M-token prompt: extending an earlier one, and first sight."""

    @dataclass
    class View:
        url: str
        in_flight: int = 0

    router = Router(RouterConfig(mode="kv", page_size=PAGE))
    views = [View(f"w{i}") for i in range(4)]
    for v in views:
        router.worker_added(v.url)
    rng = random.Random(3)
    base = random_ids(rng, 1_000_000)
    first = GenerateRequest("r0", base, SamplingParams(max_new_tokens=1))
    router.begin(router.choose(views, first).url, first).end()
    router.index.record(("w2", 0), router._hasher.hashes(base) if router._hasher else [], now=0.0)
    extend: list[float] = []
    prompt = base
    for turn in range(20):
        prompt = [*prompt, *random_ids(rng, 3000)]
        request = GenerateRequest(f"r{turn + 1}", prompt, SamplingParams(max_new_tokens=1))
        t0 = time.perf_counter()
        chosen = router.choose(views, request)
        extend.append(time.perf_counter() - t0)
        router.begin(chosen.url, request).end()
    cold: list[float] = []
    for n in range(3):
        fresh = GenerateRequest(f"f{n}", random_ids(rng, 1_000_000), SamplingParams(max_new_tokens=1))
        t0 = time.perf_counter()
        router.choose(views, fresh)
        cold.append(time.perf_counter() - t0)
    return statistics.median(extend), statistics.median(cold)


async def followup_session(
    pool: WorkerPool, s: int, system: list[int], args: argparse.Namespace, result: Result
) -> None:
    """One session of the follow-up trace: each turn resends the conversation plus new tokens."""
    if args.fu_session_header:
        use_session(f"fu-{s}")
    rng = random.Random(9000 + s)
    prompt = [*system, *random_ids(rng, PAGE), *text_ids(rng, args.fu_new_tokens - PAGE)]
    await asyncio.sleep(rng.random() * args.fu_think_ms / 1000)
    for turn in range(args.fu_turns):
        out = await one_request(pool, prompt, f"fu{s}-t{turn}", args, result)
        await asyncio.sleep(args.fu_think_ms / 1000 * rng.uniform(0.5, 1.5))
        prompt = [*prompt, *out, *text_ids(rng, args.fu_new_tokens)]


async def run_followups(mode: str, args: argparse.Namespace) -> Result:
    """The follow-up trace on 4 workers publishing SGLang-timed KV events (see module docstring)."""
    publishers: list[KvEventPublisher] = []
    workers: list[BenchWorker] = []
    endpoints: dict[str, str] = {}
    for w in range(args.workers):
        publisher = KvEventPublisher("tcp://127.0.0.1:0", "tcp://127.0.0.1:0") if mode == "kv" else None
        if publisher is not None:
            publisher.start()
            publishers.append(publisher)
        kv = SimKvCache(
            args.kv_cache_tokens, page_size=PAGE, prefill_us_per_token=args.fu_prefill_us, publisher=publisher
        )
        name = f"http://worker-{w}"
        workers.append(BenchWorker(name, kv, args.output_tokens, args.itl_ms / 1000))
        if publisher is not None:
            endpoints[name] = f"{publisher.endpoint};{publisher.replay_endpoint}"
    router = Router(RouterConfig(mode=mode, page_size=PAGE, kv_event_endpoints=endpoints))  # type: ignore[arg-type]
    limits = StreamLimits(first_token_timeout_s=None, idle_timeout_s=None, request_timeout_s=None)
    pool = WorkerPool(workers, router=router, limits=limits, health_interval_s=0)
    await pool.start()
    for subs in router.subscribers().values():
        for sub in subs:
            await asyncio.wait_for(sub.ready.wait(), 10)
    result = Result()
    system = random_ids(random.Random(8), args.fu_system_tokens)
    started = time.perf_counter()
    await asyncio.gather(*(followup_session(pool, s, system, args, result) for s in range(args.fu_sessions)))
    result.wall_s = time.perf_counter() - started
    await pool.aclose()
    for publisher in publishers:
        await publisher.aclose()
    return result


def _spin() -> None:
    while True:
        pass


def followup_table(args: argparse.Namespace) -> None:
    """Follow-up first-token p50 per mode over interleaved repeats, and its ratio to least-outstanding."""
    import multiprocessing

    modes = ["kv", "kv-approx", "least-outstanding"]
    busy = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy_cores)]
    for proc in busy:
        proc.start()
    try:
        p50s: dict[str, list[float]] = {m: [] for m in modes}
        hits: dict[str, list[float]] = {m: [] for m in modes}
        for rep in range(args.repeats):
            for mode in modes[rep % len(modes) :] + modes[: rep % len(modes)]:
                r = asyncio.run(run_followups(mode, args))
                p50s[mode].append(percentile(r.followups, 0.5))
                hits[mode].append(r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0)
    finally:
        for proc in busy:
            proc.kill()
    base = p50s["least-outstanding"]
    print(
        f"follow-up trace: {args.workers} workers, {args.fu_sessions} sessions x {args.fu_turns} turns, "
        f"+{args.fu_new_tokens} tokens per turn, prefill {args.fu_prefill_us:g} us/token, "
        f"{args.repeats} interleaved repeats, {args.busy_cores} busy processes"
    )
    print()
    print("| router | follow-up TTFT p50 (ms), per repeat | ratio to least-outstanding | cache-hit tokens |")
    print("| --- | --- | --- | --- |")
    for mode in modes:
        ratios = [a / b for a, b in zip(p50s[mode], base, strict=True) if b]
        print(
            f"| {mode} | {' / '.join(f'{v * 1000:.0f}' for v in p50s[mode])} "
            f"| {' / '.join(f'{x:.2f}' for x in ratios)} | {statistics.mean(hits[mode]):.1%} |",
            flush=True,
        )


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smaller trace")
    parser.add_argument("--modes", nargs="+", default=list(ROUTER_MODES), choices=ROUTER_MODES)
    parser.add_argument("--traces", nargs="+", default=["agentic", "control"], choices=["agentic", "control"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--system-tokens", type=int, default=6000)
    parser.add_argument("--task-tokens", type=int, default=2000)
    parser.add_argument("--tool-tokens", type=int, default=2000)
    parser.add_argument("--output-tokens", type=int, default=48)
    parser.add_argument("--think-ms", type=float, default=2000.0)
    parser.add_argument("--itl-ms", type=float, default=4.0)
    parser.add_argument("--prefill-us-per-token", type=float, default=4.0)
    parser.add_argument("--kv-cache-tokens", type=int, default=1_000_000)
    parser.add_argument("--max-in-flight-per-worker", type=int, default=24)
    parser.add_argument("--capacity-wait-s", type=float, default=5.0)
    parser.add_argument("--skip-cost", action="store_true", help="skip the 1M-token routing-cost measurement")
    parser.add_argument("--followups", action="store_true", help="run the follow-up trace only")
    parser.add_argument("--fu-sessions", type=int, default=12)
    parser.add_argument("--fu-turns", type=int, default=6)
    parser.add_argument("--fu-new-tokens", type=int, default=1500)
    parser.add_argument("--fu-system-tokens", type=int, default=512)
    parser.add_argument("--fu-think-ms", type=float, default=500.0)
    parser.add_argument("--fu-prefill-us", type=float, default=20.0)
    parser.add_argument("--fu-session-header", action="store_true", help="sessions send a session id")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--busy-cores", type=int, default=0, help="processes spinning on the CPU meanwhile")
    args = parser.parse_args(argv)
    if args.followups:
        followup_table(args)
        return 0
    if args.quick:
        args.sessions, args.turns = 32, 10

    print(
        f"{args.workers} workers, {args.sessions} sessions x {args.turns} turns, system {args.system_tokens} "
        f"+ task {args.task_tokens} + {args.tool_tokens} tokens per tool result, {args.output_tokens} output "
        f"tokens, think {args.think_ms:g} ms, prefill {args.prefill_us_per_token:g} us/token, "
        f"KV cache {args.kv_cache_tokens} tokens/worker, "
        f"mean agentic prompt {mean_agentic_prompt(args)} tokens"
    )
    print()
    print(
        "| trace | router | TTFT p50 (ms) | TTFT p99 (ms) | requests/s | cache-hit tokens | rejected | lost |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for trace in args.traces:
        for mode in args.modes:
            r = asyncio.run(run_mode(mode, trace, args))
            hit = r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0
            p50, p99 = percentile(r.ttfts, 0.5) * 1000, percentile(r.ttfts, 0.99) * 1000
            print(
                f"| {trace} | {mode} | {p50:.1f} | {p99:.1f} "
                f"| {r.done / r.wall_s:.1f} | {hit:.1%} | {r.rejected} | {r.lost} |",
                flush=True,
            )
    if not args.skip_cost:
        extend, cold = routing_cost()
        print()
        print(
            f"routing cost, 1M-token prompt, 4 workers: {extend * 1e3:.3f} ms extending an earlier prompt, "
            f"{cold * 1e3:.1f} ms at first sight (hashing every block)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
