"""deepseek-recipe as the oracle for the prompts of converted Messages and Responses requests.

DeepSeek's ``deepseek-recipe`` converts Anthropic Messages and OpenAI Responses
requests itself. For each request below, the prompt this server renders --
``convert_*_request`` -> ``to_chat_request`` -> ``ChatPipeline.prepare`` (tools
attached, thinking mode, effort), decoded from the real prompt ids -- must equal
deepseek-recipe's rendered prompt, or differ exactly as docs/apis.md documents.

deepseek-recipe renders effort words as DeepSeek's API does for the refreshed V4
checkpoints, which is this server's ``official`` effort profile, so the pipeline
here runs with that profile. (Both protocols live in this one file so the oracle
helpers exist once.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import deepseek_recipe as dr
import pytest

from deepseek_frontend.api.adapters import ConvertedChat, to_chat_request
from deepseek_frontend.api.anthropic.convert import TOOL_ERROR_PREFIX, convert_messages_request
from deepseek_frontend.api.responses.convert import convert_responses_request, encode_reasoning
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.pipeline.chat import ChatPipeline
from deepseek_frontend.server.compose import pipeline_config
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.engine import ALL_CONSTRAINTS, ScriptedEngine

RECIPE_MODEL = "DeepSeek-V4-Pro"


RECIPE_CONFIG = ServerConfig(ModelConfig(served_model_name=RECIPE_MODEL, reasoning_effort_profile="official"))


def render_only(config: ServerConfig, tokenizer: PromptTokenizer) -> ChatPipeline:
    """``config``'s pipeline for rendering only: its engine is never asked to generate."""
    return ChatPipeline(
        pipeline_config(config), tokenizer, ScriptedEngine(tokenizer, constraints=ALL_CONSTRAINTS)
    )


@pytest.fixture(scope="module")
def pipeline(prompt_tokenizer: PromptTokenizer) -> ChatPipeline:
    return render_only(RECIPE_CONFIG, prompt_tokenizer)


def our_prompt(pipeline: ChatPipeline, converted: ConvertedChat) -> str:
    """The prompt this server sends to the engine for ``converted``."""
    prepared = pipeline.prepare(to_chat_request(converted, RECIPE_CONFIG, "oracle"))
    return pipeline.tokenizer.decode(prepared.input_ids)


def recipe_prompt(make_request: Callable[[dict[str, Any]], Any], body: dict[str, Any]) -> str:
    converted = make_request({**body, "model": RECIPE_MODEL}).convert(dr.ConversionOptions())
    return dr.DeepseekV4Encoding().render_conversation(converted.conversation).prompt


def messages_prompts(pipeline: ChatPipeline, body: dict[str, Any]) -> tuple[str, str]:
    body = {"max_tokens": 100, "model": RECIPE_MODEL, **body}
    return our_prompt(pipeline, convert_messages_request(body)), recipe_prompt(dr.MessagesRequest, body)


def responses_prompts(pipeline: ChatPipeline, body: dict[str, Any]) -> tuple[str, str]:
    body = {"model": RECIPE_MODEL, **body}
    return our_prompt(pipeline, convert_responses_request(body)), recipe_prompt(dr.ResponsesRequest, body)


# --------------------------------------------------------------------------- Anthropic Messages

WEATHER = {
    "name": "get_weather",
    "description": "Get weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = {"role": "user", "content": "Weather in Paris and Rome?"}
CALLS = {
    "role": "assistant",
    "content": [
        {"type": "thinking", "thinking": "Two cities.", "signature": "sig"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {
            "type": "tool_use",
            "id": "toolu_2",
            "name": "get_weather",
            "input": {"city": "Rôme", "days": [1, 2]},
        },
    ],
}
RESULT_1 = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}
RESULT_2 = {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "Rain"}]}

