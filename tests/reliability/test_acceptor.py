"""``serve`` accepts a burst of connections at once, however busy its event loop is (server/acceptor.py).

uvloop's own server accepts one connection per loop iteration, so on a busy loop the last of a
burst of arrivals waited for hundreds of iterations before it was even accepted
(benchmarks/bench_accept.py compares the two).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
import uvloop

from deepseek_frontend.server import acceptor as acceptor_module
from deepseek_frontend.server.acceptor import BulkAcceptor

pytestmark = pytest.mark.timeout(60)

CONNECTIONS = 200

#: a client in its own process (no GIL shared with the loop under test): connects, says so, waits
CLIENT = """
import socket, sys
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(int(sys.argv[2]))]
print("connected", flush=True)
sys.stdin.read()
"""


def _listening_socket(backlog: int) -> socket.socket:
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(backlog)
    return listening


class _Recorder(asyncio.Protocol):
    """Calls ``made(transport)`` on each connection."""

    def __init__(self, made: Callable[[asyncio.BaseTransport], object]) -> None:
        self.made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made(transport)


async def _accept_a_queued_burst() -> list[int]:
    """Queue ``CONNECTIONS`` connections in the kernel, then serve them while every loop iteration
    also carries 0.5 ms of other work; returns, per connection, the iteration that accepted it."""
    loop = asyncio.get_running_loop()
    iteration = 0
    accepted_at: list[int] = []

    def record(_: asyncio.BaseTransport) -> None:
        accepted_at.append(iteration)

    recorder = functools.partial(_Recorder, record)
    listening = _listening_socket(2048)
    client = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(listening.getsockname()[1]), str(CONNECTIONS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None and client.stdout.readline() == "connected\n"
        stop = False

        def busy_iteration() -> None:
            nonlocal iteration
            iteration += 1
            until = time.perf_counter() + 0.0005
            while time.perf_counter() < until:
                pass
            if not stop:
                loop.call_soon(busy_iteration)

        loop.call_soon(busy_iteration)
        acceptor = BulkAcceptor(loop, listening, recorder).start()
        for _ in range(3000):
            if len(accepted_at) == CONNECTIONS:
                break
            await asyncio.sleep(0)
        stop = True
        acceptor.close()
        assert acceptor.accepted == CONNECTIONS
        return accepted_at
    finally:
        client.kill()
        client.wait()
        listening.close()


def test_a_queued_burst_is_accepted_per_wake_up_on_a_busy_loop() -> None:
    """``per_wake`` (64) connections at each of the loop's iterations: 200 in 4."""
    accepted_at = uvloop.run(_accept_a_queued_burst())
    assert len(accepted_at) == CONNECTIONS
    assert max(accepted_at) - min(accepted_at) <= CONNECTIONS // 64, sorted(set(accepted_at))


def test_accepting_pauses_when_the_process_is_out_of_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    """EMFILE leaves the listening socket readable: the acceptor stops watching it for a while
    (no busy loop), then accepts what waited in the kernel's queue."""
    monkeypatch.setattr(acceptor_module, "PAUSE_S", 0.05)

    class Exhausted:
        def __init__(self, real: socket.socket) -> None:
            self.real = real
            self.failures = 1

        def setblocking(self, flag: bool) -> None:
            self.real.setblocking(flag)

        def fileno(self) -> int:
            return self.real.fileno()

        def accept(self) -> tuple[socket.socket, object]:
            if self.failures:
                self.failures -= 1
                raise OSError(errno.EMFILE, "Too many open files")
            return self.real.accept()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []

        listening = _listening_socket(16)
        sock = Exhausted(listening)
        acceptor = BulkAcceptor(loop, sock, functools.partial(_Recorder, made.append)).start()  # type: ignore[arg-type]
        client = socket.create_connection(listening.getsockname())
        try:
            for _ in range(200):
                if acceptor.paused:
                    break
                await asyncio.sleep(0.005)
            assert acceptor.paused == 1 and not made and not acceptor._watching
            for _ in range(200):
                if made:
                    break
                await asyncio.sleep(0.005)
            assert len(made) == 1 and acceptor.accepted == 1
        finally:
            acceptor.close()
            for transport in made:
                transport.close()
            client.close()
            listening.close()

    uvloop.run(scenario())


