"""The prefill/decode orchestrator's own cost per request (disagg/pool.py), engines taken out.

Usage::

    python benchmarks/bench_pd_overhead.py              # 3 rounds of 4000 requests per setup
    python benchmarks/bench_pd_overhead.py --requests 20000 --prompt-tokens 32768

Both setups run the real :class:`~deepseek_frontend.engines.pool.WorkerPool` (limits, deadlines,
output checks, router tickets) over in-process engine clients that answer at once, one request at a
time on one event loop:

* **aggregated**: one pool of 2 workers, ``--router-mode`` as given;
* **pd**: a :class:`~deepseek_frontend.disagg.pool.DisaggregatedPool` over a 1-worker prefill pool
  and a 1-worker decode pool (a room, the two leg requests, two tasks, the first-token race, the
  prefill answer's check, the log line and the counters).

The difference of the two per-request times is what disaggregation adds on the frontend's event
loop. Output: median over rounds of microseconds per request, for each setup and their difference.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import AsyncIterator

from deepseek_frontend.disagg.pool import DisaggregatedPool, PdConfig
from deepseek_frontend.engines.base import EngineChunk, EngineClient, GenerateRequest, SamplingParams
from deepseek_frontend.engines.pool import WorkerPool
from deepseek_frontend.routing.router import Router, RouterConfig


class InstantEngine(EngineClient):
    """Answers every request at once: ``tokens`` ids in one chunk, finish ``length``."""

    def __init__(self, name: str, tokens: int) -> None:
        self.name = name
        self.tokens = tokens

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        n = min(self.tokens, request.sampling.max_new_tokens)
        yield EngineChunk(list(range(1000, 1000 + n)), "length", None, len(request.input_ids), n, 0)

    async def abort(self, request_id: str) -> None:
        return None

    async def check_health(self) -> bool:
        return True


def pool(names: list[str], tokens: int, mode: str) -> WorkerPool:
    router = Router(RouterConfig(mode=mode))  # type: ignore[arg-type]
    return WorkerPool([InstantEngine(n, tokens) for n in names], health_interval_s=0, router=router)


async def per_request_us(target: object, requests: int, prompt: list[int]) -> float:
    generate = target.generate  # type: ignore[attr-defined]
    sampling = SamplingParams(max_new_tokens=8)
    started = time.perf_counter()
    for i in range(requests):
        async for _ in generate(GenerateRequest(f"r{i}", prompt, sampling)):
            pass
    return (time.perf_counter() - started) / requests * 1e6


async def main(args: argparse.Namespace) -> None:
    logging.getLogger("deepseek_frontend.routing.pd").setLevel(logging.INFO)  # the log line is formatted
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("deepseek_frontend.routing.pd").addHandler(logging.NullHandler())
    logging.getLogger("deepseek_frontend.routing.pd").propagate = False
    prompt = list(range(args.prompt_tokens))
    agg = pool(["http://a:1", "http://b:1"], 8, args.router_mode)
    pd = DisaggregatedPool(
        pool(["http://p:1"], 1, args.router_mode), pool(["http://d:1"], 8, args.router_mode), PdConfig()
    )
    results: dict[str, list[float]] = {"aggregated": [], "pd": []}
    for _ in range(args.rounds):
        results["aggregated"].append(await per_request_us(agg, args.requests, prompt))
        results["pd"].append(await per_request_us(pd, args.requests, prompt))
    a, p = (statistics.median(results[k]) for k in ("aggregated", "pd"))
    print(
        f"router-mode {args.router_mode}, prompt {args.prompt_tokens} tokens, "
        f"{args.requests} requests x {args.rounds}"
    )
    print(f"aggregated pool   {a:8.1f} us/request")
    print(f"pd orchestrator   {p:8.1f} us/request")
    print(f"added by PD       {p - a:8.1f} us/request")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--router-mode", default="least-outstanding")
    asyncio.run(main(parser.parse_args()))
