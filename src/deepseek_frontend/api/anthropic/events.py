"""Parser events -> Anthropic Messages stream events, and their accumulation.

:class:`MessagesStreamEncoder` is a small state machine over the parser's events
(``ReasoningDelta``, ``ContentDelta``, ``ToolCallStart``,
``ToolCallArgumentsDelta``, ``ToolCallEnd``). It opens one content block per
run of same-kind output and closes the previous block before the next opens,
so indexes are dense and blocks never interleave::

    message_start, ping
    content_block_start(0, thinking)  thinking_delta*  signature_delta  content_block_stop(0)
    content_block_start(1, text)      text_delta*                       content_block_stop(1)
    content_block_start(2, tool_use)  input_json_delta*                 content_block_stop(2)
    message_delta(stop_reason, usage)  message_stop

A thinking block gets its ``signature`` (see :func:`thinking_signature`) in one
``signature_delta`` just before it closes; tool input streams as
``input_json_delta`` pieces exactly as the parser releases argument text.

A request that does not enable thinking gets no thinking block at all (Anthropic's
semantics; ``show_thinking=False``): the reasoning is withheld, see :mod:`.hidden_thinking`.

Each event is a ``(name, payload)`` pair; the route frames it with
``event_stream.frame_events``. A non-streaming answer is built by feeding the very
same events to :class:`MessageAccumulator`, so both answers agree by construction.
"""

from __future__ import annotations

import base64
import hashlib
import json
import string
from typing import TYPE_CHECKING, Any, Literal

from deepseek_frontend._random_ids import random_text
from deepseek_frontend.api.event_stream import EventEncoder, Section, SSEEvent
from deepseek_frontend.errors import FrontendError

if TYPE_CHECKING:
    from deepseek_frontend.pipeline.chat import StreamEnd

    from .hidden_thinking import HiddenReasoning

__all__ = [
    "MessageAccumulator",
    "MessagesStreamEncoder",
    "SSEEvent",
    "accumulate_message",
    "anthropic_error_body",
    "anthropic_error_type",
    "new_message_id",
    "new_tool_use_id",
    "stop_reason_for",
    "thinking_signature",
]

StopReason = Literal["end_turn", "max_tokens", "tool_use", "stop_sequence"]

_SIGNATURE_DOMAIN = b"deepseek-frontend/thinking-signature/v1\x00"

#: The empty content block each run of reasoning / answer text opens.
_EMPTY_BLOCKS: dict[str, dict[str, Any]] = {
    "reasoning": {"type": "thinking", "thinking": "", "signature": ""},
    "text": {"type": "text", "text": ""},
}


_ID_ALPHABET = string.ascii_letters + string.digits


def _random_suffix(length: int = 24) -> str:
    # base62 like Anthropic's own ids: safe in URLs, logs and shell commands
    return random_text(_ID_ALPHABET, length)


def new_message_id() -> str:
    """A fresh ``msg_...`` id."""
    return "msg_" + _random_suffix()


def new_tool_use_id() -> str:
    """A fresh ``toolu_...`` id."""
    return "toolu_" + _random_suffix()


def thinking_signature(reasoning: str) -> str:
    """The ``signature`` sent with a thinking block: a SHA-256 digest of its text.

    Anthropic signs thinking so that it can verify replayed blocks. This server
    never needs to: DeepSeek re-renders reasoning from its text, and incoming
    signatures are ignored. The digest is a stable, opaque non-empty value that
    agent SDKs require to be present.
    """
    digest = hashlib.sha256(_SIGNATURE_DOMAIN + reasoning.encode("utf-8")).digest()
    return base64.b64encode(digest).decode()


def stop_reason_for(finish_reason: str, matched_stop: str | None = None) -> StopReason:
    """Map the pipeline's finish reason onto Anthropic's ``stop_reason``.

    ``tool_calls`` -> ``tool_use``; ``length`` -> ``max_tokens``; ``stop`` ->
    ``stop_sequence`` when a client stop string matched, else ``end_turn``.
    """
    if finish_reason == "tool_calls":
        return "tool_use"
    if finish_reason == "length":
        return "max_tokens"
    if matched_stop is not None:
        return "stop_sequence"
    return "end_turn"


# Anthropic's error types by HTTP status
# (https://docs.anthropic.com/en/api/errors): the frontend's error tree maps onto these.
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}


def anthropic_error_type(err: FrontendError) -> str:
    """Anthropic's ``error.type`` for a frontend error (by its HTTP status; another 4xx -- an engine's
    422, say -- is the request's fault, so ``invalid_request_error``)."""
    fallback = "invalid_request_error" if 400 <= err.status_code < 500 else "api_error"
    return _ANTHROPIC_ERROR_TYPES.get(err.status_code, fallback)


