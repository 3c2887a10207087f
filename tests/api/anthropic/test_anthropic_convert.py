"""Anthropic Messages request -> OpenAI-style chat request (the pipeline's input)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deepseek_frontend.api.anthropic.convert import (
    IMAGE_PLACEHOLDER,
    TOOL_ERROR_PREFIX,
    convert_messages_request,
)
from deepseek_frontend.errors import RequestError, UnsupportedFeatureError
from tests.support.tools import WEATHER

WEATHER_TOOL = WEATHER.anthropic()


def body(**extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    out.update(extra)
    return out


def tool_round_trip() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Two cities.", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {"city": "Rôme"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "Sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "content": [{"type": "text", "text": "city not found"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Thanks!"},
            ],
        },
    ]


def test_string_system_and_user_text_become_chat_messages() -> None:
    chat = convert_messages_request(body(system="Be brief."))
    assert chat.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert chat.max_tokens == 64
    assert chat.thinking is None and chat.tools is None and chat.tool_choice is None


def test_system_text_blocks_are_joined_with_a_blank_line() -> None:
    chat = convert_messages_request(
        body(
            system=[
                {"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "B"},
            ]
        )
    )
    assert chat.messages[0] == {"role": "system", "content": "A\n\nB"}


def test_tool_round_trip_maps_thinking_tool_use_and_tool_results() -> None:
    chat = convert_messages_request(body(messages=tool_round_trip(), tools=[WEATHER_TOOL]))
    assert chat.messages == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Two cities.",
            "tool_calls": [
                {
                    "id": "toolu_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "toolu_b",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rôme"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_a", "content": "Sunny"},
        {"role": "tool", "tool_call_id": "toolu_b", "content": TOOL_ERROR_PREFIX + "city not found"},
        {"role": "user", "content": "Thanks!"},
    ]
    assert chat.tools == [WEATHER.openai()]


def test_tool_results_come_before_user_text_whatever_the_block_order() -> None:
    messages = tool_round_trip()
    messages[2]["content"] = [messages[2]["content"][2], messages[2]["content"][0], messages[2]["content"][1]]
    roles = [m["role"] for m in convert_messages_request(body(messages=messages)).messages]
    assert roles == ["user", "assistant", "tool", "tool", "user"]


def test_a_user_turn_of_only_tool_results_adds_no_empty_user_message() -> None:
    messages = tool_round_trip()
    messages[2]["content"] = messages[2]["content"][:2]
    roles = [m["role"] for m in convert_messages_request(body(messages=messages)).messages]
    assert roles == ["user", "assistant", "tool", "tool"]


def test_redacted_thinking_is_dropped_and_several_thinking_blocks_concatenate() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "thinking", "thinking": "one ", "signature": "s"},
                {"type": "thinking", "thinking": "two", "signature": "s"},
                {"type": "text", "text": "A"},
            ],
        },
        {"role": "user", "content": "next"},
    ]
    chat = convert_messages_request(body(messages=messages))
    assert chat.messages[1] == {"role": "assistant", "content": "A", "reasoning_content": "one two"}


@pytest.mark.parametrize(
    ("choice", "expected", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
            None,
        ),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ],
)
def test_tool_choice_variants_map_to_openai_form(
    choice: dict[str, Any], expected: object, parallel: bool | None
) -> None:
    """CASE.11 tool_choice auto/required/named/none."""
    chat = convert_messages_request(body(tools=[WEATHER_TOOL], tool_choice=choice))
    assert chat.tool_choice == expected
    assert chat.parallel_tool_calls == parallel


@pytest.mark.parametrize(
    ("thinking", "expected"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, True),
        ({"type": "adaptive"}, True),
        ({"type": "disabled"}, False),
        (None, None),
    ],
)
def test_thinking_switch(thinking: dict[str, Any] | None, expected: bool | None) -> None:
    assert convert_messages_request(body(thinking=thinking)).thinking is expected


def test_sampling_stop_sequences_metadata_and_effort_are_carried() -> None:
    chat = convert_messages_request(
        body(
            temperature=0.3,
            top_p=0.9,
            top_k=40,
            stop_sequences=["END", "\n\nHuman:"],
            metadata={"user_id": "u-1"},
            output_config={"effort": "low"},
            stream=True,
        )
    )
    assert (chat.temperature, chat.top_p, chat.top_k) == (0.3, 0.9, 40)
    assert chat.stop == ["END", "\n\nHuman:"]
    assert chat.user == "u-1"
    assert chat.reasoning_effort == "low"
    assert chat.stream is True


def test_tool_use_input_is_serialized_like_json_dumps_without_ascii_escaping() -> None:
    messages = tool_round_trip()
    messages[1]["content"][2]["input"] = {"q": "é😀", "n": [1, 2.5, None, True]}
    chat = convert_messages_request(body(messages=messages))
    arguments = chat.messages[1]["tool_calls"][0]["function"]["arguments"]
    assert arguments == json.dumps({"q": "é😀", "n": [1, 2.5, None, True]}, ensure_ascii=False)


def test_count_tokens_body_needs_no_max_tokens() -> None:
    raw = body()
    del raw["max_tokens"]
    assert convert_messages_request(raw, require_max_tokens=False).max_tokens is None
    with pytest.raises(RequestError) as err:
        convert_messages_request(raw)
    assert err.value.param == "max_tokens"


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"model": ""}, "model"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}, "messages[0].content[0].type"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
        ),
        ({"temperature": 1.5}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"stop_sequences": ["ok", ""]}, "stop_sequences[1]"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "maybe"}}, "tool_choice.type"),
        ({"tools": [{"name": "x"}]}, "tools[0].input_schema"),
        ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools[1].name"),
        ({"output_config": {"effort": "huge"}}, "output_config.effort"),
    ],
)
def test_bad_requests_name_the_offending_field(patch: dict[str, Any], param: str) -> None:
    with pytest.raises(RequestError) as err:
        convert_messages_request(body(**patch))
    assert err.value.param == param
    assert err.value.status_code == 400
    assert err.value.message.startswith(f"{param}: "), "the message names the field first"


def test_tool_result_must_answer_a_tool_use_of_the_previous_assistant_turn() -> None:
    messages = tool_round_trip()
    messages[2]["content"][1]["tool_use_id"] = "toolu_unknown"
    with pytest.raises(RequestError) as err:
        convert_messages_request(body(messages=messages))
    assert err.value.param == "messages[2].content[1].tool_use_id"


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        (
            [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}],
            "messages[0].content[0].type",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "server_tool_use", "id": "s", "name": "web_search"}],
                },
                {"role": "user", "content": "q"},
            ],
            "messages[1].content[0].type",
        ),
    ],
)
def test_images_prefill_and_server_tools_are_refused_as_unsupported(
    messages: list[dict[str, Any]], param: str
) -> None:
    with pytest.raises(UnsupportedFeatureError) as err:
        convert_messages_request(body(messages=messages))
    assert err.value.param == param


def test_server_tool_declarations_are_refused() -> None:
    with pytest.raises(UnsupportedFeatureError) as err:
        convert_messages_request(body(tools=[{"type": "web_search_20250305", "name": "web_search"}]))
    assert err.value.param == "tools[0].type"


def test_an_image_in_a_tool_result_becomes_a_placeholder_so_the_session_survives() -> None:
    messages = tool_round_trip()
    messages[2]["content"][0]["content"] = [
        {"type": "text", "text": "screenshot:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
    ]
    chat = convert_messages_request(body(messages=messages))
    assert chat.messages[2] == {
        "role": "tool",
        "tool_call_id": "toolu_a",
        "content": "screenshot:\n\n" + IMAGE_PLACEHOLDER,
    }
