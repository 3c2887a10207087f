"""Prompt work before decode chunks: a stream's next chunk waits while prompts wait to be prepared.

One event loop renders and tokenizes every request's prompt (or hands the tokenizing to the offload
threads and takes the result back) and also writes every running stream's chunks. At 256 agent
streams a decode step wakes every stream at once, and the follow-ups that arrived meanwhile -- and
the results of the tokenizer's batches -- queue behind 256 chunk writes: their first tokens wait for
chunks that no client is waiting on as much.

An engine's scheduler makes the same choice for its GPU: SGLang runs a new prefill batch before the
next decode step whenever one is ready (``scheduler.py`` ``get_next_batch_to_run``), so a stream's
next token waits while a prompt is prefilled. :class:`PromptBacklog` does it for the frontend's
event loop: while a request waits for a loop turn or prompt text waits on (or is being tokenized by)
the offload threads, a running stream does not ask its engine for its next chunk; it waits until
that work is done, at most ``max_wait_s`` (:data:`STREAM_YIELD_MS`). Nothing is lost or reordered:
the tokens the engine produced meanwhile come together in the stream's next chunk (the in-process
engine's step clock counts them; a worker's socket holds them), and every chunk still comes within
``max_wait_s`` of when it would have. A stream's first chunk is never held.
"""

from __future__ import annotations

import asyncio
from collections import deque

from .offload import LoopTurns, OffloadPool

__all__ = ["STREAM_YIELD_MS", "PromptBacklog"]

#: the longest a running stream's next chunk waits for prompt work queued before it (milliseconds;
#: ``serve --stream-yield-ms``, 0: never)
STREAM_YIELD_MS = 50.0
#: how often a wait looks again whether the prompt work is done (one timer for all waiting streams)
POLL_S = 0.005


class PromptBacklog:
    """Whether prompt work waits on this process (:meth:`waiting`), and waits for it to clear
    (:meth:`cleared`) that share one timer.

    A stream's wait ends when no request waits for a loop turn and no job is queued or running on the
    offload threads (looked at every :data:`POLL_S`), or ``max_wait_s`` after it began, whichever is
    first. Each stream's wait is bounded from its own start, so streams that began waiting at
    different times go on at different times, not all in one iteration of the loop.
    """

    __slots__ = ("_handle", "_loop", "_offload", "_turns", "_waiters", "max_wait_s")

    def __init__(
        self, turns: LoopTurns, offload: OffloadPool, max_wait_s: float = STREAM_YIELD_MS / 1000
    ) -> None:
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s!r}")
        self.max_wait_s = max_wait_s
        self._turns = turns
        self._offload = offload
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        #: (deadline, future) of each waiting stream, in the order they began (so by deadline)
        self._waiters: deque[tuple[float, asyncio.Future[None]]] = deque()

    def waiting(self) -> bool:
        """True while a request waits for a loop turn or prompt work is on the offload threads
        (always False with ``max_wait_s`` 0)."""
        return self.max_wait_s > 0 and (self._turns.waiting or self._offload.pending > 0)

    def cleared(self) -> asyncio.Future[None]:
        """A future resolved when the prompt work is done or ``max_wait_s`` from now, whichever is
        first. Cancelling it cancels only this stream's wait."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new loop (a server started again in one process)
            self._loop, self._handle, self._waiters = loop, None, deque()
        waiter: asyncio.Future[None] = loop.create_future()
        now = loop.time()
        self._waiters.append((now + self.max_wait_s, waiter))
        if self._handle is None:
            self._handle = loop.call_at(now + min(POLL_S, self.max_wait_s), self._check)
        return waiter

    def _check(self) -> None:
        loop = self._loop
        assert loop is not None
        waiters = self._waiters
        now = loop.time()
        done = not self.waiting()
        while waiters and (done or waiters[0][0] <= now):
            waiter = waiters.popleft()[1]
            if not waiter.done():  # a stream closed while it waited
                waiter.set_result(None)
        self._handle = loop.call_at(min(now + POLL_S, waiters[0][0]), self._check) if waiters else None
