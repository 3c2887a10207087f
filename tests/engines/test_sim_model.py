"""The simulated model's pure rules: prompt reading and schema-valid example values."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from deepseek_frontend.engines.sim.model import example_value, read_prompt

from .conftest import TOOLS, render_prompt

SCHEMAS: list[dict[str, Any]] = [
    {
        "$defs": {
            "Item": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer", "multipleOf": 5, "minimum": 7},
                    "id": {"type": "string", "format": "uuid"},
                },
                "required": ["n", "id"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "minItems": 2},
            "best": {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}]},
        },
        "required": ["items", "best"],
    },
    {"type": "array", "items": {"type": "number", "exclusiveMaximum": 1}, "maxItems": 0},
    {"type": ["string", "null"], "minLength": 10, "maxLength": 12},
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"required": ["b"]},
        ]
    },
    {
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date-time"}, "k": {"const": {"x": 1}}},
    },
    {"type": "number", "minimum": 100.5, "maximum": 101},
    {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 12},
    {
        "type": "object",
        "properties": {"e": {"enum": ["a", "b", "c"]}, "b": {"type": "boolean"}},
        "required": ["e"],
    },
]


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("seed", [0, 1])
def test_example_values_are_valid_against_their_schema(schema: dict[str, Any], seed: int) -> None:
    from deepseek_frontend.engines.sim.model import _Hints

    value = example_value(schema, _Hints("Lima", "a topic", seed))
    jsonschema.validate(value, schema)


def test_read_prompt_finds_tools_mode_and_last_user_turn() -> None:
    view = read_prompt(render_prompt("What is the weather in Paris?", tools=TOOLS, thinking=True))
    assert [name for name, _ in view.tools] == ["get_weather", "web_search"]
    assert view.thinking is True
    assert view.last_user == "What is the weather in Paris?"
    assert view.tool_result is None
    assert view.block_name == "tool_calls"


def test_read_prompt_sees_a_tool_result_and_the_v32_block_name() -> None:
    v4 = read_prompt(render_prompt("weather?", tools=TOOLS, tool_result="rainy"))
    assert v4.tool_result == "rainy" and v4.thinking is False
    v32 = read_prompt(render_prompt("weather?", tools=TOOLS, family="deepseek_v32"))
    assert v32.block_name == "function_calls" and len(v32.tools) == 2


def test_several_tool_results_are_all_quoted() -> None:
    prompt = render_prompt("weather?", tools=TOOLS, tool_result="rainy")
    prompt = prompt.replace(
        "<tool_result>rainy</tool_result>", "<tool_result>rainy</tool_result><tool_result>windy</tool_result>"
    )
    assert read_prompt(prompt).tool_result == "rainy; windy"


@pytest.mark.parametrize(
    ("turn", "answer"),
    [
        ("Please REPLY WITH EXACTLY: Ok then\nand more", "Ok then"),
        ("Write 3 Words please", "3 words"),
        # a long s matches "s" under the pattern's Unicode case folding, not under str.lower()
        ("Write 3 word\u017f", "3 words"),
        ("Tell me about the frontend", "opener"),
    ],
)
def test_the_answer_rules_read_the_last_turn_whatever_its_case(turn: str, answer: str) -> None:
    """The substring gate in front of the answer rules' case-insensitive patterns never hides a
    match: the same answers as the patterns alone give."""
    from deepseek_frontend.engines.sim import model

    view = read_prompt(render_prompt(turn))
    text = model.plan_output(view, seed=0)[-1].text
    if answer == "3 words":
        assert len(text.split()) == 3 and not text.endswith(".")
    elif answer == "opener":
        assert text.endswith(": Tell me about the frontend.")
    else:
        assert text == answer


# --------------------------------------------------------------------------- tool search rules


def _tool_search_prompt(family: str, n: int) -> str:
    """The rendered prompt of the tool-search conversation of tests/api/anthropic (first ``n``
    messages), its tool results alone in their user turns (no text after them: on V3.2 user
    text after a result opens a new user turn, and the model reads that turn instead)."""
    from tests.api.anthropic.test_tool_search import convert, render, turn

    messages = turn(n)
    for m in messages[2:]:
        if m["role"] == "user":
            m["content"] = [b for b in m["content"] if b["type"] == "tool_result"]
    profile = {"deepseek_v4": "preview", "deepseek_v41": "release", "deepseek_v32": ""}[family]
    return render(family, profile, convert(messages), thinking=False)


@pytest.mark.parametrize("family", ["deepseek_v4", "deepseek_v41", "deepseek_v32"])
def test_a_tool_search_for_an_undeclared_tool_word_then_a_call_to_the_loaded_tool(family: str) -> None:
    from deepseek_frontend.engines.sim import model

    first = read_prompt(_tool_search_prompt(family, 1))
    assert [name for name, _ in first.tools] == ["ToolSearch"]  # get_weather is deferred
    call = model.plan_output(first, seed=0)[-1].text
    assert 'name="ToolSearch"' in call and ">select:get_weather<" in call

    loaded = read_prompt(_tool_search_prompt(family, 3))
    assert loaded.loaded_tools == ("get_weather",)
    assert "get_weather" in dict(loaded.tools)
    call = model.plan_output(loaded, seed=0)[-1].text
    assert call.count("invoke name=") == 1 and 'name="get_weather"' in call

    answered = read_prompt(_tool_search_prompt(family, 5))
    assert answered.loaded_tools == () and "get_weather" in dict(answered.tools)  # now in the head
    assert model.plan_output(answered, seed=0)[-1].text.startswith("Based on the tool result: Sunny")


@pytest.mark.parametrize(
    ("name", "is_search"),
    [
        ("ToolSearch", True),
        ("tool_search", True),
        ("tool-search", True),
        ("search_tools", False),
        ("Search", False),
    ],
)
def test_which_tool_names_are_a_tool_search(name: str, is_search: bool) -> None:
    from deepseek_frontend.engines.sim.model import _is_search_tool

    assert _is_search_tool(name) is is_search


def test_no_search_without_a_search_tool_or_without_a_tool_word() -> None:
    from deepseek_frontend.engines.sim import model

    # the default tools have no search tool: a tool-like word gets the usual answer
    view = read_prompt(render_prompt("Tell me about TaskList", tools=TOOLS))
    assert "DSML" not in model.plan_output(view, seed=0)[-1].text
    search = {"type": "function", "function": {"name": "ToolSearch", "parameters": {"type": "object"}}}
    view = read_prompt(render_prompt("Tell me about lists", tools=[search]))
    assert "DSML" not in model.plan_output(view, seed=0)[-1].text