MESSAGES_AGREE: dict[str, dict[str, Any]] = {
    "plain text, default thinking": {"messages": [{"role": "user", "content": "hi"}]},
    "system text blocks": {
        "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
        "messages": [{"role": "user", "content": "hi"}],
    },
    "thinking disabled": {"thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": "hi"}]},
    "thinking enabled with budget": {
        "thinking": {"type": "enabled", "budget_tokens": 4096},
        "messages": [{"role": "user", "content": "hi"}],
    },
    "effort low": {"output_config": {"effort": "low"}, "messages": [{"role": "user", "content": "hi"}]},
    "effort max": {"output_config": {"effort": "max"}, "messages": [{"role": "user", "content": "hi"}]},
    "user text blocks": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]
    },
    "consecutive user turns": {
        "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    },
    "earlier thinking is dropped": {
        "messages": [
            {"role": "user", "content": "a"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "T", "signature": "s"},
                    {"type": "text", "text": "A"},
                ],
            },
            {"role": "user", "content": "b"},
        ]
    },
    "tool round trip with parallel results": {
        "tools": [WEATHER],
        "messages": [
            ASK,
            CALLS,
            {"role": "user", "content": [RESULT_1, RESULT_2, {"type": "text", "text": "ok"}]},
        ],
    },
    "tool round trip, thinking off": {
        "tools": [WEATHER],
        "thinking": {"type": "disabled"},
        "messages": [ASK, CALLS, {"role": "user", "content": [RESULT_1, RESULT_2]}],
    },
    # a client that never saw the reasoning (no `thinking` field) replays the turn without it;
    # with ids the server does not know, the turn renders with an empty reasoning, as here
    "tool round trip without thinking blocks": {
        "tools": [WEATHER],
        "messages": [
            ASK,
            {"role": "assistant", "content": CALLS["content"][1:]},
            {"role": "user", "content": [RESULT_1, RESULT_2]},
        ],
    },
    "tool results out of call order": {
        "tools": [WEATHER],
        "messages": [ASK, CALLS, {"role": "user", "content": [RESULT_2, RESULT_1]}],
    },
    "tool_choice any": {"tools": [WEATHER], "tool_choice": {"type": "any"}, "messages": [ASK]},
    "tool_choice none": {"tools": [WEATHER], "tool_choice": {"type": "none"}, "messages": [ASK]},
    "stop sequences and sampling": {
        "stop_sequences": ["END"],
        "temperature": 0.5,
        "top_k": 5,
        "metadata": {"user_id": "u"},
        "messages": [ASK],
    },
}


@pytest.mark.parametrize("name", list(MESSAGES_AGREE))
def test_messages_prompt_equals_deepseek_recipe(pipeline: ChatPipeline, name: str) -> None:
    ours, recipe = messages_prompts(pipeline, MESSAGES_AGREE[name])
    assert ours == recipe


def test_messages_tool_error_is_marked_where_deepseek_recipe_drops_is_error(pipeline: ChatPipeline) -> None:
    """Documented difference: ``is_error`` results are prefixed so the model can tell a failure."""
    failed = {**RESULT_1, "content": "boom", "is_error": True}
    ours, recipe = messages_prompts(
        pipeline,
        {"tools": [WEATHER], "messages": [ASK, CALLS, {"role": "user", "content": [failed, RESULT_2]}]},
    )
    assert "<tool_result>boom</tool_result>" in recipe
    assert ours == recipe.replace("<tool_result>boom<", f"<tool_result>{TOOL_ERROR_PREFIX}boom<")


def test_messages_named_tool_choice_in_thinking_mode_is_served_where_deepseek_recipe_refuses(
    pipeline: ChatPipeline,
) -> None:
    """Documented difference: a named tool is enforced by a grammar that still allows reasoning first."""
    body = {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}, "messages": [ASK]}
    with pytest.raises(dr.ConversionError):
        messages_prompts(pipeline, body)
    ours = our_prompt(pipeline, convert_messages_request({"max_tokens": 100, "model": RECIPE_MODEL, **body}))
    auto, _ = messages_prompts(pipeline, {**body, "tool_choice": {"type": "auto"}})
    assert ours == auto  # the choice constrains decoding, not the prompt


# --------------------------------------------------------------------------- OpenAI Responses

