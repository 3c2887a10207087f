"""What the two named-event protocols (Anthropic Messages, OpenAI Responses) share on the way out.

Both turn the pipeline's parser events into ``(name, payload)`` stream events with
the same small state machine, frame them as ``event: name`` SSE, and fold the very
same events into the non-streaming answer. :class:`EventEncoder` is that state
machine -- the lifecycle (``start``, ``feed`` any number of times, then
``end_stream`` or ``error`` once), the dispatch from parser event to section, and
which section opens and closes when. The protocol modules
(:mod:`.anthropic.events`, :mod:`.responses.events`) supply the events, shaped like
their API.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Literal

from deepseek_frontend.edge.sse import named_event
from deepseek_frontend.parsing.events import (
    ContentDelta,
    Finish,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

if TYPE_CHECKING:
    from deepseek_frontend.errors import FrontendError
    from deepseek_frontend.pipeline.chat import PipelineChunk, StreamEnd

__all__ = ["EventEncoder", "SSEEvent", "Section", "frame_events"]

#: One stream event: (SSE event name, JSON payload). The name equals ``payload["type"]``.
SSEEvent = tuple[str, dict[str, Any]]

#: What a section of the output holds: reasoning, answer text, or one tool call.
Section = Literal["reasoning", "text", "tool"]


def frame_events(events: list[SSEEvent]) -> bytes:
    """The SSE bytes of ``events`` (``event: name`` + ``data: json`` each)."""
    return b"".join(named_event(name, payload) for name, payload in events)


class EventEncoder(ABC):
    """Parser events -> one protocol's stream events, for one response.

    Lifecycle: :meth:`start` once, then any number of :meth:`feed` (or the per-kind
    methods), then :meth:`end_stream` (or the protocol's own ``finish``) once; after
    that every method but :meth:`error` raises ``RuntimeError``. :meth:`error` ends
    the encoder with the protocol's in-band error event.

    The output is a sequence of *sections* -- content blocks for Anthropic, output
    items for Responses -- one per run of same-kind output (``"reasoning"``,
    ``"text"``, or one ``"tool"`` call), so sections never interleave: the open one
    closes before the next opens. This class runs that state machine; a protocol
    supplies the events that open a section, carry its text and close it.
    """

    def __init__(self) -> None:
        self._finished = False
        #: the open section's kind, or None
        self._open: Section | None = None
        #: parser index of the open tool call (when ``_open == "tool"``)
        self._open_tool: int | None = None

    # -- the protocol's part --------------------------------------------------------------

    def note_cached_prompt(self, cached_tokens: int) -> None:  # noqa: B027 - optional hook
        """The prompt tokens the engine's first chunk reported as cache hits (before :meth:`start`),
        for protocols whose opening event reports them; by default ignored."""

    @abstractmethod
    def start(self) -> list[SSEEvent]:
        """The events that open the stream."""

    @abstractmethod
    def end_stream(self, end: StreamEnd) -> list[SSEEvent]:
        """The pipeline's end of stream (finish reason, usage): close the open section, then
        the protocol's closing events."""

    @abstractmethod
    def error(self, err: FrontendError) -> list[SSEEvent]:
        """The in-band error event for a failure after the stream started; ends the encoder."""

    @abstractmethod
    def _start_section(self, kind: Literal["reasoning", "text"]) -> list[SSEEvent]:
        """Events opening an empty reasoning or text section."""

    @abstractmethod
    def _start_tool_section(self, index: int, name: str, call_id: str | None) -> list[SSEEvent]:
        """Events opening the section of tool call ``index`` (arguments still empty)."""

    @abstractmethod
    def _section_text(self, kind: Section, text: str) -> list[SSEEvent]:
        """Events carrying a non-empty piece of the open section's text (tool: argument JSON)."""

    @abstractmethod
    def _end_section(self, kind: Section, status: str) -> list[SSEEvent]:
        """Events closing the open section; ``status`` is how the answer ended (``"completed"``,
        or ``"incomplete"`` when cut by the token limit)."""

    # -- the shared state machine ---------------------------------------------------------

    def feed(self, event: object) -> list[SSEEvent]:
        """Translate one parser event. ``Finish`` is ignored here: the stream's end carries it."""
        if isinstance(event, ReasoningDelta):
            return self.reasoning(event.text)
        if isinstance(event, ContentDelta):
            return self.text(event.text)
        if isinstance(event, ToolCallStart):
            return self.tool_start(event.index, event.name, event.id)
        if isinstance(event, ToolCallArgumentsDelta):
            return self.tool_arguments(event.index, event.text)
        if isinstance(event, ToolCallEnd):
            return self.tool_end(event.index)
        if isinstance(event, Finish):
            return []
        raise TypeError(f"unexpected parser event {event!r}")

    def encode(self, chunk: PipelineChunk) -> list[SSEEvent]:
        """All events of one pipeline chunk, closing events included when it ends the stream."""
        out: list[SSEEvent] = []
        for event in chunk.events:
            out += self.feed(event)
        if chunk.end is not None:
            out += self.end_stream(chunk.end)
        return out

    def reasoning(self, text: str) -> list[SSEEvent]:
        """A piece of reasoning, in the open (or a new) reasoning section."""
        return self._text_run("reasoning", text)

    def text(self, text: str) -> list[SSEEvent]:
        """A piece of answer text, in the open (or a new) text section."""
        return self._text_run("text", text)

    def tool_start(self, index: int, name: str, call_id: str | None = None) -> list[SSEEvent]:
        """Tool call ``index`` (the parser's numbering) begins: close the open section, open its own.

        ``call_id`` is the parser's id for the call; a protocol may keep it or mint its own.
        """
        self._check_open()
        out = self._close()
        out += self._start_tool_section(index, name, call_id)
        self._open, self._open_tool = "tool", index
        return out

    def tool_arguments(self, index: int, text: str) -> list[SSEEvent]:
        """Argument JSON text of the open call; ``RuntimeError`` if call ``index`` is not open."""
        self._check_open()
        if not text:
            return []
        if self._open != "tool" or self._open_tool != index:
            raise RuntimeError(f"arguments for tool call {index} arrived while it is not open")
        return self._section_text("tool", text)

    def tool_end(self, index: int) -> list[SSEEvent]:
        """The call's arguments are complete: close its section."""
        self._check_open()
        if self._open == "tool" and self._open_tool == index:
            return self._close()
        return []

    def _text_run(self, kind: Literal["reasoning", "text"], text: str) -> list[SSEEvent]:
        self._check_open()
        if not text:
            return []
        out: list[SSEEvent] = []
        if self._open != kind:
            out = self._close()
            out += self._start_section(kind)
            self._open = kind
        out += self._section_text(kind, text)
        return out

    def _close(self, status: str = "completed") -> list[SSEEvent]:
        """Close the open section, if any."""
        if self._open is None:
            return []
        out = self._end_section(self._open, status)
        self._open = self._open_tool = None
        return out

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError(f"{type(self).__name__} used after finish()")
