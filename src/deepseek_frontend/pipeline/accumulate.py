"""Reading started choice streams: interleaving their chunks, and folding them into answers.

:func:`merge_choices` interleaves the chunks of an n-choice response as they arrive (closing it
early aborts every engine request); :class:`ChoiceAccumulator` folds one choice's chunks into
the final message of a non-streaming answer, and :func:`collect` does both for a whole response.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deepseek_frontend.generation import TokenLogprob
from deepseek_frontend.parsing import ContentDelta, ReasoningDelta, ToolCallArgumentsDelta, ToolCallStart

from .request import FinishReason, PipelineChunk, StreamEnd, Usage

if TYPE_CHECKING:
    from .stream import ChoiceStream


async def merge_choices(streams: Sequence[ChoiceStream]) -> AsyncIterator[PipelineChunk]:
    """Interleave the chunks of started choice streams as they arrive.

    One stream is iterated directly (no task, no queue: the common case stays
    cheap). Several run in tasks feeding a queue; closing this iterator early
    cancels them, which closes (aborts) every engine request.
    """
    if len(streams) == 1:
        stream = streams[0]
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()
        return

    queue: asyncio.Queue[PipelineChunk | BaseException | None] = asyncio.Queue()

    async def pump(stream: ChoiceStream) -> None:
        try:
            async for chunk in stream:
                await queue.put(chunk)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # forwarded to the consumer
            await queue.put(exc)
        finally:
            await stream.aclose()
            await queue.put(None)

    tasks = [asyncio.create_task(pump(s)) for s in streams]
    remaining = len(tasks)
    try:
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(slots=True)
class AccumulatedToolCall:
    index: int
    id: str
    name: str
    arguments: str


class ChoiceAccumulator:
    """Folds one choice's chunks into the final message (the non-streaming answer)."""

    __slots__ = ("_args", "_calls", "_content", "_reasoning", "end", "index", "logprobs")

    def __init__(self, index: int) -> None:
        self.index = index
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, AccumulatedToolCall] = {}
        self._args: dict[int, list[str]] = {}
        self.logprobs: list[TokenLogprob] = []
        self.end: StreamEnd | None = None

    def add(self, chunk: PipelineChunk) -> None:
        for ev in chunk.events:
            t = type(ev)
            if t is ContentDelta:
                self._content.append(ev.text)
            elif t is ReasoningDelta:
                self._reasoning.append(ev.text)
            elif t is ToolCallStart:
                self._calls[ev.index] = AccumulatedToolCall(ev.index, ev.id, ev.name, "")
                self._args[ev.index] = []
            elif t is ToolCallArgumentsDelta:
                self._args.setdefault(ev.index, []).append(ev.text)
        if chunk.logprobs:
            self.logprobs.extend(chunk.logprobs)
        if chunk.end is not None:
            self.end = chunk.end

    @property
    def content(self) -> str:
        return "".join(self._content)

    @property
    def reasoning_content(self) -> str:
        return "".join(self._reasoning)

    @property
    def tool_calls(self) -> list[AccumulatedToolCall]:
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            call.arguments = "".join(self._args.get(index, ())) or "{}"
            calls.append(call)
        return calls

    @property
    def finish_reason(self) -> FinishReason:
        return self.end.finish_reason if self.end is not None else "stop"

    @property
    def usage(self) -> Usage:
        return self.end.usage if self.end is not None else Usage()


async def collect(streams: Sequence[ChoiceStream]) -> list[ChoiceAccumulator]:
    """Run started streams to the end and return one accumulator per choice, by index."""
    accs = {s.index: ChoiceAccumulator(s.index) for s in streams}
    async for chunk in merge_choices(streams):
        accs[chunk.index].add(chunk)
    return [accs[i] for i in sorted(accs)]
