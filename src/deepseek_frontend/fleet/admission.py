"""Admission control: a bounded number of requests in flight, a short bounded queue, then 429.

Without it a burst larger than what the workers (and the engine client's connection pool) can
hold piles up inside the server: every request holds its body, its prompt ids and a waiter in the
HTTP client's pool, whose scheduling costs grow with the number of waiters until the event loop
does nothing else. With it the server does a bounded amount of work at any time and tells the
excess at once to come back later (``429`` with ``Retry-After``), which every OpenAI and Anthropic
client retries with backoff.

:class:`Admission` is a FIFO semaphore whose waiting room is bounded in size (``max_queued``) and
in time (``queue_timeout_s``). It runs only on the event loop's thread (no locks). Handing a
released slot to the oldest waiter is O(1): waiters that timed out or were cancelled are skipped
when they reach the head of the queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from deepseek_frontend.errors import OverloadedError

log = logging.getLogger("deepseek_frontend.api")

#: requests served at once per frontend (rendering, tokenizing, streaming)
MAX_CONCURRENT_REQUESTS = 1024
#: requests that may wait for a slot; beyond it a 429 at once
MAX_QUEUED_REQUESTS = 256
#: seconds a request may wait for a slot before it gets a 429
QUEUE_TIMEOUT_S = 10.0
#: the ``Retry-After`` a refused request gets, in seconds
RETRY_AFTER_S = 1


class Admission:
    """``await acquire()`` before serving a request, ``release()`` exactly once when it is done.

    ``acquire`` returns at once while fewer than ``max_concurrent`` requests are admitted; else it
    waits in FIFO order for a released slot, at most ``queue_timeout_s`` seconds; when
    ``max_queued`` requests already wait, or the wait times out, it raises
    :class:`~deepseek_frontend.errors.OverloadedError` (429, ``Retry-After: retry_after_s``).
    ``rejected`` counts refusals (exported as a metric by the app).
    """

    __slots__ = (
        "_waiters",
        "active",
        "max_concurrent",
        "max_queued",
        "queue_timeout_s",
        "queued",
        "rejected",
        "retry_after_s",
    )

    def __init__(
        self,
        max_concurrent: int = MAX_CONCURRENT_REQUESTS,
        max_queued: int = MAX_QUEUED_REQUESTS,
        queue_timeout_s: float = QUEUE_TIMEOUT_S,
        retry_after_s: int = RETRY_AFTER_S,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self.max_concurrent = max_concurrent
        self.max_queued = max(0, max_queued)
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        self.active = 0
        #: waiters still counted in the queue (``_waiters`` may also hold abandoned futures)
        self.queued = 0
        self.rejected = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return (
            f"Admission(active={self.active}/{self.max_concurrent}, queued={self.queued}/{self.max_queued}, "
            f"rejected={self.rejected})"
        )

    def _refuse(self, why: str) -> OverloadedError:
        self.rejected += 1
        return OverloadedError(
            f"the server is overloaded ({why}); retry after {self.retry_after_s} s",
            retry_after_s=self.retry_after_s,
        )

    def can_enter(self) -> bool:
        """Whether :meth:`acquire` would return at once with a slot (it neither waits nor refuses)."""
        return self.active < self.max_concurrent and not self.queued

    async def acquire(self) -> None:
        """Take a slot, waiting in the bounded queue if needed; raises ``OverloadedError``."""
        refusal = await self.enter()
        if refusal is not None:
            raise refusal

    async def enter(self) -> OverloadedError | None:
        """:meth:`acquire`, but the refusal is returned rather than raised.

        Under a burst thousands of requests are refused per second; a raised error's traceback
        ties frames into reference cycles, garbage that only the cyclic collector frees (in
        pauses of the whole event loop).
        """
        if self.active < self.max_concurrent and not self.queued:
            self.active += 1
            return None
        if self.queued >= self.max_queued:
            return self._refuse(
                f"{self.active} requests in flight and {self.queued} waiting, the most this server takes"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self.queued += 1
        try:
            async with asyncio.timeout(self.queue_timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                # A slot was handed over just as the wait ended: it is ours, so honour it unless
                # the caller itself is being cancelled (then give it on to the next waiter).
                if isinstance(exc, TimeoutError):
                    return None
                self.release()
                raise
            waiter.cancel()
            self.queued -= 1
            if isinstance(exc, TimeoutError):
                return self._refuse(f"no request slot freed within {self.queue_timeout_s:g} s of waiting")
            raise
        return None

    def release(self) -> None:
        """Give the slot to the oldest live waiter, or free it."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                self.queued -= 1
                waiter.set_result(None)  # the slot moves on: ``active`` is unchanged
                return
        self.active -= 1
