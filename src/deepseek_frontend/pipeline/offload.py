"""A small pool of daemon threads for CPU-heavy request work (rendering and tokenizing long prompts).

The event loop must never stall on one request: a 20 MB prompt takes seconds to tokenize. HF
``tokenizers`` releases the GIL while it encodes, and pure-Python rendering gives the GIL back every
few milliseconds, so running that work here keeps the loop answering everyone else.

Why not ``loop.run_in_executor`` with a ``ThreadPoolExecutor``: its threads are joined when the
interpreter exits, so a server asked to stop would wait for a half-done tokenization of a prompt
whose client is long gone. These threads are daemons, and a job whose caller went away (its future
cancelled) before a thread picked it up is skipped.

Concurrency is bounded by the thread count; jobs beyond it wait in FIFO order (their number is
bounded by admission control).

Work that is cheaper done for many requests at once -- cold prompt text, which the tokenizer
encodes in one call with the GIL released throughout -- goes to
:meth:`OffloadPool.run_batched`: one more daemon thread takes every such job queued (up to
:data:`BATCH_MAX_WEIGHT`) and hands them to their function together. Per request, the thread hops
and the GIL hand-offs (each a wait of up to the interpreter's 5 ms switch interval while the event
loop runs Python) were the cost that kept cold prompts from being admitted faster than about one
at a time per process: with one call per batch they are paid once for all its requests.

Batches are formed lightest jobs first (:func:`take_batch`): an agent's follow-up, whose new text
is a few thousand characters, does not wait behind the new conversations queued before it, whose
whole prompts are cold -- the order that gives the shortest waits for the most requests. A job
passed over for :data:`BATCH_MAX_DEFER_S` goes first, so none waits for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

#: threads doing heavy request work at once (tokenization of one prompt is single-threaded)
OFFLOAD_THREADS = 2
#: how much nicer than the event loop these threads run (Linux schedules threads on their own)
OFFLOAD_NICENESS = 10
#: the most work one batch of :meth:`OffloadPool.run_batched` takes (the sum of its jobs' weights;
#: for prompt text, characters: 256 K characters are about 50 unique 1,000-word prompts, about
#: 50 ms of tokenizing on one core); a single heavier job still runs, alone
BATCH_MAX_WEIGHT = 262_144
#: seconds a batched job may be passed over for lighter ones before it goes first
BATCH_MAX_DEFER_S = 0.25

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]
#: what a batched job's function gets (its items) and returns (per item, the error it raised or None)
BatchFunction = Callable[[list[Any]], list["BaseException | None"]]


@dataclass(slots=True, eq=False)
class BatchJob:
    """One caller's item for :meth:`OffloadPool.run_batched`, as the batch thread holds it."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    fn: BatchFunction
    item: Any
    #: the cost of its work, in the function's own unit (characters of text for the tokenizer)
    weight: int
    #: ``time.monotonic()`` when it was queued
    queued_at: float


def take_batch(pending: list[BatchJob], max_weight: int, now: float, max_defer_s: float) -> list[BatchJob]:
    """The next batch out of ``pending`` (taken from it; at least one job when any is pending).

    Lightest jobs first, and a job joins only while the batch weighs less than ``max_weight`` and
    only if it weighs at most twice what the batch holds so far: a batch of light jobs is not
    made to wait for a heavy one, and jobs of like weights still go together. Jobs queued
    ``max_defer_s`` or longer ago come before all others, oldest first. Otherwise the order
    among jobs of equal weight is the order they came in (``pending``'s).
    """
    overdue = [job for job in pending if now - job.queued_at >= max_defer_s]
    if overdue:
        taken = set(map(id, overdue))
        order = overdue + sorted((job for job in pending if id(job) not in taken), key=_weight)
    else:
        order = sorted(pending, key=_weight)
    batch: list[BatchJob] = []
    weight = 0
    for job in order:
        if batch and (weight >= max_weight or job.weight > 2 * weight):
            break
        batch.append(job)
        weight += job.weight
    chosen = set(map(id, batch))
    pending[:] = [job for job in pending if id(job) not in chosen]
    return batch


def _weight(job: BatchJob) -> int:
    return job.weight


