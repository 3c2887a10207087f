"""Every grammar the frontend builds, compiled and matched with xgrammar (SGLang's default backend, vLLM's).

xgrammar needs torch, so this runs in the real-engine stage with the vLLM virtualenv's python
(``.ci/stage-real-engine.sh``: xgrammar 0.2.8 and llguidance 1.7.6 pinned); the main suite runs
the same cases through llguidance (tests/engines/test_grammars_llguidance.py). No engine server is
started: the grammar text is exactly what SGLang's ``ebnf`` field and vLLM's
``structured_outputs.grammar`` carry, compiled against the bundled DeepSeek-V4 tokenizer as the
engines compile it (``TokenizerInfo.from_huggingface``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from deepseek_frontend.parsing.constraints import (
    build_structured_output_constraint,
    build_tool_call_constraint,
)
from deepseek_frontend.tokenization import bundled_tokenizer_path
from tests.engines.grammar_cases import (
    INVALID_ARGUMENTS,
    NESTED_USER,
    SCHEMAS,
    all_tools,
    call_text,
    every_grammar,
    valid_arguments,
)

# deselected in the main suite (`-m 'not real_engine'`), so xgrammar and transformers -- which only the
# vLLM virtualenv has -- are imported by the fixtures, never at collection
pytestmark = pytest.mark.real_engine

GRAMMARS = every_grammar()


@pytest.fixture(scope="module")
def xgr() -> Any:
    import xgrammar

    return xgrammar


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(bundled_tokenizer_path()))


EOS = "<｜end▁of▁sentence｜>"


@dataclass
class Xgrammar:
    """A grammar compiler over the bundled tokenizer, as SGLang and vLLM set one up."""

    xgr: Any
    tokenizer: Any
    compiler: Any

    def compile(self, grammar: str) -> Any:
        return self.compiler.compile_grammar(grammar)

    def accepts(self, grammar: str, text: str) -> bool:
        """Feed ``text``'s token ids to a matcher, as an engine does; True when EOS may follow."""
        matcher = self.xgr.GrammarMatcher(self.compile(grammar))
        for token_id in self.tokenizer.encode(text, add_special_tokens=False):
            if not matcher.accept_token(token_id):
                return False
        return matcher.accept_token(self.tokenizer.convert_tokens_to_ids(EOS))


@pytest.fixture(scope="module")
def xg(xgr: Any, tokenizer: Any) -> Xgrammar:
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, stop_token_ids=[eos_id])
    return Xgrammar(xgr, tokenizer, xgr.GrammarCompiler(info, max_threads=1))


@pytest.mark.parametrize("grammar_id", sorted(GRAMMARS))
def test_every_grammar_compiles_on_xgrammar(xg: Xgrammar, grammar_id: str) -> None:
    assert xg.compile(GRAMMARS[grammar_id]).memory_size_bytes > 0


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("thinking", [False, True])
def test_schema_valid_calls_are_accepted(xg: Xgrammar, name: str, thinking: bool) -> None:
    grammar = build_tool_call_constraint("deepseek_v4", all_tools(), "required", thinking=thinking).value
    head = "I will call the tool <now>.</think>" if thinking else ""
    for seed in range(3):
        text = head + call_text(name, valid_arguments(SCHEMAS[name], seed), SCHEMAS[name])
        assert xg.accepts(grammar, text), text


@pytest.mark.parametrize(("name", "arguments"), INVALID_ARGUMENTS)
def test_schema_invalid_calls_are_rejected(xg: Xgrammar, name: str, arguments: dict) -> None:
    grammar = build_tool_call_constraint("deepseek_v4", all_tools(), "required", thinking=False).value
    text = call_text(name, arguments, SCHEMAS[name])
    assert not xg.accepts(grammar, text), text


def test_whitespace_before_a_required_call_is_rejected(xg: Xgrammar) -> None:
    grammar = build_tool_call_constraint("deepseek_v4", all_tools(), "required", thinking=True).value
    call = call_text("nested_required", valid_arguments(NESTED_USER), NESTED_USER)
    assert xg.accepts(grammar, "Plan.</think>" + call)
    assert not xg.accepts(grammar, "Plan.</think>\n\n" + call)


def test_structured_output_in_thinking_mode(xg: Xgrammar) -> None:
    grammar = build_structured_output_constraint(NESTED_USER, thinking=True).value
    answer = json.dumps(valid_arguments(NESTED_USER))
    assert xg.accepts(grammar, "Reasoning <with> tags.</think>" + answer)
    assert not xg.accepts(grammar, 'r</think>{"user": {}}')
    assert not xg.accepts(grammar, "r</think>Here it is: " + answer)
