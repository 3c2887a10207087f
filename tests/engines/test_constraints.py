"""Tool-call grammars (parsing/constraints.py): what they accept, what they reject."""

from __future__ import annotations

import json

import pytest

from deepseek_frontend.engines.sim.model import dsml_block
from deepseek_frontend.errors import RequestError
from deepseek_frontend.parsing.constraints import (
    build_json_schema_constraint,
    build_tool_call_constraint,
    ebnf_accepts,
    ebnf_example,
    parse_ebnf,
)

from .conftest import SEARCH_TOOL, TOOLS, WEATHER_TOOL

NAMED_SEARCH = {"type": "function", "function": {"name": "web_search"}}
WEATHER_SCHEMA = WEATHER_TOOL["function"]["parameters"]
SEARCH_SCHEMA = SEARCH_TOOL["function"]["parameters"]


def weather_call(args: dict | None = None, block: str = "tool_calls") -> str:
    """A canonical call as a constrained model writes it: the block right at the answer."""
    calls = [("get_weather", args or {"location": "Paris", "days": 2}, WEATHER_SCHEMA)]
    return dsml_block(block, calls).lstrip("\n")


def search_call() -> str:
    args = {"query": "cats", "filters": {"safe": True, "sites": ["a", "b"]}}
    return dsml_block("tool_calls", [("web_search", args, SEARCH_SCHEMA)]).lstrip("\n")


def test_required_grammar_accepts_a_canonical_call_to_any_declared_tool() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=False)
    assert grammar.kind == "ebnf"
    assert ebnf_accepts(grammar.value, weather_call())
    assert ebnf_accepts(grammar.value, search_call())


def test_required_grammar_accepts_several_invokes_in_one_block() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=False).value
    calls = [
        ("get_weather", {"location": "Paris"}, WEATHER_SCHEMA),
        ("get_weather", {"location": "Tokyo", "unit": "celsius"}, WEATHER_SCHEMA),
    ]
    assert ebnf_accepts(grammar, dsml_block("tool_calls", calls).lstrip("\n"))


def test_named_grammar_rejects_a_call_to_another_tool() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, NAMED_SEARCH, thinking=False).value
    assert ebnf_accepts(grammar, search_call())
    assert not ebnf_accepts(grammar, weather_call())


def test_anthropic_named_choice_is_understood() -> None:
    grammar = build_tool_call_constraint(
        "deepseek_v4", TOOLS, {"type": "tool", "name": "get_weather"}, thinking=False
    )
    assert ebnf_accepts(grammar.value, weather_call())
    assert not ebnf_accepts(grammar.value, search_call())


def test_grammar_rejects_a_wrong_string_flag() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=False).value
    text = weather_call()
    assert ebnf_accepts(grammar, text)
    assert not ebnf_accepts(grammar, text.replace('name="days" string="false"', 'name="days" string="true"'))
    assert not ebnf_accepts(
        grammar, text.replace('name="location" string="true"', 'name="location" string="false"')
    )


def test_grammar_rejects_a_missing_required_parameter_and_an_unknown_one() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=False).value
    assert not ebnf_accepts(grammar, weather_call({"days": 2}))
    assert not ebnf_accepts(grammar, weather_call({"location": "Paris", "country": "FR"}))


def test_grammar_rejects_values_outside_the_parameter_type() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=False).value
    assert not ebnf_accepts(grammar, weather_call({"location": "Paris", "days": "two"}))
    assert not ebnf_accepts(grammar, weather_call({"location": "Paris", "unit": "kelvin"}))


def test_string_values_may_contain_markup_but_not_the_closing_tag() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=False).value
    assert ebnf_accepts(grammar, weather_call({"location": "a </b> <｜DSML｜ < </｜DSML｜param"}))
    bad = weather_call({"location": "x</｜DSML｜parameter>"})
    assert not ebnf_accepts(grammar, bad)


def test_thinking_grammar_requires_reasoning_closed_by_think_end() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=True).value
    assert ebnf_accepts(grammar, "Let me check </thin> the <weather>.</think>" + weather_call())
    assert ebnf_accepts(grammar, "</think>" + weather_call())
    assert not ebnf_accepts(grammar, weather_call())
    assert not ebnf_accepts(grammar, "a</think>b</think>" + weather_call())


def test_text_instead_of_a_call_is_rejected() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=False).value
    assert not ebnf_accepts(grammar, "The weather in Paris is sunny.")
    assert not ebnf_accepts(grammar, "")