def test_a_connection_setup_is_stepped_through_futures_and_bare_yields_and_a_failure_closes_it() -> None:
    """The acceptor steps each connection's setup coroutine itself (no task per connection)."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        listening = _listening_socket(4)
        acceptor = BulkAcceptor(loop, listening, asyncio.Protocol)
        steps: list[str] = []

        async def setup(fail: bool) -> None:
            waiter = loop.create_future()
            loop.call_soon(waiter.set_result, None)
            await waiter
            steps.append("future")
            await asyncio.sleep(0)
            steps.append("bare yield")
            if fail:
                raise OSError("the transport could not be made")

        kept, other = socket.socketpair()
        acceptor._step(kept, setup(False), None)
        failed, other2 = socket.socketpair()
        acceptor._step(failed, setup(True), None)
        for _ in range(10):
            await asyncio.sleep(0)
        assert steps == ["future", "future", "bare yield", "bare yield"]
        assert kept.fileno() >= 0 and failed.fileno() == -1  # the failed one was closed
        for sock in (kept, other, other2, listening):
            sock.close()

    uvloop.run(scenario())


def test_declined_connections_wait_in_the_queue_are_looked_at_again_and_taken_once_admitted() -> None:
    """``admits`` saying no leaves connections in the kernel's queue for another process; the
    acceptor looks again every ``DEFER_S`` (not at every loop iteration) and takes them once
    admitted."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        listening = _listening_socket(64)
        made: list[asyncio.BaseTransport] = []
        admitting = False

        def admits(_taken: int) -> bool:
            return admitting

        acceptor = BulkAcceptor(loop, listening, functools.partial(_Recorder, made.append), admits=admits)
        acceptor.start()
        clients = [socket.create_connection(listening.getsockname()) for _ in range(5)]
        try:
            await asyncio.sleep(0.2)
            assert made == [] and acceptor.accepted == 0
            # looked at again about every DEFER_S while they wait, far fewer than loop iterations
            assert 10 <= acceptor.declined <= 0.2 / acceptor_module.DEFER_S + 10
            admitting = True
            await _until(lambda: len(made) == 5)
            assert acceptor.accepted == 5
        finally:
            _close_all(acceptor, made, clients, listening)

    uvloop.run(scenario())


def test_connections_left_queued_past_the_patience_are_taken_anyway() -> None:
    """A process leaves connections to a lighter sibling only for ``patience_s``: a sibling that does
    not take them (stopped, stuck) does not leave them waiting for ever."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        listening = _listening_socket(64)
        made: list[asyncio.BaseTransport] = []
        acceptor = BulkAcceptor(
            loop, listening, functools.partial(_Recorder, made.append), admits=lambda _: False, patience_s=0.1
        )
        acceptor.start()
        started = loop.time()
        clients = [socket.create_connection(listening.getsockname()) for _ in range(3)]
        try:
            await _until(lambda: len(made) == 3)
            assert loop.time() - started >= 0.1  # not before the patience ran out
            # a new connection after the queue emptied is declined again first
            declined = acceptor.declined
            clients.append(socket.create_connection(listening.getsockname()))
            await _until(lambda: acceptor.declined > declined)
            assert len(made) == 3
            await _until(lambda: len(made) == 4)
        finally:
            _close_all(acceptor, made, clients, listening)

    uvloop.run(scenario())


def _close_all(
    acceptor: BulkAcceptor,
    made: list[asyncio.BaseTransport],
    clients: list[socket.socket],
    listening: socket.socket,
) -> None:
    acceptor.close()
    for transport in made:
        transport.close()
    for client in clients:
        client.close()
    listening.close()


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition did not come true in time"
        await asyncio.sleep(0.005)
