"""What a stored turn costs: the state store's read path (``history`` of a ``previous_response_id``
chain) plus its write path (``put_response``), per turn, with many chains at once.

Run by hand (not a test)::

    python benchmarks/bench_state.py                          # SQLite and PostgreSQL, 64 and 256 chains
    python benchmarks/bench_state.py --stores sqlite --chains 256 --turns 20 --think-s 0

Each chain runs ``--turns`` turns: read its history, store a response (one 300-byte input item,
a 600-byte reasoning item and a 300-byte function call -- a tool-loop turn), then wait
``--think-s`` seconds (the model generating and the client running the tool; 0: back to back,
which measures the store's capacity). Columns: chains, turns/s over the run, and the median /
p90 / p99 milliseconds a turn spent in the store. PostgreSQL runs on a private cluster started
like the tests' (``tests/support/postgres.py``: fsync off, so it measures the protocol and the
server, not a disk).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from deepseek_frontend.state import (  # noqa: E402
    StateStore,
    StoredItem,
    StoredResponse,
    new_id,
    open_store_url,
    owner_key,
)

OWNER = owner_key("bench")


def _item(item_id: str, kind: str, field: str, size: int) -> StoredItem:
    return StoredItem(item_id, json.dumps({"id": item_id, "type": kind, field: "x" * size}))


def _items() -> tuple[list[StoredItem], list[StoredItem]]:
    inputs = [_item(new_id("msg"), "message", "content", 240)]
    outputs = [
        _item(new_id("rs"), "reasoning", "content", 560),
        _item(new_id("fc"), "function_call", "arguments", 250),
    ]
    return inputs, outputs


async def _chain(store: StateStore, turns: int, think_s: float, out: list[float], rng: random.Random) -> None:
    previous = None
    await asyncio.sleep(rng.uniform(0, think_s))  # chains start spread over one think time, as real ones do
    for _ in range(turns):
        start = time.perf_counter()
        if previous is not None:
            history = await store.history(OWNER, previous)
            assert history is not None
        rid = new_id("resp")
        inputs, outputs = _items()
        output = ",".join(i.data for i in outputs)
        body = f'{{"id":"{rid}","object":"response","status":"completed","output":[{output}]}}'
        await store.put_response(
            StoredResponse(rid, OWNER, time.time(), "completed", body, "{}", previous), inputs, outputs
        )
        out.append(time.perf_counter() - start)
        previous = rid
        if think_s:
            await asyncio.sleep(think_s)


async def run(url: str, chains: int, turns: int, think_s: float) -> tuple[float, list[float]]:
    store = await open_store_url(url)
    try:
        latencies: list[float] = []
        start = time.perf_counter()
        rng = random.Random(0)
        await asyncio.gather(*(_chain(store, turns, think_s, latencies, rng) for _ in range(chains)))
        elapsed = time.perf_counter() - start
    finally:
        await store.close()
    return chains * turns / elapsed, latencies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--chains", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--think-s", type=float, nargs="+", default=[1.0, 0.0])
    args = parser.parse_args()
    pg = None
    try:
        print("| store | chains | think s | turns/s | median ms | p90 ms | p99 ms |")
        print("|---|---|---|---|---|---|---|")
        for kind in args.stores:
            for think in args.think_s:
                for chains in args.chains:
                    if kind == "sqlite":
                        url = "sqlite:///" + str(Path(tempfile.mkdtemp(prefix="bench-state-")) / "s.sqlite3")
                    else:
                        from tests.support.postgres import create_database, start_postgres

                        pg = pg or start_postgres()
                        url = create_database(pg)
                    rate, lat = asyncio.run(run(url, chains, args.turns, think))
                    q = statistics.quantiles(lat, n=100)
                    print(
                        f"| {kind} | {chains} | {think:g} | {rate:.0f} | {statistics.median(lat) * 1e3:.2f} "
                        f"| {q[89] * 1e3:.2f} | {q[98] * 1e3:.2f} |",
                        flush=True,
                    )
    finally:
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    main()