def _lower_thread_priority(niceness: int) -> None:
    """Make the calling thread ``niceness`` steps nicer than the process, where the OS allows.

    On Linux each thread has its own nice value. The event loop streams every client's tokens;
    a thread tokenizing a cold prompt can wait. With both sharing a few cores, the kernel then
    runs the loop (and the engine and clients on the same host) first whenever they are ready,
    and the threads take the CPU time left: a burst of cold prompts does not slow the streams
    and cached-prefix requests already running. Elsewhere this does nothing.
    """
    if sys.platform != "linux":
        return
    thread_id = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, thread_id)
        os.setpriority(os.PRIO_PROCESS, thread_id, min(19, current + niceness))
    except OSError:  # not permitted here: the threads keep the process's priority
        pass


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller went away meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _settle_batch(
    settled: list[tuple[asyncio.Future[None], BaseException | None]], done: Callable[[int], None]
) -> None:
    for future, error in settled:
        _settle(future, None, error)
    done(len(settled))


class OffloadPool:
    """``await pool.run(fn, *args)`` runs ``fn(*args)`` on one of ``threads`` daemon threads;
    ``await pool.run_batched(fn, item, weight)`` hands ``item`` to ``fn`` together with the other
    batched jobs of ``fn`` queued meanwhile, on one more daemon thread.

    Threads start on first use. ``pending`` counts jobs queued or running (a gauge for metrics).
    """

    def __init__(
        self,
        threads: int = OFFLOAD_THREADS,
        name: str = "deepseek-offload",
        batch_max_weight: int = BATCH_MAX_WEIGHT,
        batch_max_defer_s: float = BATCH_MAX_DEFER_S,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.name = name
        self.batch_max_weight = batch_max_weight
        self.batch_max_defer_s = batch_max_defer_s
        self.pending = 0
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._started: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._batches: queue.SimpleQueue[BatchJob | None] = queue.SimpleQueue()
        self._batcher: threading.Thread | None = None

    def _ensure_threads(self) -> None:
        if len(self._started) >= self.threads:
            return
        with self._lock:
            while len(self._started) < self.threads:
                thread = threading.Thread(
                    target=self._work, name=f"{self.name}-{len(self._started)}", daemon=True
                )
                thread.start()
                self._started.append(thread)

    def _work(self) -> None:
        _lower_thread_priority(OFFLOAD_NICENESS)
        while True:
            job = self._queue.get()
            if job is None:
                return
            loop, future, fn, args = job
            if future.cancelled():
                loop.call_soon_threadsafe(self._done)
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting coroutine, not lost
                error = exc
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
                loop.call_soon_threadsafe(self._done)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
            # Drop every reference to the job before waiting for the next: the thread's frame would
            # otherwise keep its arguments (a request's prompt, its ids: hundreds of MB for a
            # multi-MB prompt) alive until another job comes.
            del job, loop, future, fn, args, result, error

    def _done(self, count: int = 1) -> None:
        self.pending -= count

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a pool thread; its exception is raised here. Cancelling the await
        skips the job if it has not started (a started one runs to its end, its result dropped)."""
        self._ensure_threads()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.pending += 1
        self._queue.put((loop, future, fn, args))
        return await future

    async def run_batched(self, fn: BatchFunction, item: Any, weight: int) -> None:
        """Hand ``item`` to ``fn`` on the batch thread, with other items queued by then (lightest
        first, see :func:`take_batch`; the batch's ``weight`` at most :attr:`batch_max_weight`, or
        one item alone). ``fn(items)`` returns, per item, the exception that item's caller gets
        (None: done), and raises only for a fault of its own, which every caller of the batch then
        gets. Cancelling the await leaves the item out if its batch has not started."""
        with self._lock:
            if self._batcher is None:
                self._batcher = threading.Thread(
                    target=self._work_batches, name=f"{self.name}-batch", daemon=True
                )
                self._batcher.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.pending += 1
        self._batches.put(BatchJob(loop, future, fn, item, weight, time.monotonic()))
        await future

    def _work_batches(self) -> None:
        # At the event loop's priority, unlike the other threads: batches are the admission of
        # ordinary cold prompts, work every new request needs before its first token (encoded on
        # this thread by tiktoken, or by the Rust tokenizer's pool, whose size ``serve`` leaves a
        # core below the machine's), not an outsized request's that may wait. Niced, they got a
        # tenth of a core against any other process on a busy host: measured at 1,024 unique 1K-token streams
        # with other jobs on both cores, 17K tokens/s and first chunk p50 3.3 s against 22K and
        # 2.8 s at this priority with one pool thread.
        # jobs queued and not yet in a batch
        pending: list[BatchJob] = []
        closing = False
        while True:
            if not pending:
                if closing:
                    return
                job = self._batches.get()
                if job is None:
                    return
                pending.append(job)
            while True:
                try:
                    job = self._batches.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    closing = True  # the pool closes once the jobs queued before are done
                    continue
                pending.append(job)
            jobs = take_batch(pending, self.batch_max_weight, time.monotonic(), self.batch_max_defer_s)
            self._run_batch(jobs)
            # no reference to the batch while waiting for the next (its prompts, their ids)
            jobs, job = [], None

    def _run_batch(self, jobs: list[BatchJob]) -> None:
        """Every job of ``jobs`` done: each function called once with its items (jobs whose caller
        went away left out), each caller's future settled by one callback per event loop."""
        settled: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], BaseException | None]]] = {}
        by_fn: dict[BatchFunction, list[BatchJob]] = {}
        for job in jobs:
            if job.future.cancelled():
                settled.setdefault(job.loop, []).append((job.future, None))
            else:
                by_fn.setdefault(job.fn, []).append(job)
        for fn, group in by_fn.items():
            try:
                errors: list[BaseException | None] = fn([job.item for job in group])
            except BaseException as exc:  # the function's own fault: every caller of the batch gets it
                errors = [exc] * len(group)
            for job, error in zip(group, errors, strict=True):
                settled.setdefault(job.loop, []).append((job.future, error))
        for loop, results in settled.items():
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(_settle_batch, results, self._done)

    def close(self) -> None:
        """Ask idle threads to exit (busy ones finish their job first; they are daemons anyway)."""
        for _ in self._started:
            self._queue.put(None)
        self._started = []
        with self._lock:
            if self._batcher is not None:
                self._batches.put(None)
                self._batcher = None


