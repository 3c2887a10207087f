"""The closed vocabulary that ``parsing/`` hands to every later layer.

A :class:`~deepseek_frontend.parsing.StreamParser` turns model text into these events and nothing else;
OpenAI chunks, Anthropic events and metrics are all built from them. Each event is a tiny frozen record:

* :class:`ReasoningDelta` / :class:`ContentDelta` -- append ``text`` to reasoning_content / content.
* :class:`ToolCallStart` -- call ``index`` (0, 1, ... in order) with a unique ``id`` and its complete
  ``name``; always before any of that call's arguments.
* :class:`ToolCallArgumentsDelta` -- append ``text`` to the call's arguments. The concatenation of a call's
  deltas is one JSON object serialized like ``json.dumps(..., ensure_ascii=False)``.
* :class:`ToolCallEnd` -- the call's arguments are complete (valid JSON).
* :class:`Finish` -- always the last event, ``reason`` in ``stop``, ``length``, ``tool_calls``.

:func:`assemble_message` folds a list of events into a :class:`ParsedMessage`, so a non-streaming answer is
exactly the accumulation of what a stream would have sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

FinishReason = Literal["stop", "length", "tool_calls"]


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Text to append to ``reasoning_content``. Never empty, never contains markup."""

    text: str
    kind: ClassVar[str] = "reasoning_delta"


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """Text to append to ``content``. Never empty, never contains markup."""

    text: str
    kind: ClassVar[str] = "content_delta"


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: its position among the response's calls, a unique id and its full name."""

    index: int
    id: str
    name: str
    kind: ClassVar[str] = "tool_call_start"


@dataclass(frozen=True, slots=True)
class ToolCallArgumentsDelta:
    """JSON text to append to call ``index``'s arguments (deltas only ever append)."""

    index: int
    text: str
    kind: ClassVar[str] = "tool_call_arguments_delta"


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """Call ``index``'s arguments are complete and form a valid JSON object."""

    index: int
    kind: ClassVar[str] = "tool_call_end"


@dataclass(frozen=True, slots=True)
class Finish:
    """Last event of a response. ``length`` is never overwritten by ``tool_calls``."""

    reason: FinishReason
    kind: ClassVar[str] = "finish"


Event = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArgumentsDelta | ToolCallEnd | Finish


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One complete tool call of a parsed message. ``arguments`` is a JSON object as a string."""

    name: str
    arguments: str
    id: str


@dataclass(frozen=True, slots=True)
class ParsedMessage:
    """A whole assistant turn.

    ``reasoning_content`` is ``""`` (never ``None``) when the model produced no reasoning; the API layer
    decides whether an empty string is sent as a field or omitted. ``finish_reason`` follows the same rule
    as :class:`Finish`.
    """

    content: str
    reasoning_content: str
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    finish_reason: FinishReason = "stop"


def assemble_message(events: Iterable[Event]) -> ParsedMessage:
    """Fold events (one whole response, ending with :class:`Finish`) into a :class:`ParsedMessage`."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, tuple[str, str, list[str]]] = {}
    finish: FinishReason = "stop"
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallStart):
            calls[event.index] = (event.id, event.name, [])
        elif isinstance(event, ToolCallArgumentsDelta):
            calls[event.index][2].append(event.text)
        elif isinstance(event, Finish):
            finish = event.reason
    tool_calls = [
        ParsedToolCall(name=name, arguments="".join(parts), id=call_id)
        for _, (call_id, name, parts) in sorted(calls.items())
    ]
    return ParsedMessage(
        content="".join(content),
        reasoning_content="".join(reasoning),
        tool_calls=tool_calls,
        finish_reason=finish,
    )
