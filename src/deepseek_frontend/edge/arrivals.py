"""The order in which arriving requests start: follow-ups of recent conversations at once, the rest paced.

One event loop serves every connection. When hundreds of requests arrive together, each one's
first application step (routing, admission, reading and parsing the body, rendering) is queued
on the loop at once, so a follow-up whose prompt is in the caches -- a millisecond of work --
waits behind the first steps of every new conversation that arrived before it, and then behind
their tokenizing and engine calls. ``LoopTurns`` orders that work once it has started; this
orders what starts at all.

The HTTP protocol (:mod:`deepseek_frontend.server.http_protocol`) reads a ``POST`` request's head
and the first :data:`~deepseek_frontend.edge.turns.HEAD_BYTES` of its body before it creates the
request's ASGI task, and judges it with :class:`~deepseek_frontend.edge.turns.RecentHeads`:

* a **warm** request (its body starts like a recent one: an agent resending its conversation)
  starts at once (:meth:`ArrivalPacer.warm_started`), and is counted until it answers (its
  response starts) or ends;
* a **cold** one waits in a FIFO (:meth:`ArrivalPacer.hold`). Each loop iteration starts
  ``per_tick_idle`` of them while no warm request is waiting for its answer, and
  ``per_tick_while_warm`` while some are, so a burst's new conversations never fill one iteration
  with their first steps. A request held ``max_hold_s`` goes at ``per_tick`` per iteration
  whatever arrives after it.

  ``per_tick_idle`` is larger than ``per_tick`` because the loop's iterations are long when it
  has most to start: under a burst an iteration carries every started stream's chunk, 20-100 ms
  at 1,024 streams, and 8 starts per iteration then took 2 s to start 1,024 requests whose bytes
  had all been read within 100 ms (about half the runs at 1,024 unique streams with one process:
  39-49K tokens/s, against 55-66K with 64 per iteration or more). A started request's first
  steps wait for a loop turn (``LoopTurns``), so what 64 starts add to one iteration is 64 tasks'
  steps up to that wait.
* **connections still arriving** count like warm requests waiting: a new connection is
  :meth:`~ArrivalPacer.connection_arrived` until its first request has been judged (or it
  closes, or ``max_hold_s`` passes), and no cold request starts while one is. In a burst the
  follow-up may be the last connection accepted; cold requests started before its body is read
  would sit in front of it.

Nothing is refused or lost here: a held request is only started later, and admission control
(429) still applies once it starts. A wrong verdict only reorders starts. A held request whose
client went away is dropped without starting. Everything runs on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable

#: cold requests started per loop iteration while no warm request waits for its answer (and no
#: new connection is being read)
PER_TICK_IDLE = 64
#: ... held ``max_hold_s`` while warm requests still wait
PER_TICK = 8
#: ... and while some do (0: held until the warm ones answer, or until ``MAX_HOLD_S``)
PER_TICK_WHILE_WARM = 0
#: seconds a cold request is held at most, however many warm requests arrive meanwhile
MAX_HOLD_S = 0.05

#: ``start()`` creates the request's task; ``alive()`` is false once its client has gone
Start = Callable[[], None]
Alive = Callable[[], bool]


class ArrivalPacer:
    """Counts warm arrivals until they answer and paces cold ones (see the module docstring).

    Counters ``warm`` and ``cold`` (arrivals started so far) and ``held`` (cold ones waiting now)
    are read by the metrics.
    """

    __slots__ = (
        "_arriving",
        "_held",
        "_loop",
        "_scheduled",
        "cold",
        "max_hold_s",
        "per_tick",
        "per_tick_idle",
        "per_tick_while_warm",
        "warm",
        "warm_waiting",
    )

    def __init__(
        self,
        per_tick: int = PER_TICK,
        per_tick_while_warm: int = PER_TICK_WHILE_WARM,
        max_hold_s: float = MAX_HOLD_S,
        per_tick_idle: int = PER_TICK_IDLE,
    ) -> None:
        if per_tick < 1 or per_tick_idle < 1:
            raise ValueError(
                f"per_tick and per_tick_idle must be at least 1, got {per_tick} and {per_tick_idle}"
            )
        self.per_tick = per_tick
        self.per_tick_idle = per_tick_idle
        self.per_tick_while_warm = max(0, per_tick_while_warm)
        self.max_hold_s = max_hold_s
        #: warm requests started that have not answered yet
        self.warm_waiting = 0
        self.warm = 0
        self.cold = 0
        self._held: deque[tuple[float, Start, Alive]] = deque()
        #: connections whose first request has not been judged yet -> when they stop counting
        self._arriving: OrderedDict[object, float] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        #: a tick (``call_soon``) or a deadline timer is pending
        self._scheduled: asyncio.Handle | None = None

    @property
    def held(self) -> int:
        return len(self._held)

    def __repr__(self) -> str:
        return f"ArrivalPacer(warm_waiting={self.warm_waiting}, held={len(self._held)})"

    def warm_started(self) -> Callable[[], None]:
        """Count a warm arrival, which the caller starts at once; returns the idempotent callable
        that marks it answered (on its response's first message, or when its task ends)."""
        self.warm += 1
        self.warm_waiting += 1
        answered = False

        def mark_answered() -> None:
            nonlocal answered
            if not answered:
                answered = True
                self.warm_waiting -= 1
                if self._held and not self._waiting():
                    self._schedule_tick()

        return mark_answered

    def connection_arrived(self, key: object) -> None:
        """Count a new connection as arriving (until :meth:`connection_settled` or ``max_hold_s``)."""
        self._arriving[key] = time.monotonic() + self.max_hold_s

    def connection_settled(self, key: object) -> None:
        """The connection's first request was judged (or it closed): it no longer holds cold starts."""
        if self._arriving.pop(key, None) is not None and self._held and not self._waiting():
            self._schedule_tick()

    def _waiting(self, now: float | None = None) -> bool:
        """Whether cold starts wait: a warm request has not answered, or a connection is arriving."""
        if self.warm_waiting:
            return True
        arriving = self._arriving
        if arriving:
            now = time.monotonic() if now is None else now
            while arriving and next(iter(arriving.values())) <= now:
                arriving.popitem(last=False)  # counted its max_hold_s: a silent client holds no more
        return bool(arriving)

    def hold(self, start: Start, alive: Alive) -> None:
        """Queue a cold arrival: ``start()`` runs in a later loop iteration (within ``max_hold_s``)
        unless ``alive()`` is false by then."""
        self._held.append((time.monotonic() + self.max_hold_s, start, alive))
        if self._scheduled is None:
            self._schedule_tick()

    def _schedule_tick(self) -> None:
        if self._scheduled is not None:
            self._scheduled.cancel()
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._scheduled = self._loop.call_soon(self._tick)

    def _tick(self) -> None:
        self._scheduled = None
        held = self._held
        if not held:
            return
        now = time.monotonic()
        # Held past its deadline, the oldest goes at ``per_tick`` even while warm requests wait;
        # never more than ``per_tick_idle`` at once: a whole burst released in one iteration is
        # the stall this is here to prevent.
        overdue = held[0][0] <= now
        waiting = self._waiting(now)
        if not waiting:
            budget = self.per_tick_idle
        elif overdue:
            budget = self.per_tick
        else:
            budget = self.per_tick_while_warm
        while held and budget > 0:
            _, start, alive = held.popleft()
            if not alive():
                continue  # its client went away while it was held: nothing to serve
            self.cold += 1
            budget -= 1
            start()
        if not held:
            return
        loop = self._loop
        assert loop is not None
        if not waiting or self.per_tick_while_warm or held[0][0] <= now:
            self._scheduled = loop.call_soon(self._tick)  # more next iteration
        else:
            # held until a warm request answers or a connection settles (either schedules a
            # tick), or the oldest held deadline, or the oldest arriving connection stops counting
            wake = held[0][0]
            if self._arriving:
                wake = min(wake, next(iter(self._arriving.values())))
            self._scheduled = loop.call_later(max(0.0, wake - now), self._tick)
