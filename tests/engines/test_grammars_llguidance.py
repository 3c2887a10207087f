"""Every grammar the frontend builds, compiled and matched with llguidance (vLLM's ``guidance`` backend).

The grammar text is what vLLM's ``structured_outputs.grammar`` and SGLang's ``ebnf`` field carry;
llguidance reads it through its GBNF converter exactly as vLLM does (``llguidance.grammar_from``).
Matching runs on token ids of the bundled DeepSeek-V4 tokenizer, the way an engine feeds a matcher.
The same cases compile with xgrammar in tests/real_engine/test_grammar_xgrammar.py.
"""

from __future__ import annotations

import json

import llguidance
import pytest

from deepseek_frontend.parsing.constraints import (
    build_structured_output_constraint,
    build_tool_call_constraint,
    ebnf_accepts,
    to_lark,
)
from deepseek_frontend.tokenization import bundled_tokenizer_path

from .grammar_cases import (
    INVALID_ARGUMENTS,
    NESTED_USER,
    SCHEMAS,
    all_tools,
    call_text,
    every_grammar,
    valid_arguments,
)

GRAMMARS = every_grammar()
THINK_END = "</think>"


@pytest.fixture(scope="module")
def lltok() -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(bundled_tokenizer_path().read_text(encoding="utf-8"))


def compiled(grammar: str) -> str:
    return llguidance.grammar_from("grammar", grammar)


def token_ids(lltok: llguidance.LLTokenizer, text: str) -> list[int]:
    """Ids of ``text``; ``</think>`` spelled with ordinary tokens.

    llguidance treats the tokenizer's ``</think>`` added token as a special token, which a GBNF
    text literal cannot match (docs/parsing.md, "Grammars"); an engine running a thinking grammar
    under llguidance therefore produces ``</think>`` as plain text tokens, and so does this.
    """
    ids: list[int] = []
    for i, part in enumerate(text.split(THINK_END)):
        if i:
            ids += lltok.tokenize_str("</") + lltok.tokenize_str("think>")
        ids += lltok.tokenize_str(part)
    return ids