def anthropic_error_body(err: FrontendError) -> dict[str, Any]:
    """Anthropic's error object: ``{"type": "error", "error": {"type": ..., "message": ...}}``.

    Used both as an HTTP error body and as the payload of an ``error`` stream event.
    """
    return {"type": "error", "error": {"type": anthropic_error_type(err), "message": err.message}}


class MessagesStreamEncoder(EventEncoder):
    """Turns parser events into Anthropic stream events for one response.

    Lifecycle (see :class:`~deepseek_frontend.api.event_stream.EventEncoder`):
    :meth:`start` once, then any number of :meth:`feed` (or the per-kind methods),
    then :meth:`finish` (or :meth:`end_stream`) once. Calls after ``finish`` raise
    ``RuntimeError``. Tool-call ``index`` values are the parser's; the encoder
    assigns content-block indexes and ``toolu_`` ids itself.

    With ``show_thinking=False`` (a request without ``thinking`` enabled, as Anthropic's
    API answers it) reasoning produces no events at all; the usage still counts its
    tokens, and an answer that calls tools leaves its reasoning in ``hidden_reasoning``
    under the calls' ids, so the replayed turn renders as the model generated it.
    """

    def __init__(
        self,
        *,
        model: str,
        input_tokens: int,
        cache_read_input_tokens: int = 0,
        message_id: str | None = None,
        show_thinking: bool = True,
        hidden_reasoning: HiddenReasoning | None = None,
    ) -> None:
        super().__init__()
        #: False: reasoning opens no block and sends no delta (the request did not enable thinking)
        self.show_thinking = show_thinking
        #: where the reasoning of a hidden-thinking answer that calls tools is kept for the next turn
        self._store = hidden_reasoning
        #: reasoning text withheld from the client (when ``show_thinking`` is off)
        self._hidden: list[str] = []
        self.message_id = message_id or new_message_id()
        self.model = model
        self.input_tokens = input_tokens
        self.cache_read_input_tokens = cache_read_input_tokens
        self._block_index = -1
        #: reasoning text of the open thinking block (its signature covers all of it)
        self._reasoning: list[str] = []
        #: parser tool index -> our tool_use id, for every call started so far
        self.tool_ids: dict[int, str] = {}

    def __repr__(self) -> str:
        blocks = self._block_index + 1
        return f"MessagesStreamEncoder(id={self.message_id!r}, open={self._open!r}, blocks={blocks})"

    # -- lifecycle --------------------------------------------------------------------------

    def note_cached_prompt(self, cached_tokens: int) -> None:
        """Split the prompt count as Anthropic does (``input_tokens`` excludes cache reads), so
        ``message_start`` says what ``message_delta`` will."""
        total = self.input_tokens + self.cache_read_input_tokens
        cached = max(0, min(cached_tokens, total))
        self.input_tokens = total - cached
        self.cache_read_input_tokens = cached

    def start(self) -> list[SSEEvent]:
        """``message_start`` (empty content, prompt usage) followed by one ``ping``."""
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": self.input_tokens,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": self.cache_read_input_tokens,
                "output_tokens": 0,
            },
        }
        return [("message_start", {"type": "message_start", "message": message}), ping_event()]

    def finish(
        self,
        *,
        stop_reason: StopReason,
        output_tokens: int,
        stop_sequence: str | None = None,
        input_tokens: int | None = None,
        cache_read_input_tokens: int | None = None,
    ) -> list[SSEEvent]:
        """Close the open block, then ``message_delta`` (stop reason, usage) and ``message_stop``.

        ``input_tokens`` / ``cache_read_input_tokens`` update the counts sent in
        ``message_start`` (the engine reports cache hits only as it finishes).
        """
        if input_tokens is not None:
            self.input_tokens = input_tokens
        if cache_read_input_tokens is not None:
            self.cache_read_input_tokens = cache_read_input_tokens
        self._check_open()
        out = self._close()
        self._finished = True
        if self._store is not None and self._hidden and self.tool_ids:
            self._store.remember(self.tool_ids.values(), "".join(self._hidden))
        out.append(
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": stop_reason,
                        "stop_sequence": stop_sequence if stop_reason == "stop_sequence" else None,
                    },
                    "usage": {
                        "input_tokens": self.input_tokens,
                        "cache_creation_input_tokens": 0,
                        "cache_read_input_tokens": self.cache_read_input_tokens,
                        "output_tokens": output_tokens,
                    },
                },
            )
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def end_stream(self, end: StreamEnd) -> list[SSEEvent]:
        """:meth:`finish` with the pipeline's finish reason, matched stop string and usage."""
        usage = end.usage
        # Anthropic's input_tokens excludes cache reads: total input = input + cache_read.
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        return self.finish(
            stop_reason=stop_reason_for(end.finish_reason, end.stop_sequence),
            stop_sequence=end.stop_sequence,
            output_tokens=usage.completion_tokens,
            input_tokens=usage.prompt_tokens - cached,
            cache_read_input_tokens=cached,
        )

    def error(self, err: FrontendError) -> list[SSEEvent]:
        """An ``error`` event (Anthropic's error shape) for a failure mid-stream; ends the encoder."""
        self._finished = True
        return [("error", anthropic_error_body(err))]

    # -- sections: content blocks ---------------------------------------------------------

    def reasoning(self, text: str) -> list[SSEEvent]:
        """A piece of reasoning: a thinking block's delta, or withheld when thinking is not shown."""
        if self.show_thinking:
            return super().reasoning(text)
        self._check_open()
        self._hidden.append(text)
        return []

    def _start_section(self, kind: Literal["reasoning", "text"]) -> list[SSEEvent]:
        return [self._open_block(dict(_EMPTY_BLOCKS[kind]))]

    def _start_tool_section(self, index: int, name: str, call_id: str | None) -> list[SSEEvent]:
        # The parser's call_id is not used: the block gets a fresh ``toolu_`` id, the form
        # Anthropic clients know.
        tool_id = new_tool_use_id()
        self.tool_ids[index] = tool_id
        return [self._open_block({"type": "tool_use", "id": tool_id, "name": name, "input": {}})]

    def _section_text(self, kind: Section, text: str) -> list[SSEEvent]:
        if kind == "reasoning":
            self._reasoning.append(text)
            return [self._delta({"type": "thinking_delta", "thinking": text})]
        if kind == "text":
            return [self._delta({"type": "text_delta", "text": text})]
        return [self._delta({"type": "input_json_delta", "partial_json": text})]

    def _end_section(self, kind: Section, status: str) -> list[SSEEvent]:
        out: list[SSEEvent] = []
        if kind == "reasoning":
            # the thinking block's signature, sent once just before it closes
            signature = thinking_signature("".join(self._reasoning))
            self._reasoning.clear()
            out.append(self._delta({"type": "signature_delta", "signature": signature}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": self._block_index}))
        return out

    def _open_block(self, block: dict[str, Any]) -> SSEEvent:
        self._block_index += 1
        return (
            "content_block_start",
            {"type": "content_block_start", "index": self._block_index, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> SSEEvent:
        return (
            "content_block_delta",
            {"type": "content_block_delta", "index": self._block_index, "delta": delta},
        )


def ping_event() -> SSEEvent:
    """A ``ping`` keep-alive event."""
    return ("ping", {"type": "ping"})


class MessageAccumulator:
    """Builds the final Messages response from the stream events an encoder produced.

    This is the non-streaming answer: the same events, folded. Tool input is the
    JSON parse of the concatenated ``input_json_delta`` pieces (``{}`` when none).
    """

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._json: dict[int, list[str]] = {}

    def add(self, events: list[SSEEvent]) -> None:
        """Fold events in stream order."""
        for name, payload in events:
            self._add_one(name, payload)

    def _add_one(self, name: str, payload: dict[str, Any]) -> None:
        if name == "message_start":
            self._message = json.loads(json.dumps(payload["message"]))  # private deep copy
            return
        message = self._message
        if message is None:
            raise RuntimeError(f"{name} before message_start")
        if name == "content_block_start":
            message["content"].append(dict(payload["content_block"]))
        elif name == "content_block_delta":
            block = message["content"][payload["index"]]
            delta = payload["delta"]
            kind = delta["type"]
            if kind == "text_delta":
                block["text"] += delta["text"]
            elif kind == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif kind == "signature_delta":
                block["signature"] = delta["signature"]
            elif kind == "input_json_delta":
                self._json.setdefault(payload["index"], []).append(delta["partial_json"])
        elif name == "content_block_stop":
            index = payload["index"]
            block = message["content"][index]
            if block["type"] == "tool_use" and index in self._json:
                block["input"] = json.loads("".join(self._json.pop(index)))
        elif name == "message_delta":
            message["stop_reason"] = payload["delta"]["stop_reason"]
            message["stop_sequence"] = payload["delta"]["stop_sequence"]
            message["usage"].update(payload["usage"])

    def result(self) -> dict[str, Any]:
        """The Messages response object."""
        if self._message is None:
            raise RuntimeError("no message_start seen")
        return self._message


def accumulate_message(events: list[SSEEvent]) -> dict[str, Any]:
    """The Messages response object a complete stream of ``events`` describes."""
    acc = MessageAccumulator()
    acc.add(events)
    return acc.result()
