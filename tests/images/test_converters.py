"""Image parts in the three API converters: where each part lands and the path it carries.

A model that reads images (V4.1) keeps them as image parts in order, named by their request path
(which every later 400 quotes); a text-only model refuses them, naming the part.
"""

from __future__ import annotations

from typing import Any

import pytest

from deepseek_frontend.api.anthropic.convert import IMAGE_PLACEHOLDER, convert_messages_request
from deepseek_frontend.api.openai.chat_request import to_chat_request
from deepseek_frontend.api.responses.convert import convert_responses_request
from deepseek_frontend.errors import RequestError
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.formats.dsv41 import ImagePart

URL = "data:image/png;base64,iVBORw0KGgo="
V41 = ServerConfig(
    ModelConfig(
        served_model_name="deepseek-v4.1-flash", family="deepseek_v41", reasoning_effort_profile="release"
    )
)
V4 = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash"))
IMAGE_URL_PART = {"type": "image_url", "image_url": {"url": URL}}
INPUT_IMAGE = {"type": "input_image", "image_url": URL}
CALL = {"name": "f", "arguments": "{}"}


def parts(content: list[Any]) -> list[tuple[str, str]]:
    """``(kind, text or path)`` of each part."""
    return [("image", p.extra["where"]) if isinstance(p, ImagePart) else ("text", p["text"]) for p in content]


def test_openai_image_url_parts_in_user_and_tool_messages() -> None:
    body = {
        "model": "deepseek-v4.1-flash",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, IMAGE_URL_PART]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": CALL}]},
            {"role": "tool", "tool_call_id": "c", "content": [{"type": "image_url", "image_url": URL}]},
        ],
    }  # fmt: skip
    req = to_chat_request(body, V41, "r")
    assert parts(req.messages[0]["content"]) == [("text", "a"), ("image", "messages[0].content[1]")]
    assert req.messages[0]["content"][1].url == URL
    assert parts(req.messages[2]["content"]) == [("image", "messages[2].content[0]")]
    # text-only parts keep the string form every family renders
    plain = to_chat_request(
        {**body, "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]}, V41, "r"
    )
    assert plain.messages[0]["content"] == "x"


def test_openai_images_on_a_text_only_model_are_refused_naming_the_part() -> None:
    body = {
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": URL}}]}],
    }
    with pytest.raises(RequestError) as info:
        to_chat_request(body, V4, "r")
    assert info.value.param == "messages[0].content[0].type" and "text only" in info.value.message


def _anthropic(content: list[Any]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": content}


def test_anthropic_image_blocks_and_tool_result_images() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    url_image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    body = _anthropic(
        [
            {"role": "user", "content": [image, {"type": "text", "text": "what?"}, url_image]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "shot", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "is_error": True, "content": [image]}
                ],
            },
        ]
    )
    messages = convert_messages_request(body, read_images=True).messages
    assert parts(messages[0]["content"]) == [
        ("image", "messages[0].content[0]"),
        ("text", "what?"),
        ("image", "messages[0].content[2]"),
    ]
    assert messages[0]["content"][0].url == "data:image/png;base64,iVBORw0KGgo="
    assert messages[0]["content"][2].url == "https://example.com/a.png"
    assert messages[2]["role"] == "tool"
    assert parts(messages[2]["content"]) == [
        ("text", "Error:"),
        ("image", "messages[2].content[0].content[0]"),
    ]
    # a text-only model: the user image is refused, a tool-result image becomes the placeholder text
    with pytest.raises(RequestError) as info:
        convert_messages_request(body)
    assert info.value.param == "messages[0].content[0].type"
    tool_only = _anthropic(body["messages"][1:])
    tool_only["messages"].insert(0, {"role": "user", "content": "go"})
    assert IMAGE_PLACEHOLDER in convert_messages_request(tool_only).messages[2]["content"]


def test_responses_input_image_in_messages_and_function_call_output() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, INPUT_IMAGE]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": [INPUT_IMAGE]},
        ],
    }  # fmt: skip
    messages = convert_responses_request(body, read_images=True).messages
    assert parts(messages[0]["content"]) == [("text", "a"), ("image", "input[0].content[1]")]
    assert parts(messages[2]["content"]) == [("image", "input[2].output[0]")]
    with pytest.raises(RequestError) as info:
        convert_responses_request(body)
    assert info.value.param == "input[0].content[1].type"
