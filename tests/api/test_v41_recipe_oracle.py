"""deepseek-recipe as the second oracle for DeepSeek-V4.1 request conversion.

For each request below, the prompt this server renders (the API converter ->
``to_chat_request`` -> ``PromptRenderer``, V4.1 with the ``release`` effort table) must
equal what DeepSeek's own converter and ``DeepseekV41Encoding`` render, or differ exactly
as docs/formats.md tables it ("Where deepseek-recipe and the reference differ").
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import deepseek_recipe as dr
import pytest

from deepseek_frontend.api.adapters import to_chat_request as converted_to_chat_request
from deepseek_frontend.api.anthropic.convert import convert_messages_request
from deepseek_frontend.api.openai.chat_request import to_chat_request as openai_to_chat_request
from deepseek_frontend.api.responses.convert import convert_responses_request
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.formats import join_segments
from deepseek_frontend.pipeline.chat import PromptRenderer

MODEL = "DeepSeek-V4.1-Flash"
CONFIG = ServerConfig(
    ModelConfig(served_model_name=MODEL, family="deepseek_v41", reasoning_effort_profile="release")
)
RENDERER = PromptRenderer("deepseek_v41", "release")


def recipe(make: Callable[[dict[str, Any]], Any], body: dict[str, Any]) -> str:
    converted = make({**copy.deepcopy(body), "model": MODEL}).convert(dr.ConversionOptions())
    return dr.DeepseekV41Encoding().render_conversation(converted.conversation).prompt


def ours_openai(body: dict[str, Any]) -> str:
    return join_segments(
        RENDERER.render(openai_to_chat_request({**copy.deepcopy(body), "model": MODEL}, CONFIG, "o"))
    )


def ours_converted(convert: Callable[[Any], Any], body: dict[str, Any]) -> str:
    request = converted_to_chat_request(convert({**copy.deepcopy(body), "model": MODEL}), CONFIG, "o")
    return join_segments(RENDERER.render(request))


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
ASK = {"role": "user", "content": "Weather in Paris?"}

OPENAI_SAME = {
    "plain": {"messages": [ASK]},
    "chat-mode": {"messages": [ASK], "thinking": {"type": "disabled"}},
    "system": {"messages": [{"role": "system", "content": "Be brief."}, ASK]},
    **{
        f"effort-{w}": {"messages": [ASK], "reasoning_effort": w}
        for w in ("minimal", "low", "medium", "high", "xhigh", "max")
    },
    "tools": {"messages": [ASK], "tools": [WEATHER]},
    "tools-and-system": {"messages": [{"role": "system", "content": "S"}, ASK], "tools": [WEATHER]},
    "tool-loop": {
        "messages": [
            ASK,
            {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [WEATHER],
    },
    "multi-turn": {
        "messages": [
            ASK,
            {"role": "assistant", "content": "Sunny.", "reasoning_content": "r"},
            {"role": "user", "content": "And Rome?"},
        ]
    },
    "mid-system": {
        "messages": [ASK, {"role": "assistant", "content": "a"}, {"role": "system", "content": "New rule"}]
    },
    "mid-system-then-user": {
        "messages": [
            ASK,
            {"role": "assistant", "content": "a"},
            {"role": "system", "content": "New rule"},
            {"role": "user", "content": "q"},
        ]
    },
    "text-parts": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]
    },
    "json-schema": {
        "messages": [ASK],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}},
        },
    },
    # DeepSeek's API continues a last assistant message marked "prefix": true; this server continues
    # any last assistant message (the flag is accepted and changes nothing)
    "prefix-continuation": {"messages": [ASK, {"role": "assistant", "content": "It is", "prefix": True}]},
}


@pytest.mark.parametrize("body", OPENAI_SAME.values(), ids=OPENAI_SAME.keys())
def test_openai_requests_render_as_deepseek_recipe_renders_them(body: dict[str, Any]) -> None:
    assert ours_openai(body) == recipe(dr.ChatCompletionRequest, body)


def test_developer_messages_are_system_messages_where_deepseek_recipe_refuses_them() -> None:
    body = {"messages": [{"role": "developer", "content": "Be brief."}, ASK]}
    with pytest.raises(ValueError, match="developer"):
        recipe(dr.ChatCompletionRequest, body)
    system = {"messages": [{"role": "system", "content": "Be brief."}, ASK]}
    assert ours_openai(body) == recipe(dr.ChatCompletionRequest, system)


def test_recipe_spells_the_image_placeholder_differently_for_the_same_id() -> None:
    # deepseek-recipe writes <｜image｜> in its prompt text; the id is 129264 either way, the id
    # the V4.1 tokenizer (and our stand-in) gives <｜deepseek_image｜>.
    png = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQ"
        "GAhKmMIQAAAABJRU5ErkJggg=="
    )
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what"},
                    {"type": "image_url", "image_url": {"url": png}},
                ],
            }
        ]
    }
    theirs = recipe(dr.ChatCompletionRequest, body)
    assert dr.IMAGE_SPECIAL_TOKEN_ID == 129264
    assert ours_openai(body) == theirs.replace("<｜image｜>", "<｜deepseek_image｜>")


TOOL = {
    "name": "get_weather",
    "description": "w",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
HI = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}
MESSAGES_SAME = {
    "plain": HI,
    "system": {**HI, "system": "Be brief."},
    "effort-medium": {**HI, "output_config": {"effort": "medium"}},
    "effort-max": {**HI, "output_config": {"effort": "max"}},
    "no-thinking": {**HI, "thinking": {"type": "disabled"}},
    "tools": {**HI, "tools": [TOOL]},
    "tool-loop": {
        **HI,
        "tools": [TOOL],
        "messages": [
            {"role": "user", "content": "w?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
    },
}


@pytest.mark.parametrize("body", MESSAGES_SAME.values(), ids=MESSAGES_SAME.keys())
def test_messages_requests_render_as_deepseek_recipe_renders_them(body: dict[str, Any]) -> None:
    assert ours_converted(convert_messages_request, body) == recipe(dr.MessagesRequest, body)


def test_thinking_budget_tokens_set_the_effort_where_deepseek_recipe_ignores_them() -> None:
    body = {**HI, "thinking": {"type": "enabled", "budget_tokens": 4096}}
    assert "Reasoning Effort: 75 " in recipe(dr.MessagesRequest, body)
    assert "Reasoning Effort: 55 " in ours_converted(convert_messages_request, body)


RESPONSES_SAME = {
    "plain": {"input": "hi"},
    "instructions": {"input": "hi", "instructions": "Be brief."},
    "effort-low": {"input": "hi", "reasoning": {"effort": "low"}},
    "effort-xhigh": {"input": "hi", "reasoning": {"effort": "xhigh"}},
    "developer": {
        "input": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    },
}


@pytest.mark.parametrize("body", RESPONSES_SAME.values(), ids=RESPONSES_SAME.keys())
def test_responses_requests_render_as_deepseek_recipe_renders_them(body: dict[str, Any]) -> None:
    assert ours_converted(convert_responses_request, body) == recipe(dr.ResponsesRequest, body)
