"""What storing costs through `serve`: the same turns with ``store: false`` and with ``store: true``
chained by ``previous_response_id``, many chains at once, over HTTP against the simulated engine.

Run by hand (not a test)::

    python benchmarks/bench_state_http.py                     # 64 and 256 chains, 10 turns each
    python benchmarks/bench_state_http.py --chains 256 --turns 20 --state-store postgresql://...

Each chain sends ``--turns`` non-streamed ``/v1/responses`` requests back to back (a short user
message each): unstored, stored (the write path), and stored as one ``previous_response_id``
chain (each turn also reads the chain's history, and its prompt grows as a resending client's
would). Columns: mode, chains, turns/s, and the median / p90 milliseconds of a turn. The first two
rows' difference is what storing adds per turn; the turns/s say whether it costs throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.support.servers import start_frontend  # noqa: E402

MODEL = "deepseek-v4-flash"
#: (label, store, chained): the same short turns unstored, stored, and stored as one growing chain
#: (a chain's prompt grows each turn, as a resending client's would: its cost is the longer prompt)
MODES = (("store: false", False, False), ("store: true", True, False), ("store, chained", True, True))


async def _chain(client: httpx.AsyncClient, turns: int, store: bool, chain: bool, out: list[float]) -> None:
    previous = None
    for turn in range(turns):
        body: dict[str, object] = {"model": MODEL, "input": f"Say hello {turn}", "store": store}
        if previous is not None:
            body["previous_response_id"] = previous
        start = time.perf_counter()
        response = await client.post("/v1/responses", json=body)
        out.append(time.perf_counter() - start)
        response.raise_for_status()
        if chain:
            previous = response.json()["id"]


async def run(url: str, chains: int, turns: int, store: bool, chain: bool) -> tuple[float, list[float]]:
    limits = httpx.Limits(max_connections=chains, max_keepalive_connections=chains)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as client:
        latencies: list[float] = []
        start = time.perf_counter()
        await asyncio.gather(*(_chain(client, turns, store, chain, latencies) for _ in range(chains)))
        return chains * turns / (time.perf_counter() - start), latencies


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chains", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--state-store", default=None, help="default: a SQLite file in a temporary folder")
    args = parser.parse_args()
    store_url = args.state_store or "sqlite:///" + str(
        Path(tempfile.mkdtemp(prefix="bench-http-")) / "s.sqlite3"
    )
    with start_frontend("--state-store", store_url) as server:
        print("| mode | chains | turns/s | median ms | p90 ms |")
        print("|---|---|---|---|---|")
        for chains in args.chains:
            for mode, store, chain in MODES:
                rate, lat = asyncio.run(run(server.url, chains, args.turns, store, chain))
                median, p90 = statistics.median(lat) * 1e3, statistics.quantiles(lat, n=10)[8] * 1e3
                print(f"| {mode} | {chains} | {rate:.0f} | {median:.1f} | {p90:.1f} |", flush=True)


if __name__ == "__main__":
    main()
