"""StreamParser's options and lifecycle: tool_choice, undeclared tools, ids, finish reasons, families."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from deepseek_frontend.errors import RequestError, UnsupportedModelError
from deepseek_frontend.parsing import (
    GRAMMARS,
    ContentDelta,
    Finish,
    ParsedMessage,
    StreamParser,
    ToolCallStart,
    get_grammar,
    parse_completion,
)

from .dsml_harness import EOS, block, canonical_call, invoke, param, run

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
    {
        "type": "function",
        "function": {
            "name": "wrap",
            "parameters": {"type": "object", "properties": {"arguments": {"type": "object"}}},
        },
    },
]
TWO_CALLS = "\n\n" + block(invoke("get_weather", param("city", "Paris")) + invoke("get_time")) + EOS


def test_tool_choice_none_produces_no_calls_and_counts_them() -> None:
    # CASE.11
    result = run(list("Sure." + TWO_CALLS), tools=TOOLS, tool_choice="none")
    assert result.message == ParsedMessage(content="Sure.", reasoning_content="", tool_calls=[])
    assert result.parser.suppressed_calls == 2
    assert result.parser.dropped_undeclared_calls == 0


def test_named_tool_choice_treats_other_tools_as_undeclared() -> None:
    # CASE.11, CASE.21
    choice = {"type": "function", "function": {"name": "get_time"}}
    result = run([TWO_CALLS], tools=TOOLS, tool_choice=choice)
    assert result.calls() == [("get_time", "{}")]
    assert result.parser.dropped_undeclared_calls == 1


def test_required_tool_choice_parses_like_auto() -> None:
    # CASE.11: the parser cannot force a call; constrained decoding does that upstream
    result = run([TWO_CALLS], tools=TOOLS, tool_choice="required")
    assert [name for name, _ in result.calls()] == ["get_weather", "get_time"]


def test_undeclared_call_is_dropped_logged_and_counted_and_indexes_stay_dense(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # CASE.11, CASE.21 (scenario 36)
    text = "\n\n" + block(invoke("delete_everything", param("path", "/")) + invoke("get_time")) + EOS
    with caplog.at_level(logging.INFO, logger="deepseek_frontend.parsing.stream"):
        result = run(list(text), tools=TOOLS)
    assert [(e.index, e.name) for e in result.deltas(ToolCallStart)] == [(0, "get_time")]
    assert result.parser.dropped_undeclared_calls == 1
    assert "delete_everything" in caplog.text
    assert result.message.finish_reason == "tool_calls"


def test_an_empty_tool_list_declares_nothing() -> None:
    # CASE.11, CASE.21: tools=[] is a declaration; tools=None means "no filtering"
    assert run([TWO_CALLS], tools=[]).calls() == []
    assert len(run([TWO_CALLS], tools=None).calls()) == 2


def test_only_dropped_calls_do_not_make_the_finish_reason_tool_calls() -> None:
    # CASE.12
    result = run([TWO_CALLS], tools=[])
    assert result.message.finish_reason == "stop"


def test_length_is_never_overwritten_by_tool_calls() -> None:
    # CASE.12 (I5)
    result = run([canonical_call()], finish_reason="length")
    assert result.events[-1] == Finish("length")
    assert len(result.calls()) == 1


def test_invalid_tool_choice_is_a_request_error() -> None:
    with pytest.raises(RequestError):
        StreamParser("deepseek_v4", thinking=False, tool_choice="sometimes")


def test_malformed_tool_list_is_a_request_error() -> None:
    with pytest.raises(RequestError):
        StreamParser("deepseek_v4", thinking=False, tools=[{"type": "function"}])


def test_unknown_family_is_an_unsupported_model_error() -> None:
    with pytest.raises(UnsupportedModelError):
        StreamParser("llama", thinking=False)


def test_id_factory_names_every_call_and_default_ids_are_unique() -> None:
    # CASE.15
    counter = iter(range(100))
    result = run([TWO_CALLS], id_factory=lambda: f"toolu_{next(counter)}")
    assert [e.id for e in result.deltas(ToolCallStart)] == ["toolu_0", "toolu_1"]
    ids = [e.id for e in run([TWO_CALLS]).deltas(ToolCallStart)] + [
        e.id for e in run([TWO_CALLS]).deltas(ToolCallStart)
    ]
    assert all(i.startswith("call_") for i in ids)
    assert len(set(ids)) == 4


def test_feed_or_finish_after_finish_raises() -> None:
    parser = StreamParser("deepseek_v4", thinking=False)
    parser.feed("hi")
    parser.finish("stop")
    with pytest.raises(RuntimeError):
        parser.feed("more")
    with pytest.raises(RuntimeError):
        parser.finish("stop")


def test_events_are_immutable() -> None:
    event = ContentDelta("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.text = "y"  # type: ignore[misc]


def test_plain_text_becomes_one_delta_per_feed() -> None:
    # batching: a feed of plain text is one event, not one per character
    parser = StreamParser("deepseek_v4", thinking=False)
    assert parser.feed("Hello, world.\nSecond line ") == [ContentDelta("Hello, world.\nSecond line ")]


def test_chat_mode_parse_has_empty_reasoning_not_none() -> None:
    # CASE.14
    message = parse_completion("Hello" + EOS, family="deepseek_v4", thinking=False)
    assert message == ParsedMessage(
        content="Hello", reasoning_content="", tool_calls=[], finish_reason="stop"
    )


def test_unwrap_needs_a_declared_schema_without_an_arguments_property() -> None:
    # CASE.7 (scenario 40): no schema -> no unwrap; schema with "arguments" -> no unwrap
    wrapped = param("arguments", '{"city":"Paris"}', "false")
    undeclared = run(["\n\n" + block(invoke("get_weather", wrapped)) + EOS])
    assert undeclared.calls() == [("get_weather", '{"arguments": {"city": "Paris"}}')]
    has_property = run(["\n\n" + block(invoke("wrap", wrapped)) + EOS], tools=TOOLS)
    assert has_property.calls() == [("wrap", '{"arguments": {"city": "Paris"}}')]
    unwrapped = run(
        list("\n\n" + block(invoke("get_weather", wrapped + param("days", "2", "false"))) + EOS), tools=TOOLS
    )
    assert json.loads(unwrapped.calls()[0][1]) == {"city": "Paris", "days": 2}


def test_every_registered_family_parses_its_own_canonical_call() -> None:
    # CASE.1, CASE.23: one table per family, one engine
    assert set(GRAMMARS) == {"deepseek_v4", "deepseek_v32", "deepseek_v41"}
    for family in GRAMMARS:
        assert get_grammar(family).family == family
        result = run(list(canonical_call(family)), family=family)
        assert result.calls() == [("get_weather", '{"city": "Paris", "days": 3}')]


def test_parser_state_names_the_current_state() -> None:
    parser = StreamParser("deepseek_v4", thinking=True)
    assert parser.state == "REASONING"
    parser.feed('r</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n')
    assert parser.state == "INVOKE"
    assert "INVOKE" in repr(parser)


def test_a_grammar_whose_terminals_are_ambiguous_is_rejected() -> None:
    # one terminal being a prefix of another would make "complete tag" and "held prefix" indistinguishable
    from deepseek_frontend.parsing.grammars import DsmlGrammar
    from deepseek_frontend.parsing.stream import _lex_tables

    ambiguous = DsmlGrammar(
        family="broken",
        block_names=("tool_calls",),
        invoke_names=("invoke", "invoke_x"),
        parameter_names=("parameter",),
    )
    with pytest.raises(ValueError, match="prefix"):
        _lex_tables(ambiguous)
