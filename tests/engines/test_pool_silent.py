"""WorkerPool: a worker found silent (no response headers) is ejected and the requests waiting on it
move; a pool started without waiting for discovery refuses requests with a 503 to retry later.

The HTTP side (the response timeout itself, against real sockets) is in
tests/reliability/test_silent_worker.py; here scripted clients make the order of events exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from deepseek_frontend.engines.base import EngineChunk, EngineClient, GenerateRequest, WorkerCapabilities
from deepseek_frontend.engines.pool import StreamLimits, WorkerPool
from deepseek_frontend.errors import NoHealthyWorkerError, WorkerSilentError, WorkersStartingError

from .conftest import collect, request_for, wait_until

pytestmark = pytest.mark.timeout(30)


class Worker(EngineClient):
    """``silent``: a request named ``trigger`` fails with :class:`WorkerSilentError`, every other one
    waits forever for its first token; otherwise two tokens. ``discovered`` gates :meth:`discover`."""

    def __init__(self, name: str, *, silent: bool = False) -> None:
        self.name = name
        self.silent = silent
        self.waiting = 0
        self.left: list[str] = []
        self.discovered: asyncio.Event | None = None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        if self.silent:
            if request.request_id == "trigger":
                raise WorkerSilentError(f"{self.name}: no response headers within 1 s")
            self.waiting += 1
            try:
                await asyncio.Event().wait()  # no headers, ever
            finally:
                self.left.append(request.request_id)
        yield EngineChunk([7])
        yield EngineChunk([1], "stop", 1)

    async def abort(self, request_id: str) -> None:
        return None

    async def check_health(self) -> bool:
        return True

    async def discover(self) -> WorkerCapabilities | None:
        if self.discovered is not None:
            await self.discovered.wait()
        return WorkerCapabilities(context_length=4096)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_requests_waiting_on_a_worker_found_silent_move_to_another_at_once() -> None:
    silent, good = Worker("silent", silent=True), Worker("good")
    # the first-token timeout is the default 600 s: only the move can end the wait
    pool = WorkerPool([silent], health_interval_s=0, limits=StreamLimits())

    async def scenario() -> None:
        waiting = [asyncio.create_task(collect(pool, request_for([1], rid=f"r{i}"))) for i in range(3)]
        await wait_until(lambda: silent.waiting == 3)
        pool.add_client(good)
        # another request on it finds the worker silent (its headers timed out)
        with pytest.raises(NoHealthyWorkerError) as err:
            async for _ in pool.generate_on("silent", request_for([1], rid="trigger")):
                pass
        assert "no response headers" in err.value.message
        done = await asyncio.wait_for(asyncio.gather(*waiting), 10)  # a hang detector, not a speed test
        assert [ids for ids, _ in done] == [[7, 1]] * 3
        assert sorted(silent.left) == ["r0", "r1", "r2"]  # their streams on it were closed
        status = {s.url: s for s in pool.statuses()}
        assert status["silent"].healthy is False
        assert "no response headers" in (status["silent"].last_error or "")
        assert status["good"].healthy is True
        # the silent worker was charged once, not once per moved request
        assert status["silent"].extra["failures"] == 1
        await pool.aclose()

    run(scenario())


def test_a_passing_probe_does_not_readmit_a_silent_worker_before_the_readmission_wait() -> None:
    silent, good = Worker("silent", silent=True), Worker("good")
    now = [0.0]
    pool = WorkerPool([silent, good], health_interval_s=0, readmit_after_s=30, clock=lambda: now[0])

    async def scenario() -> None:
        with pytest.raises(NoHealthyWorkerError):
            async for _ in pool.generate_on("silent", request_for([1], rid="trigger")):
                pass
        await pool.check_all()  # its /server_info answers
        assert {s.url: s.healthy for s in pool.statuses()} == {"silent": False, "good": True}
        now[0] = 31.0
        await pool.check_all()
        assert {s.url: s.healthy for s in pool.statuses()} == {"silent": True, "good": True}
        await pool.aclose()

    run(scenario())


def test_a_pool_still_discovering_its_workers_refuses_with_retry_after() -> None:
    worker = Worker("w")
    worker.discovered = asyncio.Event()
    pool = WorkerPool([worker], health_interval_s=0)

    async def scenario() -> None:
        await pool.start(wait_for_discovery=False)  # returns while discovery waits
        [status] = pool.statuses()
        assert status.healthy is False and status.extra["discovery"] == "pending"
        assert pool.healthy_count == 0
        with pytest.raises(WorkersStartingError) as err:
            await collect(pool, request_for([1]))
        assert err.value.status_code == 503 and err.value.retry_after_s >= 1
        worker.discovered.set()
        await pool.wait_discovered()
        [status] = pool.statuses()
        assert status.healthy is True and "discovery" not in status.extra
        assert pool.capabilities() is not None and pool.capabilities().context_length == 4096
        ids, _ = await collect(pool, request_for([1]))
        assert ids == [7, 1]
        await pool.aclose()

    run(scenario())