def llg_accepts(lltok: llguidance.LLTokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(lltok, compiled(grammar), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(token_ids(lltok, text)) and matcher.is_accepting()


@pytest.mark.parametrize("grammar_id", sorted(GRAMMARS))
def test_every_grammar_compiles_on_llguidance(lltok: llguidance.LLTokenizer, grammar_id: str) -> None:
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        compiled(GRAMMARS[grammar_id]), lltok
    )
    assert not is_error, messages
    assert not any("too deeply nested" in m for m in messages)


def test_string_parameters_do_not_nest_too_deeply() -> None:
    """``param-text`` is written flat: one nested group per character of the closing tag would be
    deeper than llguidance accepts."""
    grammar = GRAMMARS["deepseek_v4-required-chat"]
    [rule] = [line for line in grammar.splitlines() if line.startswith("param-text ::=")]
    assert rule.count("((") == 0 and rule.count("(") <= 6


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("thinking", [False, True])
def test_schema_valid_calls_are_accepted_by_llguidance_and_our_recognizer(
    lltok: llguidance.LLTokenizer, name: str, thinking: bool
) -> None:
    grammar = build_tool_call_constraint("deepseek_v4", all_tools(), "required", thinking=thinking).value
    head = "I will call the tool <now>.</think>" if thinking else ""
    for seed in range(3):
        text = head + call_text(name, valid_arguments(SCHEMAS[name], seed), SCHEMAS[name])
        assert llg_accepts(lltok, grammar, text), text
        assert ebnf_accepts(grammar, text), text


def test_a_tool_without_parameters_takes_an_empty_invoke(lltok: llguidance.LLTokenizer) -> None:
    grammar = GRAMMARS["deepseek_v4-required-chat"]
    text = call_text("no_parameters", {}, {})
    assert llg_accepts(lltok, grammar, text)
    assert not llg_accepts(lltok, grammar, call_text("no_parameters", {"x": 1}, {}))


@pytest.mark.parametrize(
    ("name", "arguments"), INVALID_ARGUMENTS, ids=lambda v: v if isinstance(v, str) else ""
)
def test_schema_invalid_calls_are_rejected_by_llguidance_and_our_recognizer(
    lltok: llguidance.LLTokenizer, name: str, arguments: dict
) -> None:
    grammar = build_tool_call_constraint("deepseek_v4", all_tools(), "required", thinking=False).value
    text = call_text(name, arguments, SCHEMAS[name])
    assert not llg_accepts(lltok, grammar, text), text
    assert not ebnf_accepts(grammar, text), text


def test_whitespace_before_the_calls_block_is_rejected(lltok: llguidance.LLTokenizer) -> None:
    grammar = build_tool_call_constraint("deepseek_v4", all_tools(), "required", thinking=True).value
    call = call_text("nested_required", valid_arguments(NESTED_USER), NESTED_USER)
    assert llg_accepts(lltok, grammar, "Plan.</think>" + call)
    for pad in ("\n\n", " ", "\n"):
        assert not llg_accepts(lltok, grammar, "Plan.</think>" + pad + call)
    assert not llg_accepts(lltok, grammar, call), "thinking mode: reasoning must be closed first"


def test_closing_tags_inside_string_values_and_reasoning(lltok: llguidance.LLTokenizer) -> None:
    grammar = build_tool_call_constraint("deepseek_v4", all_tools(), "required", thinking=True).value
    schema = SCHEMAS["nested_required"]
    tricky = {"user": {"name": "n", "age": 1}, "note": "a </b> <｜DSML｜ </｜DSML｜param < done"}
    assert llg_accepts(lltok, grammar, "a </thin> <x></think>" + call_text("nested_required", tricky, schema))
    closing = {"user": {"name": "n", "age": 1}, "note": "x</｜DSML｜parameter>"}
    assert not llg_accepts(lltok, grammar, "r</think>" + call_text("nested_required", closing, schema))


@pytest.mark.parametrize("name", ["nested_required", "refs_recursive", "any_of", "arrays", "types"])
def test_structured_output_grammar_in_thinking_mode(lltok: llguidance.LLTokenizer, name: str) -> None:
    schema = SCHEMAS[name]
    grammar = build_structured_output_constraint(schema, thinking=True).value
    answer = json.dumps(valid_arguments(schema), ensure_ascii=False)
    assert llg_accepts(lltok, grammar, "Free reasoning, with <tags> and </thin.</think>" + answer)
    assert llg_accepts(
        lltok, grammar, "r</think>" + json.dumps(valid_arguments(schema), separators=(",", ":"))
    )
    assert not llg_accepts(lltok, grammar, "r</think>Here you go: " + answer)
    assert not llg_accepts(lltok, grammar, answer)


def test_structured_output_rejects_the_nested_object_missing_fields(lltok: llguidance.LLTokenizer) -> None:
    grammar = build_structured_output_constraint(NESTED_USER, thinking=True).value
    assert llg_accepts(lltok, grammar, 'r</think>{"user": {"name": "a", "age": 2}}')
    assert not llg_accepts(lltok, grammar, 'r</think>{"user": {}}')
    json_object = build_structured_output_constraint(None, thinking=True).value
    assert llg_accepts(lltok, json_object, 'r</think>{"free": [1, {"x": null}]}')
    assert not llg_accepts(lltok, json_object, "r</think>[1]")


# --------------------------------------------------------------------------- the Lark variant (to_lark)


def lark_accepts(lltok: llguidance.LLTokenizer, grammar: str, text: str) -> bool:
    """Match on the tokenizer's own ids: ``</think>`` is the special token, as a model writes it."""
    matcher = llguidance.LLMatcher(lltok, llguidance.grammar_from("lark", to_lark(grammar)), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(lltok.tokenize_str(text)) and matcher.is_accepting()


@pytest.mark.parametrize("grammar_id", sorted(GRAMMARS))
def test_every_grammar_compiles_as_lark(lltok: llguidance.LLTokenizer, grammar_id: str) -> None:
    # the "grammar" route is what vLLM's guidance backend and SGLang's llguidance backend call;
    # it recognises Lark text and passes it through
    lark = llguidance.grammar_from("grammar", to_lark(GRAMMARS[grammar_id]))
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(lark, lltok)
    assert not is_error, messages


def test_lark_variant_takes_the_think_end_token_and_keeps_the_language(lltok: llguidance.LLTokenizer) -> None:
    assert lltok.is_special_token(lltok.tokenize_str("</think>")[0]), "the premise: llguidance sees a token"
    grammar = build_tool_call_constraint("deepseek_v4", all_tools(), "required", thinking=True).value
    for name, schema in SCHEMAS.items():
        text = "Reasoning </thin> <x>.</think>" + call_text(name, valid_arguments(schema), schema)
        assert lark_accepts(lltok, grammar, text), text
    # why the variant exists: the GBNF text cannot take the token a model writes for </think>
    gbnf = llguidance.LLMatcher(lltok, compiled(grammar), log_level=0)
    assert not gbnf.consume_tokens(lltok.tokenize_str("Reasoning.</think>"))
    for name, arguments in INVALID_ARGUMENTS:
        assert not lark_accepts(lltok, grammar, "r</think>" + call_text(name, arguments, SCHEMAS[name]))
    structured = build_structured_output_constraint(NESTED_USER, thinking=True).value
    assert lark_accepts(lltok, structured, 'r</think>{"user": {"name": "a", "age": 1}}')
    assert not lark_accepts(lltok, structured, 'r</think>{"user": {}}')
