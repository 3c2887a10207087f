"""How a busy event loop accepts a burst of connections: uvloop's server, asyncio's, ``BulkAcceptor``.

Run by hand (not a test)::

    python benchmarks/bench_accept.py                 # 257 connections, 0 / 0.5 / 2 ms per iteration
    python benchmarks/bench_accept.py --connections 1024 --busy-ms 1

Each row: a listening socket; a callback chain that keeps the loop busy for ``busy`` ms per
iteration (the steps of the requests already accepted, in a real burst); a client in another
process (no GIL shared) that makes all connections as fast as it can. Columns: when the client had
made them all, when the first / median / last was accepted (``connection_made``), all from the
client's start, and the loop iterations that accepted them. What ``serve`` uses is the last row
(``api/acceptor.py``); uvloop's own server takes about one connection per busy iteration.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import uvloop

from deepseek_frontend.server.acceptor import BulkAcceptor

CLIENT = """
import socket, sys, time
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(int(sys.argv[2]))]
print(time.perf_counter(), flush=True)
sys.stdin.read()
"""


async def one_row(how: str, connections: int, busy_s: float) -> str:
    loop = asyncio.get_running_loop()
    iteration = 0
    accepted: list[tuple[float, int]] = []
    stop = False

    class Recorder(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.append((time.perf_counter(), iteration))

    def busy_iteration() -> None:
        nonlocal iteration
        iteration += 1
        until = time.perf_counter() + busy_s
        while time.perf_counter() < until:
            pass
        if not stop:
            loop.call_soon(busy_iteration)

    listening = socket.create_server(("127.0.0.1", 0), backlog=4096)
    close: Callable[[], object]
    if how == "BulkAcceptor":
        close = BulkAcceptor(loop, listening, Recorder).start().close
    else:
        close = (await loop.create_server(Recorder, sock=listening, backlog=4096)).close
    loop.call_soon(busy_iteration)
    started = time.perf_counter()
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(listening.getsockname()[1]), str(connections)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.perf_counter() + 60
        while len(accepted) < connections and time.perf_counter() < deadline:
            await asyncio.sleep(0)
        stop = True
        assert client.stdout is not None
        connected = float(client.stdout.readline())
    finally:
        client.kill()
        client.wait()
        close()
        listening.close()
    times = sorted((t - started) * 1000 for t, _ in accepted)
    iterations = {i for _, i in accepted}
    return (
        f"| {how} | {busy_s * 1000:g} | {(connected - started) * 1000:.1f} | {times[0]:.1f} "
        f"| {times[len(times) // 2]:.1f} | {times[-1]:.1f} | {len(iterations)} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=257)
    parser.add_argument("--busy-ms", type=float, nargs="*", default=[0.0, 0.5, 2.0])
    args = parser.parse_args()
    print(f"{args.connections} connections made at once by another process")
    print("| accepted by | busy ms per iteration | all connected (ms) | first | median | last | iterations |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for busy_ms in args.busy_ms:
        for how, run in (
            ("uvloop's server", uvloop.run),
            ("asyncio's server", asyncio.run),
            ("BulkAcceptor", uvloop.run),
        ):
            print(run(one_row(how, args.connections, busy_ms / 1000)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
