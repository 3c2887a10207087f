"""OpenAI Responses request -> OpenAI-style chat request (the pipeline's input)."""

from __future__ import annotations

from typing import Any

import pytest

from deepseek_frontend.api.responses.convert import (
    convert_responses_request,
    decode_reasoning,
    encode_reasoning,
)
from deepseek_frontend.errors import RequestError, UnsupportedFeatureError
from tests.support.tools import WEATHER

WEATHER_TOOL = WEATHER.responses()


def body(**extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "input": "hi"}
    out.update(extra)
    return out


def round_trip_items() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Two."}],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
        },
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "Rain"}],
        },
    ]


def test_string_input_and_instructions() -> None:
    chat = convert_responses_request(body(instructions="Be brief."))
    assert chat.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert chat.max_tokens is None and chat.thinking is None


def test_message_items_with_parts_and_developer_role() -> None:
    chat = convert_responses_request(
        body(
            input=[
                {"role": "developer", "content": "dev rules"},
                {
                    "role": "user",
                    "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
                },
            ]
        )
    )
    assert chat.messages == [
        {"role": "system", "content": "dev rules"},
        {"role": "user", "content": "a\n\nb"},
    ]


def test_function_calls_join_the_assistant_turn_and_reasoning_attaches_to_it() -> None:
    chat = convert_responses_request(body(input=round_trip_items(), tools=[WEATHER_TOOL]))
    assert chat.messages == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
    ]
    assert chat.tools == [WEATHER.openai()]


def test_function_call_without_a_message_opens_an_assistant_turn() -> None:
    items = round_trip_items()
    del items[2]
    chat = convert_responses_request(body(input=items))
    assert chat.messages[1]["content"] == "" and chat.messages[1]["reasoning_content"] == "Two."
    assert len(chat.messages[1]["tool_calls"]) == 2


def test_reasoning_returned_only_as_our_encrypted_content_is_restored() -> None:
    items = round_trip_items()
    items[1] = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "encrypted_content": encode_reasoning("Two é."),
    }
    chat = convert_responses_request(body(input=items))
    assert chat.messages[1]["reasoning_content"] == "Two é."


def test_foreign_encrypted_content_and_summaries_are_not_used_as_reasoning() -> None:
    items = round_trip_items()
    items[1] = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "summary"}],
        "encrypted_content": "gAAAA-someone-else",
    }
    chat = convert_responses_request(body(input=items))
    assert chat.messages[1]["reasoning_content"] == ""
    assert decode_reasoning("gAAAA-someone-else") is None


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        (
            {"type": "function", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
        ),
    ],
)
def test_tool_choice_variants(choice: object, expected: object) -> None:
    """CASE.11 tool_choice auto/required/named/none."""
    assert convert_responses_request(body(tools=[WEATHER_TOOL], tool_choice=choice)).tool_choice == expected


@pytest.mark.parametrize(
    ("effort", "thinking", "word"),
    [("none", False, None), ("low", True, "low"), ("high", True, "high"), ("xhigh", True, "xhigh")],
)
def test_reasoning_effort(effort: str, thinking: bool, word: str | None) -> None:
    chat = convert_responses_request(body(reasoning={"effort": effort}))
    assert (chat.thinking, chat.reasoning_effort) == (thinking, word)


def test_text_format_json_schema_becomes_response_format() -> None:
    chat = convert_responses_request(
        body(
            text={
                "format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": True}
            }
        )
    )
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": {"type": "object"}, "strict": True},
    }
    assert convert_responses_request(body(text={"format": {"type": "text"}})).response_format is None


def test_sampling_and_limits_are_carried() -> None:
    chat = convert_responses_request(
        body(
            max_output_tokens=99,
            temperature=0.2,
            top_p=0.5,
            parallel_tool_calls=False,
            store=False,
            stream=True,
        )
    )
    assert (chat.max_tokens, chat.temperature, chat.top_p) == (99, 0.2, 0.5)
    assert chat.parallel_tool_calls is False and chat.stream is True


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": []}, "input"),
        ({"model": None}, "model"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "x"}}, "tool_choice.name"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
            "input[0].call_id",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ],
)
def test_bad_or_stateful_requests_are_rejected_with_the_field(patch: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        convert_responses_request(body(**patch))
    assert err.value.param == param
    assert err.value.status_code == 400
    assert err.value.message.startswith(f"{param}: "), "the message names the field first"


def test_stateful_rejection_says_the_server_is_stateless() -> None:
    with pytest.raises(RequestError, match="stateless"):
        convert_responses_request(body(previous_response_id="resp_1"))


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
    ],
)
def test_unsupported_features_are_refused(patch: dict[str, Any], param: str) -> None:
    with pytest.raises(UnsupportedFeatureError) as err:
        convert_responses_request(body(**patch))
    assert err.value.param == param


def test_hosted_tools_are_refused_when_the_server_says_reject() -> None:
    with pytest.raises(UnsupportedFeatureError) as err:
        convert_responses_request(body(tools=[{"type": "web_search"}]), hosted_tools="reject")
    assert err.value.param == "tools[0].type"
    assert "web_search" in err.value.message and "--hosted-tools" in err.value.message
