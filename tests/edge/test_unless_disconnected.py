"""``unless_disconnected``: the work of a request runs in the request's own task, in the same step,
and the client leaving cancels it (edge/streaming.py).

Every request -- a follow-up or a new conversation -- is served this way: a task of its own would
start the engine call one turn of the event loop later and hand its answer back one turn later
again, which under a burst are tens of milliseconds each.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.requests import Request

from deepseek_frontend.edge.streaming import ClientGoneError, unless_disconnected
from deepseek_frontend.edge.turns import WARM_KEY


class _Client:
    """The ASGI ``receive`` of a request whose body was read: the next message is the disconnect,
    once :meth:`leave` is called."""

    def __init__(self) -> None:
        self._gone = asyncio.Event()

    def leave(self) -> None:
        self._gone.set()

    async def receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    def request(self, *, warm: bool = False) -> Request:
        scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
        scope["headers"] = []
        if warm:
            scope[WARM_KEY] = True
        return Request(scope, self.receive)


@pytest.mark.parametrize("warm", [False, True], ids=["new conversation", "follow-up"])
def test_the_work_runs_in_the_callers_task_before_anything_queued_meanwhile(warm: bool) -> None:
    async def main() -> None:
        client = _Client()
        caller = asyncio.current_task()
        order: list[str] = []
        asyncio.get_running_loop().call_soon(order.append, "next turn of the loop")

        async def work() -> str:
            order.append("work started")
            assert asyncio.current_task() is caller
            return "answer"

        assert await unless_disconnected(client.request(warm=warm), work()) == "answer"
        order.append("caller goes on")
        # the work started, and its answer reached the caller, before the loop's next turn
        assert order[:2] == ["work started", "caller goes on"]

    asyncio.run(main())


def test_a_client_that_leaves_cancels_the_work_and_the_caller_can_go_on() -> None:
    async def main() -> None:
        client = _Client()
        started = asyncio.Event()
        cancelled: list[bool] = []

        async def work() -> None:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(True)  # where an engine stream is closed and its request aborted
                raise

        async def leave_once_started() -> None:
            await started.wait()
            client.leave()

        leaving = asyncio.ensure_future(leave_once_started())
        # awaited in this task, as a handler awaits it (without it, the work ends after 30 s and
        # no ClientGoneError is raised)
        with pytest.raises(ClientGoneError):
            await unless_disconnected(client.request(), work())
        await leaving
        assert cancelled == [True]
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # the cancellation was absorbed
        await asyncio.sleep(0)  # the caller's task still runs: it can answer 499 and log it

    asyncio.run(main())


def test_a_cancellation_from_outside_is_not_taken_for_the_client_leaving() -> None:
    async def main() -> None:
        client = _Client()
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            await asyncio.sleep(30)

        async def caller() -> None:
            await unless_disconnected(client.request(), work())

        task = asyncio.ensure_future(caller())
        await started.wait()
        task.cancel()  # e.g. the server shutting down
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
