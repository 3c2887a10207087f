"""The family registry hands out a format module per detected family."""

from __future__ import annotations

import inspect

import pytest

from deepseek_frontend.errors import UnsupportedModelError
from deepseek_frontend.formats import FAMILIES, dsv4, dsv32, get_chat_format


def test_known_families_map_to_their_format_modules() -> None:
    assert get_chat_format("deepseek_v4") is dsv4
    assert get_chat_format("deepseek_v32") is dsv32
    assert FAMILIES == ("deepseek_v4", "deepseek_v41", "deepseek_v32")


def test_every_format_module_offers_the_same_entry_points() -> None:
    for family in ("deepseek_v4", "deepseek_v32"):
        module = get_chat_format(family)
        assert family == module.FAMILY
        for name in ("render_prompt_segments", "encode_messages", "parse_message_from_completion_text"):
            assert callable(getattr(module, name))


@pytest.mark.parametrize("family", ["deepseek_v4", "deepseek_v32"])
def test_encode_messages_takes_exactly_the_arguments_of_render_prompt_segments(family: str) -> None:
    # Callers (the API pipeline, the render command) pick arguments by signature.
    module = get_chat_format(family)
    render = inspect.signature(module.render_prompt_segments)
    encode = inspect.signature(module.encode_messages)
    assert list(encode.parameters.values()) == list(render.parameters.values())
    assert encode.return_annotation == "str"
    messages = [{"role": "user", "content": "hi"}]
    assert module.encode_messages(messages, thinking_mode="chat", context=None) == "".join(
        segment.text for segment in module.render_prompt_segments(messages, "chat")
    )


def test_v41_has_a_format() -> None:
    assert get_chat_format("deepseek_v41").FAMILY == "deepseek_v41"


@pytest.mark.parametrize("family", ["llama", "", None, "DEEPSEEK_V4"])
def test_unknown_families_are_refused(family: str | None) -> None:
    with pytest.raises(UnsupportedModelError, match="no DeepSeek chat format"):
        get_chat_format(family)