FUNCTION = {
    "type": "function",
    "name": "get_weather",
    "description": "Get weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ROUND_TRIP: list[dict[str, Any]] = [
    {"role": "user", "content": "w?"},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "R"}]},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
    {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
    {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
    {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "Rain"}]},
]

RESPONSES_AGREE: dict[str, dict[str, Any]] = {
    "string input": {"input": "hi"},
    "instructions": {"input": "hi", "instructions": "Be brief."},
    "effort none (thinking off)": {"input": "hi", "reasoning": {"effort": "none"}},
    "effort low": {"input": "hi", "reasoning": {"effort": "low"}},
    "effort medium": {"input": "hi", "reasoning": {"effort": "medium"}},
    "effort xhigh": {"input": "hi", "reasoning": {"effort": "xhigh"}},
    "input_text parts": {
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
            }
        ]
    },
    "system item": {"input": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u"}]},
    "function call round trip": {"input": ROUND_TRIP, "tools": [FUNCTION]},
    "summary-only reasoning is not reasoning text": {
        "input": [
            ROUND_TRIP[0],
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "S"}]},
            *ROUND_TRIP[2:],
        ],
        "tools": [FUNCTION],
    },
    "json_schema text format": {
        "input": "hi",
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    },
    "multi turn": {
        "input": [
            {"role": "user", "content": "a"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
            {"role": "user", "content": "b"},
        ]
    },
}


@pytest.mark.parametrize("name", list(RESPONSES_AGREE))
def test_responses_prompt_equals_deepseek_recipe(pipeline: ChatPipeline, name: str) -> None:
    ours, recipe = responses_prompts(pipeline, RESPONSES_AGREE[name])
    assert ours == recipe


def test_responses_developer_message_is_a_system_message_where_deepseek_recipe_makes_it_user_text(
    pipeline: ChatPipeline,
) -> None:
    """Documented difference: OpenAI defines developer messages as system instructions."""
    body = {"input": [{"role": "developer", "content": "dev"}, {"role": "user", "content": "u"}]}
    ours, recipe = responses_prompts(pipeline, body)
    as_system, _ = responses_prompts(
        pipeline, {"input": [{"role": "system", "content": "dev"}, body["input"][1]]}
    )
    assert ours == as_system
    assert "<｜User｜>dev\n\nu" in recipe


def test_responses_reasoning_returned_as_encrypted_content_is_rendered(pipeline: ChatPipeline) -> None:
    """Documented difference: our ``encrypted_content`` carries the reasoning text back (deepseek-recipe
    cannot read it and renders an empty reasoning)."""
    blob = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encode_reasoning("R")}
    ours, _ = responses_prompts(
        pipeline, {"input": [ROUND_TRIP[0], blob, *ROUND_TRIP[2:]], "tools": [FUNCTION]}
    )
    plain, _ = responses_prompts(pipeline, {"input": ROUND_TRIP, "tools": [FUNCTION]})
    assert ours == plain


def test_responses_required_tool_choice_in_thinking_mode_is_served_where_deepseek_recipe_refuses(
    pipeline: ChatPipeline,
) -> None:
    """Documented difference: the choice is a decoding constraint that allows reasoning first."""
    body = {"input": "w?", "tools": [FUNCTION], "tool_choice": "required"}
    with pytest.raises(dr.ConversionError):
        responses_prompts(pipeline, body)
    ours = our_prompt(pipeline, convert_responses_request({"model": RECIPE_MODEL, **body}))
    _, auto = responses_prompts(pipeline, {**body, "tool_choice": "auto"})
    assert ours == auto


def test_responses_json_object_needs_no_json_word_unlike_deepseek_recipe(pipeline: ChatPipeline) -> None:
    """Documented difference: OpenAI's "mention json" rule is not applied."""
    body = {"input": "hi", "text": {"format": {"type": "json_object"}}}
    with pytest.raises(dr.ConversionError):
        responses_prompts(pipeline, body)
    ours = our_prompt(pipeline, convert_responses_request({"model": RECIPE_MODEL, **body}))
    assert ours.endswith("<｜User｜>hi<｜Assistant｜><think>")
