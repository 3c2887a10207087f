"""OpenAI chat bodies -> ChatRequest: every rejection names its field, every switch lands."""

from __future__ import annotations

from typing import Any

import pytest

from deepseek_frontend.api.openai.chat_request import to_chat_request
from deepseek_frontend.errors import ModelNotFoundError, RequestError
from deepseek_frontend.fleet.config import ModelAlias, ModelConfig, ServerConfig

CONFIG = ServerConfig(
    ModelConfig(
        served_model_name="deepseek-v4-flash",
        model_aliases=(ModelAlias("claude-*", "deepseek-v4-flash"), ModelAlias("ds", "deepseek-v4-flash")),
    )
)
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hi"}], **fields}


def rejected(data: dict[str, Any]) -> RequestError:
    with pytest.raises(RequestError) as info:
        to_chat_request(data, CONFIG, "chatcmpl-test")
    assert info.value.status_code == 400
    return info.value


@pytest.mark.parametrize(
    ("data", "param"),
    [
        ({"model": "deepseek-v4-flash"}, "messages"),
        (body(messages=[]), "messages"),
        (body(messages=["hi"]), "messages[0]"),
        (body(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
        (body(messages=[{"role": "user"}]), "messages[0].content"),
        (body(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
        (
            body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]),
            "messages[0].content[0].type",
        ),
        (body(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text"),
        (
            body(
                messages=[
                    {"role": "user", "content": "x"},
                    {"role": "assistant", "content": None, "tool_calls": [{"function": {"arguments": "{}"}}]},
                ]
            ),
            "messages[1].tool_calls[0].function.name",
        ),
        (
            body(
                messages=[
                    {
                        "role": "assistant",
                        "content": "x",
                        "tool_calls": [{"function": {"name": "f", "arguments": 3}}],
                    }
                ]
            ),
            "messages[0].tool_calls[0].function.arguments",
        ),
        (body(tools=[{"type": "retrieval"}]), "tools[0].type"),
        (body(tools=[TOOL, TOOL]), "tools[1].function.name"),
        (body(tool_choice="required"), "tool_choice"),
        (
            body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
            "tool_choice.function.name",
        ),
        (body(tools=[TOOL], tool_choice="sometimes"), "tool_choice"),
        (body(thinking={"type": "maybe"}), "thinking.type"),
        (body(chat_template_kwargs={"thinking": "yes"}), "chat_template_kwargs.thinking"),
        (body(reasoning_effort="galaxy-brain"), "reasoning_effort"),
        (body(max_tokens=0), "max_tokens"),
        (body(max_tokens="10"), "max_tokens"),
        (body(max_completion_tokens=-1), "max_completion_tokens"),
        (body(temperature=3), "temperature"),
        (body(top_p="high"), "top_p"),
        (body(n=0), "n"),
        (body(n=1000), "n"),
        (body(top_logprobs=2), "top_logprobs"),
        (body(logprobs=True, top_logprobs=50), "top_logprobs"),
        (body(stream_options={"include_usage": True}), "stream_options"),
        (body(stop=[1, 2]), "stop"),
        (body(stop=[str(i) for i in range(40)]), "stop"),
        (body(response_format={"type": "xml"}), "response_format.type"),
        (body(seed=1.5), "seed"),
        (body(user=7), "user"),
        (body(model=7), "model"),
    ],
)
def test_invalid_fields_are_rejected_with_their_json_path(data: dict[str, Any], param: str) -> None:
    err = rejected(data)
    assert err.param == param
    assert err.message.startswith(f"{param}: "), "the message names the field first"


def test_image_parts_say_images_are_not_supported() -> None:
    err = rejected(
        body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}])
    )
    assert "images are not supported" in err.message


def test_unknown_model_is_404_but_aliases_and_globs_resolve() -> None:
    with pytest.raises(ModelNotFoundError) as info:
        to_chat_request(body(model="gpt-4o"), CONFIG, "r")
    assert info.value.status_code == 404
    assert info.value.param == "model"
    for name in ("claude-3-7-sonnet", "ds", "deepseek-v4-flash"):
        assert to_chat_request(body(model=name), CONFIG, "r").model == "deepseek-v4-flash"


@pytest.mark.parametrize(
    ("fields", "thinking"),
    [
        ({}, True),
        ({"thinking": {"type": "disabled"}}, False),
        ({"thinking": {"type": "enabled"}, "reasoning_effort": "none"}, True),
        ({"chat_template_kwargs": {"thinking": False}}, False),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "high"}, True),
    ],
)
def test_thinking_switches(fields: dict[str, Any], thinking: bool) -> None:
    assert to_chat_request(body(**fields), CONFIG, "r").thinking is thinking


def test_default_thinking_off_is_overridden_by_the_request() -> None:
    config = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash", default_thinking=False))
    assert to_chat_request(body(), config, "r").thinking is False
    assert to_chat_request(body(thinking={"type": "enabled"}), config, "r").thinking is True


def test_effort_words_are_normalized_for_the_profile() -> None:
    req = to_chat_request(body(reasoning_effort="max"), CONFIG, "r")
    assert req.reasoning_effort is not None
    assert to_chat_request(body(), CONFIG, "r").reasoning_effort is None


def test_assistant_history_maps_reasoning_tool_calls_and_object_arguments() -> None:
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "be"}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "look it up",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "It is sunny."},
    ]
    req = to_chat_request(body(messages=messages), CONFIG, "r")
    system, _, call_msg, tool_msg, plain = req.messages
    # text parts join with a blank line, as DeepSeek's reference and vLLM join them
    assert system == {"role": "system", "content": "be\n\nbrief"}
    assert call_msg["reasoning_content"] == "look it up"
    assert call_msg["content"] == ""
    assert call_msg["tool_calls"][0]["function"]["arguments"] == '{"city": "Zürich"}'
    assert tool_msg == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
    assert "reasoning_content" not in plain, "a client that drops reasoning is not an error"


def test_sampling_fields_and_limits_are_carried() -> None:
    req = to_chat_request(
        body(
            temperature=0.2,
            top_p=0.9,
            top_k=20,
            seed=5,
            presence_penalty=0.5,
            frequency_penalty=-0.5,
            max_tokens=100,
            max_completion_tokens=50,
            stop="###",
            n=3,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
            user="u1",
            response_format={"type": "json_object"},
        ),
        CONFIG,
        "r",
    )
    assert (req.temperature, req.top_p, req.top_k, req.seed) == (0.2, 0.9, 20, 5)
    assert (req.presence_penalty, req.frequency_penalty) == (0.5, -0.5)
    assert req.max_tokens == 50, "max_completion_tokens wins over max_tokens"
    assert req.stop == ("###",)
    assert (req.n, req.logprobs, req.top_logprobs, req.include_usage, req.user) == (3, True, 2, True, "u1")
    assert req.response_format == {"type": "json_object"}


def test_tool_choice_forms() -> None:
    assert to_chat_request(body(tools=[TOOL]), CONFIG, "r").tool_choice == "auto"
    assert to_chat_request(body(tools=[TOOL], tool_choice="none"), CONFIG, "r").tool_choice == "none"
    named = to_chat_request(
        body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}), CONFIG, "r"
    )
    assert named.tool_choice == {"type": "function", "function": {"name": "f"}}
