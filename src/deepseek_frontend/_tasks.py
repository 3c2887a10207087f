"""Small asyncio helpers shared by the layers that own background tasks (engine pool, KV event
subscriber, simulated engine's KV publisher)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]


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
