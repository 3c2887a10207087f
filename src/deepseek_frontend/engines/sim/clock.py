"""The simulated engine's decode-step clock, and what a prefill does to it.

A real engine decodes its whole running batch in lockstep, one step at a time, and runs a
prefill batch *instead of* a decode step: SGLang's scheduler picks a new prefill batch first
whenever one is ready (``get_next_batch_to_run``: "Run prefill first if possible"), so while a
prompt's chunks are being prefilled no running stream gets a token. :class:`StepClock` models
that: :meth:`StepClock.hold` makes the worker busy for a prefill chunk's time, and every step
boundary that would have fallen inside it moves past it.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["StepClock"]


class StepClock:
    """One decode-step timer shared by all running streams of an engine.

    A real engine decodes its whole batch in lockstep: every running request gets its next
    chunk at the same step boundary, one step every ``period`` seconds. Waiting here instead of
    ``asyncio.sleep(itl)`` per stream gives that cadence (a late loop does not stretch each
    stream's interval: the next step is due one period after the previous one, or at once
    when the loop is more than a period behind) and costs one timer per step, not one per
    stream and token -- at 256 streams the per-stream timers were a large part of the sim's
    CPU per token. A clock is bound to the event loop that last used it.

    :meth:`steps` counts the step boundaries passed so far on the clock's grid of times -- also
    those a late loop fired as one, and those that passed while no stream waited -- so a stream
    knows how many steps of output are ready when it comes back late. After an idle spell (no
    step for two periods) the grid restarts a full period after the next waiter arrives.

    :meth:`hold` occupies the worker with something else (a prefill): no boundary passes until it
    ends, and the grid restarts from its end.
    """

    __slots__ = ("_handle", "_index", "_last", "_loop", "_pending_hold", "_period", "_thread", "_waiters")

    def __init__(self, period: float) -> None:
        if period <= 0:
            raise ValueError("a step clock needs a positive period")
        self._period = period
        self._loop: asyncio.AbstractEventLoop | None = None
        #: the thread that runs ``_loop``
        self._thread = 0
        self._handle: asyncio.TimerHandle | None = None
        self._waiters: list[asyncio.Future[None]] = []
        #: boundaries counted up to the grid time ``_last``
        self._index = 0
        self._last = 0.0
        #: a hold that begins when the step in progress completes: (seconds, carries_step)
        self._pending_hold: tuple[float, bool] | None = None

    @property
    def period(self) -> float:
        return self._period

    def _bound(self) -> asyncio.AbstractEventLoop:
        # Every stream asks on every step: the loop it is bound to, while that loop runs on this
        # thread, is the running one. ``asyncio.get_running_loop()`` would make a getpid() system
        # call each time on CPython 3.11 (its fork check): 8% of the event loop's CPU at 1,024
        # streams, the most of it from here.
        loop = self._loop
        if loop is not None and self._thread == threading.get_ident() and loop.is_running():
            return loop
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._handle, self._waiters, self._index = loop, None, [], 0
            self._last = loop.time()
        self._thread = threading.get_ident()
        return loop

    def bind(self) -> asyncio.AbstractEventLoop:
        """Bind the clock to the running loop (a new loop starts it afresh) and return the loop: a
        stream binds once, then asks :meth:`steps_at` and :meth:`wait` on every step."""
        return self._bound()

    def steps(self) -> int:
        """Step boundaries passed by now (monotonic; differences count the steps between two calls)."""
        return self.steps_at(self._bound().time())

    def steps_at(self, now: float) -> int:
        """:meth:`steps` at ``now`` (the bound loop's time, :meth:`bind`)."""
        passed = int((now - self._last) / self._period)
        return self._index + passed if passed > 0 else self._index

    def next_step(self) -> asyncio.Future[None]:
        """A future resolved at the next step boundary."""
        self._bound()
        return self.wait()

    def wait(self) -> asyncio.Future[None]:
        """:meth:`next_step` on the loop the clock is bound to (:meth:`bind`)."""
        loop = self._loop
        assert loop is not None, "wait() before bind()"
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        if self._handle is None:
            now = loop.time()
            period = self._period
            if now - self._last > 2 * period:
                # idle for a while: count the steps that passed, then the next is a full period away
                self._index = self.steps()
                self._last = now
            self._handle = loop.call_at(max(self._last + period, now), self._step)
        return waiter

    def hold(self, seconds: float, *, carries_step: bool = False) -> float:
        """Make the worker busy for ``seconds`` (a prefill): no step boundary passes inside the hold.

        Without ``carries_step`` the decode step in progress (one streams are waiting for) completes
        first -- a scheduler starts the next batch only when the running one is done -- and the hold
        begins at its boundary; the next step then completes a full period after the hold. With
        ``carries_step`` (SGLang's ``--enable-mixed-chunk``: the running batch rides in the prefill
        chunk) the hold begins now and the step in progress completes at its end.

        Returns the seconds until the hold begins (what the prefill waits before it runs).
        """
        loop = self._bound()
        now = loop.time()
        seconds = max(seconds, 0.0)
        handle = self._handle
        if handle is not None and not carries_step and handle.when() > now:
            self._pending_hold = (seconds, carries_step)
            return handle.when() - now
        self._index = self.steps()
        end = now + seconds
        self._last = end - self._period if carries_step else end
        if handle is not None:
            handle.cancel()
            self._handle = loop.call_at(max(self._last + self._period, now), self._step)
        return 0.0

    def _step(self) -> None:
        self._handle = None
        assert self._loop is not None
        # a late loop fires several boundaries at once: all of them count
        passed = max(1, int((self._loop.time() - self._last) / self._period))
        self._index += passed
        self._last += passed * self._period
        if self._pending_hold is not None:
            # the step in progress is done: the hold runs from its boundary
            seconds, carries_step = self._pending_hold
            self._pending_hold = None
            end = self._last + seconds
            self._last = end - self._period if carries_step else end
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():  # a cancelled stream's waiter
                waiter.set_result(None)
