"""Stream limits: what a worker pool bounds per engine request, and how it enforces the bounds.

A request waits briefly (FIFO) for a worker below its in-flight limit and for room under the pool's
total, then gets a 429 (``OverloadedError``); the shared HTTP client has that total plus a few control
connections, so streams never queue inside httpx and probes and aborts always find a connection.
Deadlines (first token, idle between chunks, whole request) are watched by one task per pool; on
expiry the engine request is aborted, the worker charged and ``EngineTimeoutError`` (504) raised.

:class:`StreamLimits` holds the bounds; :class:`CapacityAndDeadlines` is the part of
:class:`~deepseek_frontend.engines.pool.WorkerPool` that enforces them (the wait for a free slot and
the watchdog), and a :class:`Watch` is one request's current deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from deepseek_frontend.engines._http import RESPONSE_TIMEOUT_S
from deepseek_frontend.errors import EngineTimeoutError, EngineUnavailableError, OverloadedError
from deepseek_frontend.generation import EngineChunk

__all__ = ["CONTROL_CONNECTIONS", "CapacityAndDeadlines", "Occupancy", "Slot", "StreamLimits", "Watch"]

#: engine requests one worker runs at once (more wait for a slot; SGLang queues what it cannot batch)
MAX_IN_FLIGHT_PER_WORKER = 1024
#: engine requests all workers together run at once: the engine client's connection pool is sized to
#: this plus :data:`CONTROL_CONNECTIONS`, so a request never waits inside the HTTP client's pool
MAX_IN_FLIGHT = 1024
#: connections kept free of streams for health probes, aborts and discovery
CONTROL_CONNECTIONS = 32
#: seconds a request may wait for a free worker slot before it is refused (429)
CAPACITY_WAIT_S = 10.0
#: seconds from sending a request to its first token: a 1M-token prefill takes minutes
FIRST_TOKEN_TIMEOUT_S = 600.0
#: seconds a started stream may go without a chunk (decode steps take milliseconds)
IDLE_TIMEOUT_S = 60.0
#: seconds one engine request may take in all (1M tokens of prefill plus a long answer)
REQUEST_TIMEOUT_S = 3600.0


@dataclasses.dataclass(frozen=True, slots=True)
class StreamLimits:
    """What the pool bounds and checks per engine request (None disables a timeout).

    * ``max_in_flight_per_worker`` / ``max_in_flight``: a request waits (FIFO, at most
      ``capacity_wait_s``) until a worker below its limit exists and fewer than ``max_in_flight``
      requests run in all; then :class:`~deepseek_frontend.errors.OverloadedError` (429).
    * ``first_token_timeout_s``, ``idle_timeout_s`` (between chunks), ``request_timeout_s``
      (from the first attempt): on expiry the engine request is aborted, the worker is charged a
      failure and :class:`~deepseek_frontend.errors.EngineTimeoutError` (504) is raised.
    * ``response_timeout_s``: from sending a request to the worker's response headers (which
      SGLang and vLLM send before the prefill). On expiry the worker is ejected as silent, the
      request moves to another worker (nothing reached the client yet), and so do the other
      requests still waiting for their first token on it. Applied by the HTTP clients' stream
      session (:func:`from_urls` passes it on).
    * ``vocab_size``: a token id outside ``0..vocab_size-1`` is the worker's fault
      (:class:`~deepseek_frontend.errors.EngineStreamError`, or a retry before the first token).
      Output beyond the request's ``max_new_tokens`` is always cut (finish ``length``).
    """

    max_in_flight_per_worker: int = MAX_IN_FLIGHT_PER_WORKER
    max_in_flight: int = MAX_IN_FLIGHT
    capacity_wait_s: float = CAPACITY_WAIT_S
    first_token_timeout_s: float | None = FIRST_TOKEN_TIMEOUT_S
    idle_timeout_s: float | None = IDLE_TIMEOUT_S
    request_timeout_s: float | None = REQUEST_TIMEOUT_S
    vocab_size: int | None = None
    response_timeout_s: float | None = RESPONSE_TIMEOUT_S

    @property
    def watched(self) -> bool:
        """Whether any deadline applies (else the watchdog never runs)."""
        return (
            self.first_token_timeout_s is not None
            or self.idle_timeout_s is not None
            or self.request_timeout_s is not None
        )

    @property
    def watch_interval_s(self) -> float:
        """How often the watchdog looks: a quarter of the shortest timeout, at most a second."""
        set_ = [t for t in (self.first_token_timeout_s, self.idle_timeout_s, self.request_timeout_s) if t]
        return max(0.01, min([1.0, *(t / 4 for t in set_)]))


class Watch:
    """The deadline of one request's current wait on its worker (read by the watchdog).

    ``task`` is set only while the request awaits the worker, so a deadline never interrupts the
    consumer's own work (a slow client write, say); ``fired`` tells the waiter why it was cancelled,
    ``moved`` that its worker was found silent and the request should try another.
    """

    __slots__ = ("deadline", "end", "fired", "limit_s", "moved", "task", "what")

    def __init__(self, now: float, request_timeout_s: float | None) -> None:
        self.end = now + request_timeout_s if request_timeout_s is not None else None
        self.deadline = 0.0
        self.task: asyncio.Task[object] | None = None
        self.fired = ""
        self.moved = ""
        self.what = ""
        self.limit_s: float | None = None


class Occupancy(Protocol):
    """What the capacity check reads of a worker (a pool's :class:`~.workers.Worker`)."""

    healthy: bool
    in_flight: int


class Slot:
    """A place on one worker held before the request that will use it is sent
    (:meth:`CapacityAndDeadlines.reserve`): it counts in flight on the worker and in the pool from
    the moment it is taken, so no other request can take it. The request's stream consumes it
    (:meth:`claim`); one never sent gives it back with :meth:`release` (a no-op once claimed)."""

    __slots__ = ("_owner", "claimed", "worker")

    def __init__(self, owner: CapacityAndDeadlines, worker: Occupancy) -> None:
        self._owner = owner
        self.worker = worker
        self.claimed = False

    def claim(self) -> Occupancy:
        """The worker; from now on the request's stream gives the place back when it ends."""
        self.claimed = True
        return self.worker

    def release(self) -> None:
        """Give the place back if no request claimed it (idempotent)."""
        if not self.claimed:
            self.claimed = True
            self.worker.in_flight -= 1
            self._owner._total_in_flight -= 1
            self._owner._wake_capacity_waiter()


class CapacityAndDeadlines:
    """The part of :class:`~deepseek_frontend.engines.pool.WorkerPool` that enforces its
    :class:`StreamLimits`: a FIFO wait for a free slot, and a watchdog task that cancels a request's
    wait on its worker once the wait's deadline passes. The pool sets the attributes below."""

    limits: StreamLimits
    _workers: Sequence[Occupancy]
    #: engine requests running on all workers together
    _total_in_flight: int
    #: requests waiting for a free slot (oldest first; done futures are skipped)
    _capacity_waiters: deque[asyncio.Future[None]]
    #: deadlines of running requests, scanned by the watchdog task
    _watches: set[Watch]
    _watchdog: asyncio.Task[None] | None

    def _has_capacity(self) -> bool:
        limits = self.limits
        if self._total_in_flight >= limits.max_in_flight:
            return False
        cap = limits.max_in_flight_per_worker
        healthy = [w for w in self._workers if w.healthy]
        # with nothing admitted, _pick decides (a trial request or NoHealthyWorkerError)
        return not healthy or any(w.in_flight < cap for w in healthy)

    async def _await_capacity(self) -> None:
        """Return once a slot is free (FIFO among waiters); ``OverloadedError`` after ``capacity_wait_s``."""
        if not self._capacity_waiters and self._has_capacity():
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.capacity_wait_s
        while True:
            waiter: asyncio.Future[None] = loop.create_future()
            self._capacity_waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    await waiter
            except TimeoutError:
                raise OverloadedError(
                    f"every engine worker is at its limit of in-flight requests "
                    f"({self._total_in_flight} running); retry later",
                    retry_after_s=1,
                ) from None
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_capacity_waiter()  # pass the wake-up on
                waiter.cancel()
                raise
            if self._has_capacity():
                # let the next waiter check too: more than one slot may be free
                if self._capacity_waiters:
                    self._wake_capacity_waiter()
                return

    async def wait_for_capacity(self) -> None:
        """Return once some admitted worker is below its limit and the pool below its total, in
        arrival order with the pool's other waiters; ``OverloadedError`` (429) after
        ``capacity_wait_s``. Nothing is held: :meth:`reserve` takes the place."""
        await self._await_capacity()

    def has_capacity(self) -> bool:
        """Whether a request would find a place now (an admitted worker below its limit, the pool
        below its total; with no worker admitted, True: choosing one decides then)."""
        return self._has_capacity()

    def reserve(self, worker: Occupancy) -> Slot:
        """Hold a place on ``worker`` now (see :class:`Slot`); the caller checked it has room."""
        worker.in_flight += 1
        self._total_in_flight += 1
        return Slot(self, worker)

    def _wake_capacity_waiter(self) -> None:
        waiters = self._capacity_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _watch(self, watch: Watch) -> None:
        self._watches.add(watch)
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = asyncio.get_running_loop().create_task(self._watchdog_loop())

    async def _next(
        self, stream: AsyncIterator[EngineChunk], watch: Watch, timeout_s: float | None, what: str
    ) -> EngineChunk:
        """The stream's next chunk, or :class:`EngineTimeoutError` once this wait's deadline passes.

        The deadline is the sooner of ``timeout_s`` from now and the request's end. The watchdog
        cancels the waiting task at the deadline (closing the worker stream, which aborts the engine
        request); the cancellation is turned into the timeout error here. A request moved off a
        silent worker (:meth:`_silenced`) is cancelled the same way and gets
        :class:`EngineUnavailableError`, which the caller retries on another worker.
        """
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        if watch.end is not None and (deadline is None or watch.end < deadline):
            deadline, what, timeout_s = watch.end, "the end of the request", self.limits.request_timeout_s
        # no deadline: the task is still recorded, so a request can be moved off a silent worker
        watch.deadline = deadline if deadline is not None else float("inf")
        watch.what = what
        watch.limit_s = timeout_s
        watch.task = task = asyncio.current_task()
        try:
            return await anext(stream)
        except asyncio.CancelledError:
            if watch.moved and not watch.fired and task is not None and task.uncancel() == 0:
                raise EngineUnavailableError(watch.moved) from None
            if watch.fired and task is not None and task.uncancel() == 0:
                raise EngineTimeoutError(
                    f"the engine worker did not deliver {watch.fired} within {watch.limit_s:g} s; "
                    "the request was aborted"
                ) from None
            raise
        finally:
            watch.task = None

    async def _watchdog_loop(self) -> None:
        """Cancel requests whose wait on a worker passed its deadline; exits when none is watched."""
        interval = self.limits.watch_interval_s
        while self._watches:
            await asyncio.sleep(interval)
            now = asyncio.get_running_loop().time()
            for watch in list(self._watches):
                task = watch.task
                if task is not None and not watch.fired and now >= watch.deadline:
                    watch.fired = watch.what
                    task.cancel()
