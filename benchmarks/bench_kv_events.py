"""A flood of KV events into ``serve --router-mode kv``: does ``/live`` stay responsive, memory bounded?

Usage::

    python benchmarks/bench_kv_events.py                    # 100K events/s for 60 s, index cap 64 MB
    python benchmarks/bench_kv_events.py --rate 20000 --seconds 20 --index-mb 16

What runs:

* a ``sim-engine`` as the worker (it only answers ``/server_info`` and ``/health`` here);
* ``serve --router-mode kv`` over it, told with ``--kv-events-endpoint`` to follow the flood
  publisher instead of the worker's own (``--kv-index-max-mb`` caps the index);
* a flood publisher (a separate process): SGLang-format batches ``[ts, events, rank]`` of
  ``--batch`` ``BlockStored`` events each, one ``--block-size``-token block per event, chained in
  runs of 64 blocks (a conversation) under fresh roots, numbered without gaps, never removed -- a
  worker whose removals were all lost, the worst case for the index;
* this process polls ``/live`` every 20 ms and samples the frontend's RSS (``/proc``) and the
  events it applied (``/metrics``) every second.

Prints one row per ``--report-every`` seconds: events sent and applied, RSS, and ``/live`` latency
p50 / p95 / max over that interval. The subscriber applies at most 256 blocks per event-loop turn
(``routing/subscriber.py``), so ``/live`` waits at most one slice; past what it keeps up with, ZMQ
drops batches and the gap clears the worker's blocks.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import msgpack
from tests.support.metrics import samples
from tests.support.servers import free_port, start_frontend, start_sim_engine


def flood(
    port: int, rate: int, seconds: float, batch: int, block_size: int, sent: multiprocessing.Value
) -> None:  # type: ignore[type-arg]
    """Publish ``rate`` events/s for ``seconds`` (see module docstring)."""
    import zmq

    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 100_000)
    sock.bind(f"tcp://127.0.0.1:{port}")
    time.sleep(1.0)  # the frontend's SUB joins
    tokens = list(range(1000, 1000 + block_size))
    name = 1
    seq = 0
    start = time.monotonic()
    end = start + seconds
    count = 0
    while time.monotonic() < end:
        events = []
        for _ in range(batch):
            parent = None if name % 64 == 1 else name - 1
            tokens[0] = name  # a different first id per block: every block is new
            events.append(
                {"type": "BlockStored", "block_hashes": [name], "parent_block_hash": parent,
                 "token_ids": tokens, "block_size": block_size, "lora_id": None}
            )  # fmt: skip
            name += 1
        payload = msgpack.packb([time.time(), events, 0])
        sock.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        seq += 1
        count += batch
        sent.value = count
        ahead = count / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    sock.close(linger=1000)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=100_000, help="events per second (default 100000)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--batch", type=int, default=100, help="events per batch (default 100)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per block (default 16)")
    parser.add_argument("--index-mb", type=float, default=64.0, help="--kv-index-max-mb of serve")
    parser.add_argument("--report-every", type=float, default=10.0)
    args = parser.parse_args(argv)
    port = free_port()
    with start_sim_engine("--kv-page-size", str(args.block_size), "--kv-cache-tokens", "100000") as worker:
        spec = f"{worker.url}=tcp://127.0.0.1:{port}"
        with start_frontend(
            "--worker", worker.url, "--router-mode", "kv", "--kv-events-endpoint", spec,
            "--kv-index-max-mb", str(args.index_mb), "--health-check-interval", "300",
        ) as frontend:  # fmt: skip
            pid = frontend.proc.pid
            baseline = rss_mb(pid)
            sent = multiprocessing.Value("q", 0)
            proc = multiprocessing.Process(
                target=flood, args=(port, args.rate, args.seconds, args.batch, args.block_size, sent)
            )
            proc.start()
            print(
                f"flood: {args.rate} events/s requested for {args.seconds:g} s, {args.batch} per batch, "
                f"{args.block_size}-token blocks; index cap {args.index_mb:g} MB; "
                f"RSS at start {baseline:.0f} MB; "
                f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
            )
            print()
            print(
                "| seconds | events sent | events applied | RSS (MB) "
                "| /live p50 (ms) | /live p95 (ms) | /live max (ms) |"
            )
            print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
            client = httpx.Client(timeout=10)
            started = time.monotonic()
            window: list[float] = []
            next_report = started + args.report_every
            peak = baseline
            all_lat: list[float] = []
            while proc.is_alive() or time.monotonic() < next_report:
                t0 = time.perf_counter()
                client.get(frontend.url + "/live")
                latency = time.perf_counter() - t0
                window.append(latency)
                all_lat.append(latency)
                now = time.monotonic()
                if now >= next_report:
                    metrics = client.get(frontend.url + "/metrics").text
                    applied = sum(samples(metrics, "deepseek_frontend_kv_events_total").values())
                    rss = rss_mb(pid)
                    peak = max(peak, rss)
                    ordered = sorted(window)
                    print(
                        f"| {now - started:.0f} | {sent.value:,} | {applied:,.0f} | {rss:.0f} "
                        f"| {statistics.median(ordered) * 1000:.1f} "
                        f"| {ordered[int(0.95 * len(ordered))] * 1000:.1f} "
                        f"| {ordered[-1] * 1000:.1f} |",
                        flush=True,
                    )
                    window = []
                    next_report += args.report_every
                    if not proc.is_alive():
                        break
                time.sleep(0.02)
            proc.join()
            ordered = sorted(all_lat)
            print()
            print(
                f"whole run: /live p95 {ordered[int(0.95 * len(ordered))] * 1000:.1f} ms, max "
                f"{ordered[-1] * 1000:.1f} ms over {len(ordered)} probes; RSS peak {peak:.0f} MB "
                f"(start {baseline:.0f} MB)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
