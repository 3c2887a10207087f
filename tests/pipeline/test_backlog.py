"""Prompt work before decode chunks (pipeline/backlog.py): while a prompt waits for a loop turn or the
offload threads, a running stream's next chunk waits for it -- at most ``stream_yield_ms`` -- and the
tokens written meanwhile come in that chunk; nothing is lost, and a first chunk is never held."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.parsing import ContentDelta
from deepseek_frontend.pipeline.backlog import PromptBacklog
from deepseek_frontend.pipeline.chat import ChatPipeline, ChatRequest
from deepseek_frontend.pipeline.offload import LoopTurns, OffloadPool
from deepseek_frontend.tokenization import PromptTokenizer

from .test_pipeline import CONFIG

T = TypeVar("T")
#: bound on every wait below: a hang fails the test instead of stalling the suite
BOUND_S = 20.0
#: a wait long enough that only the end of the prompt work can end it within the test
LONG_WAIT_S = 60.0


async def bounded(waitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(waitable, BOUND_S)


async def not_done_after_some_polls(future: asyncio.Future[None]) -> bool:
    """True when ``future`` is still pending after the backlog has looked a few times."""
    try:
        await asyncio.wait_for(asyncio.shield(future), 0.1)
    except TimeoutError:
        return True
    return False


class HeldJob:
    """A job on the offload threads that runs until released (prompt work in progress)."""

    def __init__(self, offload: OffloadPool) -> None:
        self._gate = threading.Event()
        self.task = asyncio.ensure_future(offload.run(self._gate.wait, BOUND_S))

    @classmethod
    async def start(cls, offload: OffloadPool) -> HeldJob:
        job = cls(offload)
        await asyncio.sleep(0)  # the job is handed to the threads in the task's first step
        return job

    async def release(self) -> None:
        self._gate.set()
        await bounded(self.task)


def test_no_prompt_work_no_wait() -> None:
    backlog = PromptBacklog(LoopTurns(), OffloadPool(1))
    assert not backlog.waiting()


def test_a_wait_ends_when_the_prompt_work_is_done() -> None:
    async def go() -> None:
        offload = OffloadPool(1)
        backlog = PromptBacklog(LoopTurns(), offload, max_wait_s=LONG_WAIT_S)
        job = await HeldJob.start(offload)
        assert backlog.waiting()
        wait = backlog.cleared()
        assert await not_done_after_some_polls(wait)
        await job.release()
        await bounded(wait)  # long before LONG_WAIT_S: the work is done
        assert not backlog.waiting()

    asyncio.run(go())


def test_a_wait_ends_after_max_wait_while_the_work_goes_on() -> None:
    async def go() -> None:
        offload = OffloadPool(1)
        backlog = PromptBacklog(LoopTurns(), offload, max_wait_s=0.05)
        job = await HeldJob.start(offload)
        await bounded(backlog.cleared())
        assert backlog.waiting(), "the wait ended by its bound, the work still runs"
        await job.release()

    asyncio.run(go())


async def queued_for_a_turn() -> tuple[PromptBacklog, Callable[[], None], asyncio.Future[Callable[[], None]]]:
    """A backlog over a one-slot turn queue: the release of the turn one request holds, and a second
    request queued for it."""
    turns = LoopTurns(1)
    backlog = PromptBacklog(turns, OffloadPool(1), max_wait_s=LONG_WAIT_S)
    release = await turns.take()
    queued = asyncio.ensure_future(turns.take())
    await asyncio.sleep(0)  # the second request queues for the turn
    return backlog, release, queued


def test_requests_waiting_for_a_loop_turn_are_prompt_work() -> None:
    async def go() -> None:
        backlog, release, queued = await queued_for_a_turn()
        assert backlog.waiting()
        wait = backlog.cleared()
        release()
        (await bounded(queued))()
        await bounded(wait)
        assert not backlog.waiting()

    asyncio.run(go())


def test_a_request_that_stopped_waiting_for_a_turn_is_no_prompt_work() -> None:
    async def go() -> None:
        backlog, release, queued = await queued_for_a_turn()
        assert backlog.waiting()
        queued.cancel()  # its client went away
        with contextlib.suppress(asyncio.CancelledError):
            await queued
        assert not backlog.waiting()
        release()

    asyncio.run(go())


def test_cancelling_one_wait_leaves_the_others_waiting() -> None:
    async def go() -> None:
        offload = OffloadPool(1)
        backlog = PromptBacklog(LoopTurns(), offload, max_wait_s=LONG_WAIT_S)
        job = await HeldJob.start(offload)
        first, second = backlog.cleared(), backlog.cleared()
        first.cancel()
        assert await not_done_after_some_polls(second)
        await job.release()
        await bounded(second)

    asyncio.run(go())


def test_zero_max_wait_never_waits() -> None:
    async def go() -> None:
        offload = OffloadPool(1)
        backlog = PromptBacklog(LoopTurns(), offload, max_wait_s=0)
        job = await HeldJob.start(offload)
        assert not backlog.waiting()
        await job.release()

    asyncio.run(go())
    with pytest.raises(ValueError, match="max_wait_s"):
        PromptBacklog(LoopTurns(), OffloadPool(1), max_wait_s=-1)


@dataclasses.dataclass
class Streamed:
    first_while_held: bool
    chunks: int
    completion_tokens: int
    text: str


def _stream_during_prompt_work(tokenizer: PromptTokenizer, stream_yield_ms: float) -> Streamed:
    """Stream a 60-token answer (a token every 5 ms) while a job holds the offload threads."""
    engine = SimulatedEngine(tokenizer, itl_ms=5)
    pipeline = ChatPipeline(dataclasses.replace(CONFIG, stream_yield_ms=stream_yield_ms), tokenizer, engine)
    req = ChatRequest(
        messages=[{"role": "user", "content": "write 200 words"}],
        request_id="chatcmpl-backlog",
        model="deepseek-v4-flash",
        max_tokens=60,
        ignore_eos=True,
    )

    async def go() -> Streamed:
        prepared = pipeline.prepare(req)
        job = await HeldJob.start(pipeline.offload)
        (stream,) = await bounded(pipeline.start(prepared))
        first_while_held = not job.task.done()
        chunks, text, tokens = 0, [], 0
        async for chunk in stream:
            chunks += 1
            text += [event.text for event in chunk.events if isinstance(event, ContentDelta)]
            if chunk.end is not None:
                tokens = chunk.end.usage.completion_tokens
        await job.release()
        return Streamed(first_while_held, chunks, tokens, "".join(text))

    return asyncio.run(go())


def test_a_stream_takes_fewer_larger_chunks_while_prompt_work_waits_and_loses_nothing(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    yielding = _stream_during_prompt_work(prompt_tokenizer, stream_yield_ms=50)
    assert yielding.first_while_held, "a first chunk is never held"
    # without the yield the same stream comes a chunk per decode step
    per_step = _stream_during_prompt_work(prompt_tokenizer, stream_yield_ms=0)
    assert yielding.completion_tokens == per_step.completion_tokens == 60
    assert yielding.text == per_step.text and yielding.text, "the same answer, nothing lost"
    assert yielding.chunks * 2 < per_step.chunks, (yielding.chunks, per_step.chunks)
