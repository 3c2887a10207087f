"""Parser events -> Anthropic stream events: block order, signatures, accumulation.

Every produced event is validated against the official SDK's own types, so a
field the SDK requires can't silently go missing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from deepseek_frontend.api.anthropic.events import (
    MessageAccumulator,
    MessagesStreamEncoder,
    SSEEvent,
    anthropic_error_body,
    stop_reason_for,
    thinking_signature,
)
from deepseek_frontend.errors import (
    AuthenticationError,
    EngineUnavailableError,
    ModelNotFoundError,
    PayloadTooLargeError,
    RequestError,
)
from deepseek_frontend.parsing.events import (
    ContentDelta,
    Finish,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)


def run(events: list[object], finish: str = "stop", stop: str | None = None) -> list[SSEEvent]:
    encoder = MessagesStreamEncoder(model="deepseek-v4", input_tokens=12, cache_read_input_tokens=4)
    out = encoder.start()
    for event in events:
        out += encoder.feed(event)
    out += encoder.finish(stop_reason=stop_reason_for(finish, stop), output_tokens=7, stop_sequence=stop)
    for name, payload in out:
        assert name == payload["type"]
        if name != "ping":  # keep-alive, not part of the SDK's event union (its stream skips it)
            EVENT_ADAPTER.validate_python(payload)
    return out


def shape(events: list[SSEEvent]) -> list[str]:
    """Event names, with the block / delta type where there is one."""
    out = []
    for name, payload in events:
        if name == "content_block_start":
            out.append(f"start:{payload['content_block']['type']}")
        elif name == "content_block_delta":
            out.append(payload["delta"]["type"])
        elif name == "content_block_stop":
            out.append("stop")
        else:
            out.append(name)
    return out


def final(events: list[SSEEvent]) -> dict[str, Any]:
    acc = MessageAccumulator()
    acc.add(events)
    message = acc.result()
    Message.model_validate(message)
    return message


THINKING_TOOL_EVENTS: list[object] = [
    ReasoningDelta("Need "),
    ReasoningDelta("weather."),
    ContentDelta("Checking."),
    ToolCallStart(0, "call_x", "get_weather"),
    ToolCallArgumentsDelta(0, '{"city": "Pa'),
    ToolCallArgumentsDelta(0, 'ris"}'),
    ToolCallEnd(0),
    ToolCallStart(1, "call_y", "get_time"),
    ToolCallEnd(1),
    Finish("tool_calls"),
]


def test_blocks_open_and_close_in_order_with_the_signature_before_the_thinking_block_closes() -> None:
    """CASE.9 reasoning plus tool call."""
    events = run(THINKING_TOOL_EVENTS, finish="tool_calls")
    assert shape(events) == [
        "message_start",
        "ping",
        "start:thinking",
        "thinking_delta",
        "thinking_delta",
        "signature_delta",
        "stop",
        "start:text",
        "text_delta",
        "stop",
        "start:tool_use",
        "input_json_delta",
        "input_json_delta",
        "stop",
        "start:tool_use",
        "stop",
        "message_delta",
        "message_stop",
    ]
    indexes = [p["index"] for n, p in events if n.startswith("content_block")]
    assert indexes == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3]


def test_accumulated_message_has_thinking_text_and_tool_use_blocks() -> None:
    message = final(run(THINKING_TOOL_EVENTS, finish="tool_calls"))
    thinking, text, call, call2 = message["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": "Need weather.",
        "signature": thinking_signature("Need weather."),
    }
    assert text == {"type": "text", "text": "Checking."}
    assert call["type"] == "tool_use" and call["name"] == "get_weather" and call["input"] == {"city": "Paris"}
    assert call2["name"] == "get_time" and call2["input"] == {}
    assert call["id"].startswith("toolu_") and call2["id"].startswith("toolu_") and call["id"] != call2["id"]
    assert message["stop_reason"] == "tool_use"
    assert message["usage"]["input_tokens"] == 12
    assert message["usage"]["output_tokens"] == 7
    assert message["usage"]["cache_read_input_tokens"] == 4


def test_input_json_deltas_are_the_parser_argument_pieces_unchanged() -> None:
    events = run(THINKING_TOOL_EVENTS, finish="tool_calls")
    pieces = [p["delta"]["partial_json"] for n, p in events if n == "content_block_delta" and p["index"] == 2]
    assert pieces == ['{"city": "Pa', 'ris"}']


def test_plain_text_answer_is_one_text_block_ending_the_turn() -> None:
    message = final(run([ContentDelta("Hel"), ContentDelta("lo"), Finish("stop")]))
    assert message["content"] == [{"type": "text", "text": "Hello"}]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None


def test_empty_answer_has_no_content_blocks() -> None:
    message = final(run([Finish("stop")]))
    assert message["content"] == []


@pytest.mark.parametrize(
    ("finish", "stop", "expected"),
    [
        ("stop", None, "end_turn"),
        ("stop", "END", "stop_sequence"),
        ("length", None, "max_tokens"),
        ("tool_calls", None, "tool_use"),
    ],
)
def test_stop_reason_mapping(finish: str, stop: str | None, expected: str) -> None:
    """CASE.12 finish_reason mapping."""
    message = final(run([ContentDelta("x")], finish=finish, stop=stop))
    assert message["stop_reason"] == expected
    assert message["stop_sequence"] == (stop if expected == "stop_sequence" else None)


def test_reasoning_cut_by_max_tokens_still_closes_the_thinking_block_with_a_signature() -> None:
    events = run([ReasoningDelta("long thought")], finish="length")
    assert shape(events)[-4:] == ["signature_delta", "stop", "message_delta", "message_stop"]
    assert final(events)["content"][0]["signature"] == thinking_signature("long thought")


def test_signature_depends_on_the_reasoning_text() -> None:
    assert thinking_signature("a") != thinking_signature("b")
    assert thinking_signature("a") == thinking_signature("a")


def test_encoder_refuses_use_after_finish() -> None:
    encoder = MessagesStreamEncoder(model="m", input_tokens=1)
    encoder.start()
    encoder.finish(stop_reason="end_turn", output_tokens=0)
    with pytest.raises(RuntimeError):
        encoder.text("late")


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (RequestError("bad"), 400, "invalid_request_error"),
        (AuthenticationError("no key"), 401, "authentication_error"),
        (ModelNotFoundError("no model"), 404, "not_found_error"),
        (PayloadTooLargeError("big"), 413, "request_too_large"),
        (EngineUnavailableError("busy"), 503, "overloaded_error"),
    ],
)
def test_errors_render_in_anthropic_shape(error: RequestError, status: int, kind: str) -> None:
    assert error.status_code == status
    assert anthropic_error_body(error) == {"type": "error", "error": {"type": kind, "message": error.message}}
    assert json.dumps(anthropic_error_body(error))