@pytest.mark.parametrize("thinking", [False, True])
def test_no_whitespace_may_precede_a_required_call(thinking: bool) -> None:
    """Whitespace before the block would reach the client as ``content`` of spaces."""
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=thinking).value
    head = "Checking.</think>" if thinking else ""
    assert ebnf_accepts(grammar, head + weather_call())
    for pad in ("\n\n", " ", "\n"):
        assert not ebnf_accepts(grammar, head + pad + weather_call())


def test_dsv32_grammar_uses_function_calls_spelling() -> None:
    grammar = build_tool_call_constraint("deepseek_v32", TOOLS, "required", thinking=False).value
    assert ebnf_accepts(grammar, weather_call(block="function_calls"))
    assert not ebnf_accepts(grammar, weather_call(block="tool_calls"))


def test_json_parameters_accept_nested_json_with_escapes() -> None:
    grammar = build_tool_call_constraint("deepseek_v4", TOOLS, NAMED_SEARCH, thinking=False).value
    args = {
        "query": "q\\n",
        "num_results": 7,
        "filters": {"safe": False, "sites": ['x\n"y"', "\u00e9"], "lang": "en"},
    }
    text = dsml_block("tool_calls", [("web_search", args, SEARCH_SCHEMA)]).lstrip("\n")
    assert ebnf_accepts(grammar, text)
    assert not ebnf_accepts(grammar, text.replace('{"safe"', '{safe"'))
    # nested objects follow their schema: no unknown keys, const kept
    assert not ebnf_accepts(grammar, text.replace('"lang": "en"', '"lang": "fr"'))
    assert not ebnf_accepts(grammar, text.replace('"lang": "en"', '"n": null'))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {}},
        {"type": "object"},
        {"type": "object", "properties": {"a": {"type": ["integer", "null"]}, "b": {"enum": [1, "x", None]}}},
        {"type": "object", "properties": {"q": {"type": "string", "enum": ['say "hi"', "back\\slash"]}}},
        {
            "type": "object",
            "properties": {"n": {"type": "number"}, "o": {"type": "object"}, "c": {"const": [1]}},
        },
    ],
)
def test_grammar_text_parses_and_its_own_example_is_accepted(schema: dict) -> None:
    tools = [{"name": "odd-tool.name_1", "parameters": schema}]
    grammar = build_tool_call_constraint("deepseek_v4", tools, "required", thinking=True).value
    parsed = parse_ebnf(grammar)
    assert "root" in parsed.rules
    example = ebnf_example(grammar)
    assert ebnf_accepts(grammar, example)
    assert 'invoke name="odd-tool.name_1"' in example


def test_unknown_named_tool_and_empty_tools_are_request_errors() -> None:
    with pytest.raises(RequestError, match="not in 'tools'"):
        build_tool_call_constraint(
            "deepseek_v4", TOOLS, {"type": "function", "function": {"name": "nope"}}, thinking=False
        )
    with pytest.raises(RequestError, match="at least one tool"):
        build_tool_call_constraint("deepseek_v4", [], "required", thinking=False)
    with pytest.raises(RequestError):
        build_tool_call_constraint("deepseek_v4", TOOLS, "auto", thinking=False)
    with pytest.raises(RequestError, match="family"):
        build_tool_call_constraint("llama", TOOLS, "required", thinking=False)


def test_malformed_grammar_text_is_reported() -> None:
    with pytest.raises(RequestError, match="not defined"):
        parse_ebnf('root ::= missing "x"')
    with pytest.raises(RequestError, match="unterminated"):
        parse_ebnf('root ::= "x')
    with pytest.raises(RequestError, match="root"):
        parse_ebnf('start ::= "x"')


def test_json_schema_constraint_carries_the_schema_as_json_text() -> None:
    constraint = build_json_schema_constraint({"type": "object", "properties": {"a": {"type": "integer"}}})
    assert constraint.kind == "json_schema"
    assert json.loads(constraint.value) == {"type": "object", "properties": {"a": {"type": "integer"}}}


def test_every_unenforced_schema_keyword_is_documented() -> None:
    """docs/parsing.md lists what a grammar does not enforce; the list must match the builder's."""
    from pathlib import Path

    from deepseek_frontend.parsing.constraints import UNENFORCED_KEYWORDS

    docs = (Path(__file__).resolve().parents[2] / "docs" / "parsing.md").read_text(encoding="utf-8")
    section = docs.split("## Grammars (constrained decoding)", 1)[1].split("\n## ", 1)[0]
    missing = [k for k in UNENFORCED_KEYWORDS if f"`{k}`" not in section]
    assert not missing, missing
