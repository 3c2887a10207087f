"""Parity with DeepSeek's reference parser on the golden fixtures (tests/fixtures/dsv4-reference).

For every ``expected`` case, :func:`parse_completion` gives the same content, reasoning_content and tool
names, and arguments equal as JSON wherever the reference's arguments are valid JSON (where they are not --
``string="false"`` values that are not JSON -- ours are valid JSON, checked by the invariant checker).

Two cases are excluded because the streaming contract deliberately decides otherwise; each gets its own test
pinning the contract's answer instead. For the reference's ``error`` cases the parser must not raise, must
not leak markup, and must give the same result in one chunk and one character per chunk.
"""

from __future__ import annotations

import json

import pytest

from deepseek_frontend.parsing import parse_completion
from tests.support.golden import load_jsonl

from .dsml_harness import run

_FAMILIES = {"dsv4_parse.jsonl": "deepseek_v4", "dsv32_parse.jsonl": "deepseek_v32"}

#: case id -> why the contract overrides the reference
CONTRACT_OVERRIDES = {
    # The reference glues the next parameter's opener into the previous value when a closer is missing;
    # the contract (scenario 27, I1) closes the open parameter instead and never puts markup in arguments.
    "dsv4-parse-pub-0137-mutate-drop-param-close-calls": "scenario 27",
    # The reference keeps an EOS inside a string value; the contract (I1) treats EOS as the end of output.
    "dsv4-parse-pub-0159-rand-0006": "I1: EOS ends the output",
}


def _cases(kind: str) -> list[tuple[str, dict]]:
    return [(family, case) for name, family in _FAMILIES.items() for case in load_jsonl(name) if kind in case]


_EXPECTED = _cases("expected")
_ERRORS = _cases("error")


def test_fixture_files_have_the_documented_case_counts() -> None:
    # guards against silently parametrizing over nothing
    assert len(_EXPECTED) == (200 - 96) + (80 - 44)
    assert len(_ERRORS) == 96 + 44


@pytest.mark.parametrize(
    ("family", "case"),
    [c for c in _EXPECTED if c[1]["id"] not in CONTRACT_OVERRIDES],
    ids=lambda v: v["id"] if isinstance(v, dict) else v,
)
def test_parse_completion_matches_the_reference(family: str, case: dict) -> None:
    # CASE.1, CASE.2, CASE.3, CASE.5, CASE.7, CASE.24 (the fixture set spans them all)
    expected = case["expected"]
    thinking = case["thinking_mode"] == "thinking"
    result = parse_completion(case["text"], family=family, thinking=thinking)
    streamed = run([case["text"]], family=family, thinking=thinking)  # asserts the invariants
    assert streamed.calls() == [(c.name, c.arguments) for c in result.tool_calls]
    assert result.content == expected["content"]
    assert result.reasoning_content == expected["reasoning_content"]
    assert [c.name for c in result.tool_calls] == [c["function"]["name"] for c in expected["tool_calls"]]
    for ours, theirs in zip(result.tool_calls, expected["tool_calls"], strict=True):
        try:
            reference_arguments = json.loads(theirs["function"]["arguments"])
        except ValueError:
            continue  # the reference splices invalid JSON; ours is valid (checked by run())
        assert json.loads(ours.arguments) == reference_arguments


def test_missing_parameter_closer_closes_the_parameter_instead_of_swallowing_markup() -> None:
    # CASE.4, CASE.16 -- contract override of dsv4-parse-pub-0137 (scenario 27)
    case = next(c for _, c in _EXPECTED if c["id"] == "dsv4-parse-pub-0137-mutate-drop-param-close-calls")
    result = run([case["text"]], thinking=True).message
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [
        ("get_weather", {"q": "List three prime numbers greater than 100.", "n": 2}),
        ("web_search", {"flag": True}),
    ]


def test_eos_inside_a_value_ends_the_output() -> None:
    # CASE.5, CASE.16 -- contract override of dsv4-parse-pub-0159 (I1: no EOS text in arguments)
    case = next(c for _, c in _EXPECTED if c["id"] == "dsv4-parse-pub-0159-rand-0006")
    result = run([case["text"]], thinking=True).message
    assert [c.name for c in result.tool_calls] == ["noop", "stock_price"]
    assert json.loads(result.tool_calls[1].arguments)["to"] == "Who wrote 'One Hundred Years of Solitude'? "


@pytest.mark.parametrize(("family", "case"), _ERRORS, ids=lambda v: v["id"] if isinstance(v, dict) else v)
def test_reference_error_cases_neither_raise_nor_leak_markup(family: str, case: dict) -> None:
    # CASE.4, CASE.5: run() asserts I1/I3/I4 on every event stream
    thinking = case["thinking_mode"] == "thinking"
    one_chunk = run([case["text"]], family=family, thinking=thinking).message
    per_char = run(list(case["text"]), family=family, thinking=thinking).message
    assert [(c.name, c.arguments) for c in per_char.tool_calls] == [
        (c.name, c.arguments) for c in one_chunk.tool_calls
    ]
    assert (per_char.content, per_char.reasoning_content) == (one_chunk.content, one_chunk.reasoning_content)
