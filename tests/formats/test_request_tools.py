"""Request-level tools and JSON schema land where the encoders read them."""

from __future__ import annotations

import copy
from typing import Any

import deepseek_recipe as recipe
import pytest

from deepseek_frontend.errors import RequestError
from deepseek_frontend.formats import attach_request_tools, dsv4, dsv32

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMS}}
]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}


def test_tools_go_on_the_first_system_message_without_touching_the_input() -> None:
    messages = [
        {"role": "user", "content": "u"},
        {"role": "system", "content": "S"},
        {"role": "system", "content": "T"},
    ]
    before = copy.deepcopy(messages)
    out = attach_request_tools(messages, TOOLS)
    assert messages == before
    assert out == [messages[0], {"role": "system", "content": "S", "tools": TOOLS}, messages[2]]


def test_without_a_system_message_an_empty_one_is_inserted_first() -> None:
    out = attach_request_tools([{"role": "user", "content": "u"}], TOOLS, JSON_SCHEMA)
    assert out[0] == {"role": "system", "content": "", "tools": TOOLS, "response_format": SCHEMA}
    assert out[1:] == [{"role": "user", "content": "u"}]


def test_nothing_to_attach_returns_an_equal_copy() -> None:
    messages = [{"role": "user", "content": "u"}]
    for tools, fmt in ((None, None), ([], {"type": "text"}), (None, {"type": "json_object"})):
        out = attach_request_tools(messages, tools, fmt)
        assert out == messages and out is not messages


def test_existing_system_tools_are_kept_before_the_request_tools() -> None:
    own = [{"type": "function", "function": {"name": "mine", "parameters": {}}}]
    out = attach_request_tools([{"role": "system", "content": "S", "tools": own}], TOOLS)
    assert out[0]["tools"] == own + TOOLS


@pytest.mark.parametrize("with_system", [True, False])
@pytest.mark.parametrize("thinking", [True, False])
def test_attached_tools_and_schema_render_like_deepseek_recipe(with_system: bool, thinking: bool) -> None:
    ours: list[dict[str, Any]] = [{"role": "user", "content": "hi"}]
    theirs: list[Any] = [recipe.UserMessage("hi")]
    if with_system:
        ours.insert(0, {"role": "system", "content": "Be brief."})
        theirs.insert(0, recipe.SystemMessage("Be brief."))
    conversation = recipe.Conversation(
        theirs,
        thinking_mode=thinking,
        tools=[recipe.ToolDefinition("get_weather", "Weather", PARAMS)],
        reasoning_effort="low",
        response_schema=SCHEMA,
    )
    expected = recipe.DeepseekV4Encoding().render_conversation(conversation).prompt
    prompt = dsv4.encode_messages(
        attach_request_tools(ours, TOOLS, JSON_SCHEMA),
        "thinking" if thinking else "chat",
        reasoning_effort="low",
        reasoning_effort_profile="official",
    )
    assert prompt == expected


def test_the_same_placement_renders_the_v32_tools_prompt() -> None:
    prompt = dsv32.encode_messages(attach_request_tools([{"role": "user", "content": "hi"}], TOOLS), "chat")
    assert prompt.startswith("<｜begin▁of▁sentence｜>\n\n## Tools\n")
    assert prompt.endswith("</functions>\n<｜User｜>hi<｜Assistant｜></think>")


@pytest.mark.parametrize(
    ("tools", "response_format", "param"),
    [
        ("nope", None, "tools"),
        ([{"type": "function"}], None, "tools[0]"),
        ([{"type": "custom", "function": {"name": "x"}}], None, "tools[0].type"),
        ([{"type": "function", "function": {"name": 3}}], None, "tools[0].function.name"),
        (None, {"type": "json_schema", "json_schema": {"name": "a"}}, "response_format.json_schema.schema"),
        (None, {"type": "grammar"}, "response_format.type"),
        (None, "json", "response_format"),
    ],
)
def test_unusable_request_tools_are_a_request_error_naming_the_field(
    tools: Any, response_format: Any, param: str
) -> None:
    with pytest.raises(RequestError) as info:
        attach_request_tools([{"role": "user", "content": "u"}], tools, response_format)
    assert info.value.param == param
    assert str(info.value).startswith(param)
