"""Parser events -> OpenAI Responses stream events, validated against the SDK's types."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from deepseek_frontend.api.event_stream import SSEEvent
from deepseek_frontend.api.responses.convert import decode_reasoning
from deepseek_frontend.api.responses.events import ResponsesStreamEncoder
from deepseek_frontend.errors import EngineStreamError
from deepseek_frontend.parsing.events import (
    ContentDelta,
    Finish,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)

EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)

EVENTS: list[object] = [
    ReasoningDelta("Need "),
    ReasoningDelta("weather."),
    ContentDelta("Checking."),
    ToolCallStart(0, "call_abc", "get_weather"),
    ToolCallArgumentsDelta(0, '{"city": "Pa'),
    ToolCallArgumentsDelta(0, 'ris"}'),
    ToolCallEnd(0),
    Finish("tool_calls"),
]


def run(events: list[object], finish: str = "stop") -> tuple[list[SSEEvent], dict[str, Any]]:
    encoder = ResponsesStreamEncoder(model="deepseek-v4", input_tokens=10, cached_tokens=2)
    out = encoder.start()
    for event in events:
        out += encoder.feed(event)
    out += encoder.finish(finish_reason=finish, output_tokens=5, reasoning_tokens=3)
    for name, payload in out:
        assert name == payload["type"]
        EVENT_ADAPTER.validate_python(payload)
    assert encoder.response is not None
    Response.model_validate(encoder.response)
    return out, encoder.response


def test_items_stream_in_order_with_dense_sequence_numbers() -> None:
    events, _ = run(EVENTS, "tool_calls")
    assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
    assert [n for n, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = [p["output_index"] for n, p in events if n == "response.output_item.added"]
    assert added == [0, 1, 2]


def test_final_response_holds_reasoning_message_and_function_call() -> None:
    _, response = run(EVENTS, "tool_calls")
    reasoning, message, call = response["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Need weather."}]
    assert decode_reasoning(reasoning["encrypted_content"]) == "Need weather."
    assert message["content"][0]["text"] == "Checking." and message["status"] == "completed"
    assert call["name"] == "get_weather" and call["arguments"] == '{"city": "Paris"}'
    assert call["call_id"] == "call_abc" and call["id"].startswith("fc_")
    assert response["status"] == "completed"
    assert response["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 2, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 3},
        "total_tokens": 15,
    }


def test_delta_events_name_their_item_and_output_index() -> None:
    events, response = run(EVENTS, "tool_calls")
    ids = [item["id"] for item in response["output"]]
    for name, payload in events:
        if name.endswith(".delta"):
            assert payload["item_id"] == ids[payload["output_index"]]


def test_max_output_tokens_truncation_ends_with_response_incomplete() -> None:
    events, response = run([ContentDelta("partial")], "length")
    assert events[-1][0] == "response.incomplete"
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_call_without_argument_text_has_empty_object_arguments() -> None:
    _, response = run([ToolCallStart(0, "call_1", "get_time"), ToolCallEnd(0)], "tool_calls")
    assert response["output"][0]["arguments"] == "{}"


def test_error_event_continues_the_sequence_and_ends_the_encoder() -> None:
    encoder = ResponsesStreamEncoder(model="m", input_tokens=1)
    start = encoder.start()
    ((name, payload),) = encoder.error(EngineStreamError("worker died"))
    assert name == "error" and payload["sequence_number"] == len(start)
    EVENT_ADAPTER.validate_python(payload)
    with pytest.raises(RuntimeError):
        encoder.text("late")
