"""Admission control: a bounded number of requests in flight, a short bounded queue ordered by
priority, then 429.

Without it a burst larger than what the workers (and the engine client's connection pool) can
hold piles up inside the server: every request holds its body, its prompt ids and a waiter in the
HTTP client's pool, whose scheduling costs grow with the number of waiters until the event loop
does nothing else. With it the server does a bounded amount of work at any time and tells the
excess at once to come back later (``429`` with ``Retry-After``), which every OpenAI and Anthropic
client retries with backoff.

:class:`Admission` is a semaphore whose waiting room is bounded in size (``max_queued``) and in
time (``queue_timeout_s``, and each request's own deadline). A released slot goes to the waiter
with the highest priority; among equals, to the one that would be given up first -- its deadline,
or for a request without one the end of its ``queue_timeout_s`` (so requests without deadlines
are served in arrival order, and one with a deadline goes ahead of them only if it must). Under
overload the lowest priorities lose first: a request arriving at a full queue takes the place of
the lowest-priority waiter (the newest among equals) if it is strictly more important -- that
waiter is answered at once -- and is refused itself otherwise.

A preempted waiter gets the same answer as a full queue: ``429`` with ``Retry-After``. It lost a
contest for capacity, like a request refused at a full queue; nothing failed (a ``503`` would count
as the server's fault in every dashboard and alert), and every OpenAI and Anthropic client, and the
batch runner (api/batches/execute.py), retries a 429 after ``Retry-After``. A waiter whose deadline
passes is answered at once with ``408`` (:class:`~deepseek_frontend.errors.DeadlineExceededError`):
it is never served late, and never dropped without an answer.

It runs only on the event loop's thread (no locks). The queue is a heap: taking the best waiter
costs O(log n); waiters that left (timed out, cancelled, preempted) stay in it until they reach
its top, or until they are the majority, when the heap is rebuilt without them. Finding the
lowest-priority waiter to preempt scans the queue (at most ``max_queued`` entries), which happens
only when the queue is full.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging

from deepseek_frontend.errors import DeadlineExceededError, FrontendError, OverloadedError

log = logging.getLogger("deepseek_frontend.api")

#: requests served at once per frontend (rendering, tokenizing, streaming)
MAX_CONCURRENT_REQUESTS = 1024
#: requests that may wait for a slot; beyond it a 429 at once
MAX_QUEUED_REQUESTS = 256
#: seconds a request may wait for a slot before it gets a 429
QUEUE_TIMEOUT_S = 10.0
#: the ``Retry-After`` a refused request gets, in seconds
RETRY_AFTER_S = 1


class _Waiter:
    """One queued request: its priority and the future its outcome is set on (None: a slot was
    handed over; an error: it was preempted)."""

    __slots__ = ("future", "priority", "seq")

    def __init__(self, priority: int, seq: int, future: asyncio.Future[FrontendError | None]) -> None:
        self.priority = priority
        self.seq = seq
        self.future = future


class Admission:
    """``await acquire()`` before serving a request, ``release()`` exactly once when it is done.

    ``enter(priority, deadline)`` returns at once while fewer than ``max_concurrent`` requests are
    admitted and nobody waits; else it waits for a released slot in priority order (see the module
    docstring), at most ``queue_timeout_s`` seconds and never past ``deadline`` (the event loop's
    clock). Refusals: :class:`~deepseek_frontend.errors.OverloadedError` (429,
    ``Retry-After: retry_after_s``) for a full queue, a wait past ``queue_timeout_s`` or a waiter
    preempted by a more important arrival; :class:`~deepseek_frontend.errors.DeadlineExceededError`
    (408) for a deadline that passed. ``rejected`` counts the 429s (exported as a metric by the
    app), ``preempted`` the waiters among them that lost their place, ``expired`` the 408s.
    """

    __slots__ = (
        "_dead",
        "_seq",
        "_waiters",
        "active",
        "expired",
        "max_concurrent",
        "max_queued",
        "preempted",
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
        #: waiters still counted in the queue (``_waiters`` may also hold ones that left)
        self.queued = 0
        self.rejected = 0
        self.preempted = 0
        self.expired = 0
        #: the heap: (-priority, give-up time, arrival number, waiter)
        self._waiters: list[tuple[int, float, int, _Waiter]] = []
        #: entries of ``_waiters`` whose waiter left
        self._dead = 0
        self._seq = itertools.count()

    def __repr__(self) -> str:
        return (
            f"Admission(active={self.active}/{self.max_concurrent}, queued={self.queued}/{self.max_queued}, "
            f"rejected={self.rejected}, preempted={self.preempted}, expired={self.expired})"
        )

    def _refuse(self, why: str) -> OverloadedError:
        self.rejected += 1
        return OverloadedError(
            f"the server is overloaded ({why}); retry after {self.retry_after_s} s",
            retry_after_s=self.retry_after_s,
        )

    def _expire(self, budget_ms: int | None, where: str) -> DeadlineExceededError:
        self.expired += 1
        budget = f" (x-request-timeout-ms: {budget_ms})" if budget_ms is not None else ""
        return DeadlineExceededError(
            f"the request's time budget{budget} ran out {where} "
            f"({self.active} requests in flight, {self.queued} waiting); it was not served"
        )

    def can_enter(self) -> bool:
        """Whether :meth:`enter` would return at once with a slot (it neither waits nor refuses)."""
        return self.active < self.max_concurrent and not self.queued

    async def acquire(self, priority: int = 0, deadline: float | None = None) -> None:
        """Take a slot, waiting in the bounded queue if needed; raises the refusal."""
        refusal = await self.enter(priority, deadline)
        if refusal is not None:
            raise refusal

    async def enter(
        self, priority: int = 0, deadline: float | None = None, *, budget_ms: int | None = None
    ) -> FrontendError | None:
        """:meth:`acquire`, but the refusal is returned rather than raised. ``budget_ms``: the
        client's budget behind ``deadline``, named in a 408's message.

        Under a burst thousands of requests are refused per second; a raised error's traceback
        ties frames into reference cycles, garbage that only the cyclic collector frees (in
        pauses of the whole event loop).
        """
        if self.active < self.max_concurrent and not self.queued:
            self.active += 1
            return None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if deadline is not None and now >= deadline:
            return self._expire(budget_ms, "before it could queue for a request slot")
        if self.queued >= self.max_queued:
            victim = self._lowest() if self.queued else None
            if victim is None or victim.priority >= priority:
                return self._refuse(
                    f"{self.active} requests in flight and {self.queued} waiting, the most this server "
                    "takes, none of them less important than this one"
                    if self.queued
                    else f"{self.active} requests in flight and no queue"
                )
            self._preempt(victim)
        until = now + self.queue_timeout_s
        by_deadline = deadline is not None and deadline <= until
        if by_deadline:
            until = deadline  # type: ignore[assignment]
        waiter = _Waiter(priority, next(self._seq), loop.create_future())
        heapq.heappush(self._waiters, (-priority, until, waiter.seq, waiter))
        self.queued += 1
        future = waiter.future
        try:
            async with asyncio.timeout_at(until):
                return await future
        except BaseException as exc:
            if future.done() and not future.cancelled():
                outcome = future.result()
                # A slot was handed over (or the waiter preempted) just as the wait ended: a slot is
                # ours, so honour it unless the caller itself is being cancelled (then give it on).
                if not isinstance(exc, TimeoutError):
                    if outcome is None:
                        self.release()
                    raise
                return outcome
            future.cancel()
            self.queued -= 1
            self._left()
            if isinstance(exc, TimeoutError):
                if by_deadline:
                    return self._expire(budget_ms, "while it waited for a request slot")
                return self._refuse(f"no request slot freed within {self.queue_timeout_s:g} s of waiting")
            raise

    def _lowest(self) -> _Waiter | None:
        """The waiter a more important arrival may take the place of: the lowest priority, the
        newest among equals (as SGLang picks the request its full queue aborts)."""
        lowest: _Waiter | None = None
        for _, _, _, waiter in self._waiters:
            if waiter.future.done():
                continue
            if lowest is None or (waiter.priority, -waiter.seq) < (lowest.priority, -lowest.seq):
                lowest = waiter
        return lowest

    def _preempt(self, waiter: _Waiter) -> None:
        """Answer ``waiter`` at once with a 429: a more important request takes its place."""
        self.preempted += 1
        self.queued -= 1
        self._left()
        waiter.future.set_result(
            self._refuse(
                f"a more important request took this one's place in the full queue of {self.max_queued} "
                f"(priority {waiter.priority}; {self.active} requests in flight)"
            )
        )

    def _left(self) -> None:
        """A waiter left the queue before its turn: rebuild the heap once most of it is such."""
        self._dead += 1
        waiters = self._waiters
        if self._dead > 64 and self._dead * 2 > len(waiters):
            self._waiters = [entry for entry in waiters if not entry[3].future.done()]
            heapq.heapify(self._waiters)
            self._dead = 0

    def release(self) -> None:
        """Give the slot to the best live waiter, or free it."""
        waiters = self._waiters
        while waiters:
            waiter = heapq.heappop(waiters)[3]
            if not waiter.future.done():
                self.queued -= 1
                waiter.future.set_result(None)  # the slot moves on: ``active`` is unchanged
                return
            self._dead = max(0, self._dead - 1)
        self.active -= 1
