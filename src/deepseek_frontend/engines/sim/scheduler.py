"""The simulated engine's scheduler: a bounded running batch, a waiting queue, and SGLang's priority
scheduling over them (engine-facts E1; SGLang 0.5.23 ``srt/managers/scheduler.py`` and
``schedule_policy.py``).

Without ``max_running_requests`` every request runs at once, as the simulated engine always did.
With it, a request past the batch waits, and the scheduler -- run whenever a request arrives,
finishes or is aborted -- admits waiting requests while the batch has room:

* **Order.** First come first served; with ``enable_priority_scheduling``, by priority, then by
  the time the request entered the queue (``_sort_by_priority_and_fcfs``, schedule_policy.py:526):
  higher values first by default, lower first with ``schedule_low_priority_values_first``.
* **A request's priority** (``Scheduler._set_or_validate_priority``, scheduler.py:3520-3545): with
  priority scheduling on, a request without one gets ``default_priority_value`` (the tokenizer
  manager's default, ``tokenizer_manager.py:4013-4025``) or else the least-preferred value there
  is; with it off, a request that has one is aborted with 503 under
  ``abort_on_priority_when_disabled`` and its priority ignored otherwise.
* **Preemption** (``PrefillAdder.preempt_to_schedule``, schedule_policy.py:1707-1778, called when
  the batch is full, scheduler.py:4234): unless ``disable_priority_preemption``, the running
  requests are walked from the least preferred (the newest among equals); one may be preempted
  when the waiting request's priority beats it by more than
  ``priority_scheduling_preemption_threshold`` (a strict ``>``, 10 by default). SGLang frees as
  many as the new request's tokens need; here the batch is counted in requests, so one is enough.
  A preempted request loses its KV and goes back to the queue, entered anew
  (``_add_request_to_queue``, scheduler.py:3480): when it runs again it prefills again (its prompt
  and what it wrote), then continues. Only requests past their prefill (decoding) are in the
  running batch SGLang walks.
* **A full queue** (``max_queued_requests``, ``_abort_on_queued_limit``, scheduler.py:3552-3595):
  the arrival is aborted (503 "The request queue is full."), or with priority scheduling the least
  preferred waiting request (the newest among equals) is, when the arrival is strictly better
  (503 "The request is aborted by a higher priority request.").

One batch and one queue per simulated worker, whatever its ``--attn-dp-size`` (SGLang keeps one per
data-parallel rank): the ranks share its places. The queue is a heap with lazy removal; finding the
least-preferred waiting or running request is a scan, done only when the queue is full or the batch
is full and the waiting head might preempt.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import sys
from collections import deque
from dataclasses import dataclass
from typing import Any

from deepseek_frontend.errors import EngineUnavailableError

__all__ = ["QueueAbortError", "SchedulerSettings", "SimScheduler", "Ticket"]

#: SGLang's 503 messages (scheduler.py)
PRIORITY_DISABLED_MESSAGE = (
    "Using priority is disabled for this server. Please send a new request without a priority."
)
QUEUE_FULL_MESSAGE = "The request queue is full."
PREEMPTED_FROM_QUEUE_MESSAGE = "The request is aborted by a higher priority request."
#: SGLang's default ``--priority-scheduling-preemption-threshold``
DEFAULT_PREEMPTION_THRESHOLD = 10


class QueueAbortError(EngineUnavailableError):
    """The scheduler aborted the request before it ran (SGLang: an abort finish with
    ``status_code`` 503): a full queue, a more important arrival, or a priority the server takes
    none of. The server streams it as SGLang does; in process it is a retryable failure."""

    status_code = 503


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    """The scheduling flags, named and defaulted as SGLang's (``arg_groups/fields/schedule.py``)."""

    #: requests in the running batch at once (None: unbounded, nothing ever waits)
    max_running_requests: int | None = None
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: int = DEFAULT_PREEMPTION_THRESHOLD
    disable_priority_preemption: bool = False
    default_priority_value: int | None = None
    abort_on_priority_when_disabled: bool = False
    #: requests that may wait (None: unbounded)
    max_queued_requests: int | None = None

    def server_info(self) -> dict[str, Any]:
        """These settings as SGLang's ``/server_info`` reports them (resolved server args)."""
        return {
            "max_running_requests": self.max_running_requests,
            "max_queued_requests": self.max_queued_requests,
            "schedule_policy": "fcfs",
            "enable_priority_scheduling": self.enable_priority_scheduling,
            "schedule_low_priority_values_first": self.schedule_low_priority_values_first,
            "priority_scheduling_preemption_threshold": self.priority_scheduling_preemption_threshold,
            "disable_priority_preemption": self.disable_priority_preemption,
            "default_priority_value": self.default_priority_value,
            "abort_on_priority_when_disabled": self.abort_on_priority_when_disabled,
        }


