"""Renderer behaviour beyond the golden cases: round trips, variants, input shapes."""

from __future__ import annotations

import json
from dataclasses import replace
from types import ModuleType
from typing import Any

import pytest

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats import dsv4, dsv32
from deepseek_frontend.formats.dsv4 import DSV4_SPELLINGS, V4ChatFormat

ARGS = {"city": "Paris", "days": 3, "units": None, "flags": [True, False], "opts": {"a": "b\n<x>"}}


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.mark.parametrize(
    ("module", "opener"), [(dsv4, "</think>"), (dsv32, "</think>")], ids=["dsv4", "dsv32"]
)
def test_a_rendered_assistant_turn_parses_back_to_the_same_message(module: ModuleType, opener: str) -> None:
    user = {"role": "user", "content": "weather?"}
    assistant = {"role": "assistant", "content": "Checking.", "tool_calls": [_call("get_weather", ARGS)]}
    head = module.encode_messages([user], "chat")
    full = module.encode_messages([user, assistant], "chat")
    assert full.startswith(head) and head.endswith(opener)
    parsed = module.parse_message_from_completion_text(full[len(head) :], "chat")
    assert parsed["content"] == "Checking."
    assert parsed["reasoning_content"] == ""
    [call] = parsed["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == ARGS


def test_thinking_turns_parse_back_with_their_reasoning() -> None:
    user = {"role": "user", "content": "q"}
    assistant = {"role": "assistant", "content": "a", "reasoning_content": "because"}
    head = dsv4.encode_messages([user], "thinking", drop_thinking=False)
    full = dsv4.encode_messages([user, assistant], "thinking", drop_thinking=False)
    parsed = dsv4.parse_message_from_completion_text(full[len(head) :], "thinking")
    assert (parsed["reasoning_content"], parsed["content"]) == ("because", "a")


def test_a_family_variant_is_a_spellings_table_not_a_new_renderer() -> None:
    variant = V4ChatFormat(replace(DSV4_SPELLINGS, dsml="｜TOOL｜", tool_calls_block="calls"), family="test")
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [_call("f", {})]},
    ]
    segments = variant.render_prompt_segments(messages, "chat")
    assert "｜TOOL｜" in {s.text for s in segments if s.special}
    assert "｜DSML｜" not in "".join(s.text for s in segments)
    assert "<｜TOOL｜calls>" in variant.encode_messages(messages, "chat")
    completion = (
        '\n\n<｜TOOL｜calls>\n<｜TOOL｜invoke name="f">\n</｜TOOL｜invoke>\n</｜TOOL｜calls>'
        "<｜end▁of▁sentence｜>"
    )
    parsed = variant.parse_message_from_completion_text(completion, "chat")
    assert parsed["tool_calls"] == [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]


def test_v4_context_is_an_unrendered_prefix() -> None:
    context = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "one"}]
    new = [{"role": "user", "content": "second"}]
    whole = dsv4.encode_messages(context + new, "chat")
    assert whole == dsv4.encode_messages(context, "chat") + dsv4.encode_messages(new, "chat", context=context)


@pytest.mark.parametrize("module", [dsv4, dsv32], ids=["dsv4", "dsv32"])
@pytest.mark.parametrize(
    ("messages", "context", "where"),
    [
        ("hello", None, r"^messages: must be a list"),
        ([{"role": "user", "content": "a"}, "b"], None, r"^messages\[1\]: must be an object"),
        ([{"role": "user", "content": "a"}], ["earlier"], r"^context\[0\]: must be an object"),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"function": "f"}]}],
            None,
            r"^messages\[1\]\.tool_calls\[0\]\.function: ",
        ),
        (
            [{"role": "system", "content": "s", "tools": [{"name": "f"}]}, {"role": "user", "content": "a"}],
            None,
            r"^messages\[0\]\.tools\[0\]\.function: ",
        ),
    ],
)
def test_malformed_requests_name_the_field_at_fault(
    module: ModuleType, messages: Any, context: Any, where: str
) -> None:
    with pytest.raises(FormatError, match=where):
        module.encode_messages(messages, "chat", context=context)


def test_unserializable_tool_schemas_are_a_format_error() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"default": {1, 2}}}}]
    with pytest.raises(FormatError, match=r"^messages\[0\]\.tools: is not JSON-serializable"):
        dsv4.encode_messages([{"role": "system", "content": "", "tools": tools}], "chat")


@pytest.mark.parametrize("module", [dsv4, dsv32], ids=["dsv4", "dsv32"])
def test_parsing_a_non_string_completion_is_a_format_error(module: ModuleType) -> None:
    with pytest.raises(FormatError, match=r"^completion: "):
        module.parse_message_from_completion_text(None, "chat")  # type: ignore[arg-type]


def test_a_v32_conversation_without_a_user_message_reports_the_unknown_role() -> None:
    # No user turn means nothing lies "before the last user message" in thinking mode.
    with pytest.raises(FormatError, match=r"^messages\[0\]\.role: unknown role None"):
        dsv32.render_prompt_segments([{"role": None, "content": "x"}], "thinking")


@pytest.mark.parametrize("module", [dsv4, dsv32], ids=["dsv4", "dsv32"])
def test_an_unhashable_role_is_a_format_error_not_a_type_error(module: ModuleType) -> None:
    messages = [{"role": ["user"], "content": "x"}]
    with pytest.raises(FormatError, match=r"^messages\[0\]\.role: unknown role"):
        module.render_prompt_segments(messages, "thinking")


def test_a_cyclic_argument_value_is_a_format_error() -> None:
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    call = {"type": "function", "function": {"name": "f", "arguments": cyclic}}
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    with pytest.raises(FormatError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"):
        dsv4.render_prompt_segments(messages, "chat")