class LoopTurns:
    """Hands out turns for short CPU work done on the event loop itself, ``slots`` at a time.

    A burst of requests arrives as thousands of tasks ready at once; the event loop runs every
    callback ready at the start of an iteration before it looks at the network again, so if each of
    them rendered and tokenized its prompt in its first step, one iteration would take seconds and
    ``/live`` would wait that long. Taking a turn first makes that work queue instead: a released
    turn goes to the next waiter through the loop's ready queue, so each iteration starts at most
    ``slots`` pieces of such work, and I/O (and every other request) is served in between.

    Waiters are served FIFO, except that ``urgent`` ones go before all others (still FIFO among
    themselves): a request known to be cheap -- a follow-up whose prompt is in the caches -- need
    not wait behind the cold requests of a burst.

    Uncontended, ``async with turns:`` never suspends: a lone request pays a counter update.
    """

    __slots__ = ("_urgent", "_waiters", "busy", "slots")

    def __init__(self, slots: int = 1) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.slots = slots
        self.busy = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._urgent: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> bool:
        """Whether a request waits for a turn (a cancelled wait stays queued until a release passes
        it over: not counted)."""
        if not (self._urgent or self._waiters):  # every running stream asks, per chunk
            return False
        return any(not waiter.done() for waiter in self._urgent) or any(
            not waiter.done() for waiter in self._waiters
        )

    async def __aenter__(self) -> None:
        await self._acquire(False)

    async def _acquire(self, urgent: bool) -> None:
        if self.busy < self.slots and not self._urgent and (urgent or not self._waiters):
            self.busy += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._waiters).append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the turn was handed to us as we were cancelled: pass it on
            else:
                waiter.cancel()
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._release()

    async def take(self, urgent: bool = False) -> Callable[[], None]:
        """Wait for a turn (ahead of the others when ``urgent``) and return its (idempotent) release;
        for a turn that spans several calls."""
        await self._acquire(urgent)
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._release()

        return release

    def _release(self) -> None:
        for waiters in (self._urgent, self._waiters):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the turn moves on; ``busy`` is unchanged
                    return
        self.busy -= 1


#: the release of the loop turn the current request holds (set by the API layer for the stretch
#: from reading the body to sending the prompt to the engine)
CURRENT_TURN: ContextVar[Callable[[], None] | None] = ContextVar("deepseek_frontend_turn", default=None)


def release_current_turn() -> None:
    """Give up the current request's loop turn, if it holds one (before it waits on anything slow)."""
    release = CURRENT_TURN.get()
    if release is not None:
        release()
