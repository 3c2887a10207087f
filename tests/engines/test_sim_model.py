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
