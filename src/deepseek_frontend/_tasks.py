"""Small asyncio helpers shared by the layers that own background tasks (engine pool, KV event
subscriber, simulated engine's KV publisher, the SSE responses of the API and the simulated engine)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["DisconnectWatch", "cancel_and_wait"]


async def cancel_and_wait(*tasks: asyncio.Task[Any]) -> None:
    """Cancel every task, then wait for each to finish in order.

    A task's :class:`asyncio.CancelledError` is swallowed (that is how a cancelled task ends);
    any other exception a task ends with propagates.
    """
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


class DisconnectWatch:
    """Cancels the current task when the ASGI client disconnects (``receive`` yields ``http.disconnect``).

    For a streaming response written by the request's own task: :attr:`gone` then tells the
    ``CancelledError`` that follows apart from any other cancellation. :meth:`stop` before the last
    body message (servers answer ``http.disconnect`` once a response is complete) and in ``finally``.
    """

    __slots__ = ("_task", "_watcher", "gone")

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self.gone = False
        self._task = asyncio.current_task()
        self._watcher: asyncio.Future[None] | None = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.gone = True
        if self._task is not None:
            self._task.cancel()

    def absorb(self) -> bool:
        """In ``except CancelledError``: True (and the cancellation undone) when the client's leaving
        caused it -- the normal end of an abandoned stream -- else False (re-raise)."""
        if not self.gone or self._task is None:
            return False
        self._task.uncancel()
        return True

    def stop(self) -> None:
        """End the watch. Idempotent.

        The reference to the watcher task is dropped as well: the cancelled task keeps its
        ``CancelledError``, whose traceback holds the watch's frame and with it this object. Kept,
        that is a reference cycle per request which only the cyclic GC frees, and it carries the
        whole request (ASGI cycle, transport, tasks): 30-odd objects a request for the collector
        to trace and free while the event loop waits.
        """
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
