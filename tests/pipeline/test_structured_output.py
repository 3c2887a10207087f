"""Structured output and required tool calls, enforced in chat and thinking mode.

The pipeline's ``_constraint``: ``response_format`` json_schema / json_object becomes a constraint in
chat *and* thinking mode (thinking: reasoning free up to ``</think>``, then the JSON), tools declared
beside it stay callable, a worker without a grammar backend gets a 400 that says why, and
``tool_choice`` required / named on such a worker uses DeepSeek's own fallback (the prompt opens the
calls block, as ``deepseek-recipe`` does in chat mode).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from deepseek_frontend.errors import RequestError, UnsupportedFeatureError
from deepseek_frontend.parsing.constraints import ebnf_accepts
from deepseek_frontend.pipeline.chat import ChatPipeline, ChatRequest, ChoiceAccumulator, collect
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.engine import ScriptedEngine

from .test_pipeline import CONFIG, WEATHER, request

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "address"],
}
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
GOOD = {"name": "Ada", "age": 36, "address": {"city": "London", "zip": "N1"}}
RECIPE_OPENING = "</think>\n\n<｜DSML｜tool_calls>\n"
INVOKE = (
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)


def make(tokenizer: PromptTokenizer, pieces: list[str], **engine: Any) -> tuple[ChatPipeline, ScriptedEngine]:
    backend = ScriptedEngine(tokenizer, pieces, **engine)
    return ChatPipeline(CONFIG, tokenizer, backend), backend


def run(pipeline: ChatPipeline, req: ChatRequest) -> list[ChoiceAccumulator]:
    async def go() -> list[ChoiceAccumulator]:
        return await collect(await pipeline.start(pipeline.prepare(req)))

    return asyncio.run(go())


def grammar_of(pipeline: ChatPipeline, req: ChatRequest) -> str:
    constraint = pipeline.prepare(req).sampling.constraint
    assert constraint is not None and constraint.kind == "ebnf"
    return constraint.value


def test_thinking_mode_json_schema_leaves_reasoning_free_then_enforces_the_schema(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    pipeline, _ = make(prompt_tokenizer, [])
    grammar = grammar_of(pipeline, request(response_format=PERSON_FORMAT))
    assert ebnf_accepts(grammar, "The user wants <a> person.</think>" + json.dumps(GOOD))
    # prose instead of JSON, JSON without reasoning closed, and a nested object missing its fields
    assert not ebnf_accepts(grammar, "Thinking.</think>Ada is 36 and lives in London.")
    assert not ebnf_accepts(grammar, json.dumps(GOOD))
    assert not ebnf_accepts(grammar, "x</think>" + json.dumps({**GOOD, "address": {}}))
    assert not ebnf_accepts(grammar, "x</think>" + json.dumps({**GOOD, "age": "36"}))


def test_json_object_gets_a_json_grammar_in_thinking_mode(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, [])
    grammar = grammar_of(pipeline, request(response_format={"type": "json_object"}))
    assert ebnf_accepts(grammar, 'ok</think>{"anything": [1, {"x": null}]}')
    assert not ebnf_accepts(grammar, "ok</think>[1, 2]")
    assert not ebnf_accepts(grammar, "ok</think>Sure! Here is JSON.")
    chat = pipeline.prepare(request(thinking=False, response_format={"type": "json_object"}))
    assert chat.sampling.constraint is not None and chat.sampling.constraint.kind == "json_schema"
    assert json.loads(chat.sampling.constraint.value) == {"type": "object"}


def test_tools_declared_beside_a_response_format_stay_callable(prompt_tokenizer: PromptTokenizer) -> None:
    """Agent loops (Agents SDK ``output_type`` + tools) call tools first and answer in the schema last."""
    pipeline, _ = make(prompt_tokenizer, [])
    for thinking, head in ((True, "Plan.</think>"), (False, "")):
        grammar = grammar_of(
            pipeline, request(thinking=thinking, tools=[WEATHER], response_format=PERSON_FORMAT)
        )
        assert ebnf_accepts(grammar, head + json.dumps(GOOD))
        assert ebnf_accepts(grammar, head + "<｜DSML｜tool_calls>\n" + INVOKE)
        assert not ebnf_accepts(grammar, head + "Let me look that up.")


def test_a_worker_without_grammar_backend_gets_a_400_not_prose(prompt_tokenizer: PromptTokenizer) -> None:
    weak, backend = make(prompt_tokenizer, [], constraints=frozenset())
    for thinking in (True, False):
        for fmt in (PERSON_FORMAT, {"type": "json_object"}):
            with pytest.raises(UnsupportedFeatureError) as info:
                weak.prepare(request(thinking=thinking, response_format=fmt))
            assert info.value.param == "response_format"
            assert "constrained decoding" in info.value.message
    assert backend.requests == []


def test_required_tool_choice_on_a_grammarless_worker_preopens_the_calls_block(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    """Chat mode: DeepSeek's own fallback, byte-for-byte the prompt ending deepseek-recipe renders."""
    weak, _ = make(prompt_tokenizer, [INVOKE], constraints=frozenset())
    req = request(thinking=False, tools=[WEATHER], tool_choice="required")
    prepared = weak.prepare(req)
    assert prepared.sampling.constraint is None
    prompt = prompt_tokenizer.decode(prepared.input_ids, skip_special_tokens=False)
    assert prompt.endswith("<｜Assistant｜>" + RECIPE_OPENING)
    [acc] = run(weak, req)
    assert acc.content in (None, "")
    [call] = acc.tool_calls
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert acc.finish_reason == "tool_calls"


def test_named_tool_choice_fallback_declares_only_the_named_tool(prompt_tokenizer: PromptTokenizer) -> None:
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    weak, _ = make(prompt_tokenizer, [], constraints=frozenset())
    named = {"type": "function", "function": {"name": "get_weather"}}
    prepared = weak.prepare(request(thinking=False, tools=[other, WEATHER], tool_choice=named))
    prompt = prompt_tokenizer.decode(prepared.input_ids, skip_special_tokens=False)
    assert '"name": "get_weather"' in prompt and '"name": "get_time"' not in prompt
    assert prompt.endswith(RECIPE_OPENING)


def test_required_tool_choice_in_thinking_mode_without_grammar_says_why(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    weak, backend = make(prompt_tokenizer, [], constraints=frozenset())
    with pytest.raises(UnsupportedFeatureError) as info:
        weak.prepare(request(tools=[WEATHER], tool_choice="required"))
    assert info.value.param == "tool_choice"
    assert "thinking" in info.value.message and "disable thinking" in info.value.message
    assert backend.requests == []


def test_response_format_with_a_forced_tool_is_refused(prompt_tokenizer: PromptTokenizer) -> None:
    for constraints in (frozenset({"ebnf", "json_schema"}), frozenset()):
        pipeline, _ = make(prompt_tokenizer, [], constraints=constraints)
        with pytest.raises(RequestError) as info:
            pipeline.prepare(
                request(
                    thinking=False, tools=[WEATHER], tool_choice="required", response_format=PERSON_FORMAT
                )
            )
        assert info.value.param == "response_format"