class Ticket:
    """One request's place in the scheduler: waiting, running (``decoding`` once past its prefill)
    or done; ``preempted`` is set when it lost its place in the batch and must wait again."""

    __slots__ = ("decoding", "entered", "future", "preempted", "priority", "rid", "running", "seq")

    def __init__(self, rid: str, priority: int) -> None:
        self.rid = rid
        self.priority = priority
        self.entered = 0.0
        self.seq = 0
        #: set when the request runs (True) or was aborted while waiting (an error, or False for an
        #: ``/abort_request``)
        self.future: asyncio.Future[bool] | None = None
        self.running = False
        self.decoding = False
        self.preempted = False


class SimScheduler:
    """The running batch and waiting queue of one simulated worker (see the module docstring).

    ``ticket(rid, priority)`` makes a request's :class:`Ticket` (raising :class:`QueueAbortError`
    for a priority the server refuses); ``await admit(ticket)`` waits for its place in the batch
    (True; False when ``/abort_request`` removed it first; :class:`QueueAbortError` when a full
    queue aborted it); ``release(ticket)`` gives the place up; a running ticket may be
    ``preempted`` at any time and must then ``admit`` again.
    """

    def __init__(self, settings: SchedulerSettings) -> None:
        self.settings = settings
        #: -1: higher values first; 1: lower values first (SGLang's ``priority_sign``)
        self.sign = 1 if settings.schedule_low_priority_values_first else -1
        self._heap: list[tuple[tuple[int, float, int], Ticket]] = []
        #: the waiting tickets (their heap entries may outlive them), and the latest by request id
        self._waiting: set[Ticket] = set()
        self._by_rid: dict[str, Ticket] = {}
        self.running: set[Ticket] = set()
        self._seq = itertools.count()
        #: requests preempted out of the running batch, and aborted out of a full queue
        self.preempted = 0
        self.queue_aborted = 0
        #: the ids of the latest requests admitted to the batch, in order (tests read the order)
        self.admitted: deque[str] = deque(maxlen=1000)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def ticket(self, rid: str, priority: int | None) -> Ticket:
        """The request's ticket, with the priority it is scheduled by (see the module docstring)."""
        settings = self.settings
        if settings.enable_priority_scheduling:
            if priority is None:
                priority = settings.default_priority_value
            if priority is None:
                priority = sys.maxsize if self.sign == 1 else -sys.maxsize - 1
        else:
            if priority is not None and settings.abort_on_priority_when_disabled:
                raise QueueAbortError(PRIORITY_DISABLED_MESSAGE)
            priority = 0
        return Ticket(rid, priority)

    def _key(self, ticket: Ticket) -> tuple[int, float, int]:
        """A waiting ticket's place: priority (when scheduling by it), then entry time."""
        first = ticket.priority * self.sign if self.settings.enable_priority_scheduling else 0
        return (first, ticket.entered, ticket.seq)

    def _prefers(self, a: Ticket, b: Ticket) -> int:
        """How much more ``a`` is preferred than ``b`` by priority (positive: ``a`` goes first)."""
        return (a.priority - b.priority) * -self.sign

    async def admit(self, ticket: Ticket) -> bool:
        """Wait until ``ticket`` is in the running batch (see the class docstring)."""
        loop = asyncio.get_running_loop()
        ticket.entered = loop.time()
        ticket.seq = next(self._seq)
        ticket.preempted = False
        ticket.future = future = loop.create_future()
        self._enqueue(ticket)
        self._schedule()
        try:
            return await future
        except BaseException:
            # left while waiting (the client went away): out of the queue; or out of the batch, if
            # it got its place just now
            self.release(ticket)
            raise

    def _enqueue(self, ticket: Ticket) -> None:
        limit = self.settings.max_queued_requests
        if limit is not None and len(self._waiting) + 1 > limit:
            victim = ticket
            message = QUEUE_FULL_MESSAGE
            if self.settings.enable_priority_scheduling and self._waiting:
                # the least preferred waiting request; the newest among equals
                worst = max(self._waiting, key=lambda t: (t.priority * self.sign, t.entered, t.seq))
                if self._prefers(ticket, worst) > 0:
                    victim, message = worst, PREEMPTED_FROM_QUEUE_MESSAGE
            self.queue_aborted += 1
            if victim is ticket:
                raise QueueAbortError(message)
            self._drop_waiting(victim)
            self._wake(victim, QueueAbortError(message))
        self._waiting.add(ticket)
        self._by_rid[ticket.rid] = ticket
        heap = self._heap
        if len(heap) > 2 * len(self._waiting) + 64:
            # mostly entries of tickets that left: rebuild without them
            self._heap = heap = [entry for entry in heap if entry[1] in self._waiting]
            heapq.heapify(heap)
        heapq.heappush(heap, (self._key(ticket), ticket))

    def _drop_waiting(self, ticket: Ticket) -> None:
        self._waiting.discard(ticket)  # its heap entry is skipped when it comes up
        if self._by_rid.get(ticket.rid) is ticket:
            del self._by_rid[ticket.rid]

    @staticmethod
    def _wake(ticket: Ticket, outcome: bool | BaseException) -> None:
        future = ticket.future
        if future is None or future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def would_wait(self) -> bool:
        """Whether a request arriving now would wait for a place in the batch."""
        limit = self.settings.max_running_requests
        return limit is not None and (len(self.running) >= limit or bool(self._waiting))

    def _head(self) -> Ticket | None:
        """The waiting ticket that goes next (entries of tickets that left are dropped)."""
        heap = self._heap
        while heap:
            ticket = heap[0][1]
            if ticket in self._waiting:
                return ticket
            heapq.heappop(heap)
        return None

    def _schedule(self) -> None:
        """Admit waiting tickets while the batch has room, preempting for them when allowed."""
        limit = self.settings.max_running_requests
        while (head := self._head()) is not None:
            if limit is not None and len(self.running) >= limit and not self._preempt_for(head):
                return
            heapq.heappop(self._heap)
            self._drop_waiting(head)
            head.running = True
            self.running.add(head)
            self.admitted.append(head.rid)
            self._wake(head, True)

    def _preempt_for(self, head: Ticket) -> bool:
        """Free a place in the full batch for ``head`` by preempting the least-preferred decoding
        request, when ``head`` beats it by more than the threshold (see the module docstring)."""
        settings = self.settings
        if not settings.enable_priority_scheduling or settings.disable_priority_preemption:
            return False
        candidates = [t for t in self.running if t.decoding]
        if not candidates:
            return False
        # the least preferred first; among equals the newest (SGLang: -wait_queue_entry_time)
        victim = min(candidates, key=lambda t: (t.priority * -self.sign, -t.entered, -t.seq))
        if self._prefers(head, victim) <= settings.priority_scheduling_preemption_threshold:
            return False
        self.running.discard(victim)
        victim.running = victim.decoding = False
        victim.preempted = True
        self.preempted += 1
        return True

    def release(self, ticket: Ticket) -> None:
        """``ticket`` left (finished, aborted, gone): its place in the batch or the queue is free."""
        if ticket.running:
            ticket.running = ticket.decoding = False
            self.running.discard(ticket)
            self._schedule()
        elif ticket in self._waiting:
            self._drop_waiting(ticket)
            self._schedule()

    def abort(self, rid: str) -> bool:
        """``/abort_request`` for a waiting request: it leaves the queue at once (its ``admit``
        returns False). False when ``rid`` is not waiting."""
        ticket = self._by_rid.get(rid)
        if ticket is None:
            return False
        self._drop_waiting(ticket)
        self._wake(ticket, False)
        self._schedule()
        return True

    def stats(self) -> dict[str, Any]:
        return {
            "waiting": self.waiting,
            "running_batch": len(self.running),
            "preempted": self.preempted,
            "queue_aborted": self.queue_aborted,
            "admitted_ids": list(self.admitted),
        }
