"""Instructions are never lost: developer and mid-conversation system messages on every API.

The prompts are compared with DeepSeek's own converter (deepseek-recipe) where it defines
the piece: it renders an Anthropic mid-conversation system message as a
``<system-reminder>`` user text beside the next user turn, and an OpenAI assistant
message with ``prefix: true`` as an open assistant turn. Where the recipe drops or moves an
instruction (OpenAI ``developer`` is refused, mid-conversation OpenAI system messages are
hoisted to the start) this server keeps it in place, rendered as the Anthropic case is.
"""

from __future__ import annotations

from typing import Any

import deepseek_recipe as dr
import pytest

from deepseek_frontend.api.anthropic.convert import convert_messages_request
from deepseek_frontend.api.openai.chat_request import to_chat_request as openai_to_chat_request
from deepseek_frontend.api.responses.convert import convert_responses_request
from deepseek_frontend.formats import place_instructions
from deepseek_frontend.formats.request import SYSTEM_REMINDER_TEMPLATE
from deepseek_frontend.pipeline.chat import ChatPipeline
from deepseek_frontend.tokenization import PromptTokenizer

from .test_recipe_oracle import (
    RECIPE_CONFIG,
    RECIPE_MODEL,
    messages_prompts,
    our_prompt,
    pipeline,
    recipe_prompt,
)

__all__ = ["pipeline"]  # the fixture, re-used from the oracle module

MID = "Use British spelling from now on."
REMINDER = SYSTEM_REMINDER_TEMPLATE.format(text=MID)


def openai_prompt(pipe: ChatPipeline, body: dict[str, Any]) -> str:
    req = openai_to_chat_request({"model": RECIPE_MODEL, **body}, RECIPE_CONFIG, "oracle")
    return pipe.tokenizer.decode(pipe.prepare(req).input_ids)


# --------------------------------------------------------------------------- Anthropic


def test_anthropic_mid_conversation_system_renders_as_deepseek_recipe_renders_it(
    pipeline: ChatPipeline,
) -> None:
    body = {
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": MID},
            {"role": "user", "content": "colour of the sky?"},
        ],
    }
    ours, recipe = messages_prompts(pipeline, body)
    assert ours == recipe
    assert f"<｜User｜>{REMINDER}\n\ncolour of the sky?<｜Assistant｜>" in ours


def test_anthropic_mid_conversation_system_as_text_blocks_after_tool_results(pipeline: ChatPipeline) -> None:
    """Claude Code's shape: the instruction arrives between the tool results and the next turn."""
    tool = {
        "name": "ls",
        "description": "list",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    body = {
        "tools": [tool],
        "messages": [
            {"role": "user", "content": "list files"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}],
            },
            {"role": "system", "content": [{"type": "text", "text": MID}]},
        ],
    }
    ours, recipe = messages_prompts(pipeline, body)
    assert ours == recipe
    assert ours.endswith(f"<tool_result>a.txt</tool_result>\n\n{REMINDER}<｜Assistant｜><think>")


# --------------------------------------------------------------------------- OpenAI chat


def test_openai_developer_message_is_the_system_prompt(pipeline: ChatPipeline) -> None:
    """The reference encoder makes a developer message a user turn, which thinking mode then drops
    before the last user turn; an OpenAI client means it as the system prompt."""
    as_developer = openai_prompt(
        pipeline,
        {
            "messages": [
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": "hi"},
            ]
        },
    )
    as_system = openai_prompt(
        pipeline,
        {"messages": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "hi"}]},
    )
    assert as_developer == as_system
    assert "Answer in French.<｜User｜>hi<｜Assistant｜><think>" in as_developer


def test_openai_leading_system_and_developer_join_like_deepseek_recipe_joins_system_messages(
    pipeline: ChatPipeline,
) -> None:
    body = {
        "messages": [
            {"role": "system", "content": "S1"},
            {"role": "developer", "content": "D1"},
            {"role": "user", "content": "hi"},
        ]
    }
    recipe_body = {
        "messages": [
            {"role": "system", "content": "S1"},
            {"role": "system", "content": "D1"},
            body["messages"][2],
        ]
    }
    assert openai_prompt(pipeline, body) == recipe_prompt(dr.ChatCompletionRequest, recipe_body)


@pytest.mark.parametrize("role", ["system", "developer"])
def test_openai_later_instruction_is_kept_in_place_as_the_anthropic_one_is(
    pipeline: ChatPipeline, role: str
) -> None:
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    ours = openai_prompt(
        pipeline,
        {"messages": [*history, {"role": role, "content": MID}, {"role": "user", "content": "and now?"}]},
    )
    anthropic, _ = messages_prompts(
        pipeline,
        {"messages": [*history, {"role": "system", "content": MID}, {"role": "user", "content": "and now?"}]},
    )
    assert ours == anthropic
    # the later instruction is at its place in the conversation, not hoisted into the system prompt
    assert ours.index("hello") < ours.index(MID)


def test_openai_content_parts_join_with_a_blank_line_as_the_reference_joins_them(
    pipeline: ChatPipeline,
) -> None:
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]
    }
    ours = openai_prompt(pipeline, body)
    assert ours == recipe_prompt(dr.ChatCompletionRequest, body)
    assert "<｜User｜>a\n\nb<｜Assistant｜>" in ours


@pytest.mark.parametrize("thinking", [True, False])
def test_openai_last_assistant_message_is_continued_as_deepseek_recipe_continues_a_prefix(
    pipeline: ChatPipeline, thinking: bool
) -> None:
    messages = [{"role": "user", "content": "Write a haiku."}, {"role": "assistant", "content": "Autumn"}]
    switch = {"thinking": {"type": "enabled" if thinking else "disabled"}}
    ours = openai_prompt(pipeline, {"messages": messages, **switch})
    recipe_messages = [messages[0], {**messages[1], "prefix": True}]
    assert ours == recipe_prompt(dr.ChatCompletionRequest, {"messages": recipe_messages, **switch})
    assert ours.endswith("</think>Autumn")


def test_a_last_assistant_message_with_tool_calls_is_refused_with_its_path(pipeline: ChatPipeline) -> None:
    from deepseek_frontend.errors import RequestError

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ]
    }
    with pytest.raises(RequestError) as err:
        openai_prompt(pipeline, body)
    assert err.value.param == "messages[1].tool_calls"
    assert "tool results" in err.value.message


# --------------------------------------------------------------------------- Responses


def test_responses_system_item_mid_conversation_is_kept_in_place(pipeline: ChatPipeline) -> None:
    body = {
        "model": RECIPE_MODEL,
        "input": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": MID},
            {"role": "user", "content": "and now?"},
        ],
    }
    ours = our_prompt(pipeline, convert_responses_request(body))
    assert ours.count("Be brief.") == 1 and ours.index("Be brief.") < ours.index("<｜User｜>hi")
    assert f"<｜User｜>{REMINDER}\n\nand now?<｜Assistant｜><think>" in ours


# --------------------------------------------------------------------------- V3.2 and the pure function


def test_v32_gets_the_reminder_inside_the_next_user_turn(prompt_tokenizer: PromptTokenizer) -> None:
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig

    from .test_recipe_oracle import render_only

    config = ServerConfig(ModelConfig(served_model_name="deepseek-v3.2", family="deepseek_v32"))
    v32 = render_only(config, prompt_tokenizer)
    body = {
        "model": "deepseek-v3.2",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "developer", "content": MID},
            {"role": "user", "content": "and now?"},
        ],
        "thinking": {"type": "disabled"},
    }
    req = openai_to_chat_request(body, config, "r")
    prompt = v32.tokenizer.decode(v32.prepare(req).input_ids)
    assert prompt.endswith(f"<｜User｜>{REMINDER}\n\nand now?<｜Assistant｜></think>")
    assert prompt.count("<｜User｜>") == 2


def test_place_instructions_never_mutates_and_keeps_a_native_system_role_in_place() -> None:
    messages = [
        {"role": "developer", "content": "D"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "system", "content": MID},
        {"role": "user", "content": "v"},
    ]
    snapshot = [dict(m) for m in messages]
    native = place_instructions(messages, native_system_role=True)
    assert messages == snapshot
    assert native[0] == {"role": "system", "content": "D"}
    assert native[3] == {"role": "system", "content": MID}
    folded = place_instructions(messages)
    assert [m["role"] for m in folded] == ["system", "user", "assistant", "user"]
    assert folded[3]["content"] == f"{REMINDER}\n\nv"


def test_anthropic_conversation_of_only_system_messages_is_refused() -> None:
    from deepseek_frontend.errors import RequestError

    with pytest.raises(RequestError) as err:
        convert_messages_request(
            {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}
        )
    assert err.value.param == "messages"


# --------------------------------------------------------------------------- 0731 tool normalisation

OBJ = {
    "type": "object",
    "properties": {
        "b": {"type": "integer"},
        "a": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    "function",
    [
        {"name": "f", "parameters": OBJ},  # no description: ""
        {"parameters": OBJ, "description": "d", "name": "f"},  # key order fixed
        {"name": "f", "description": "d", "parameters": OBJ, "strict": False},  # extra keys dropped
        {
            "name": "f",
            "description": "d",
            "parameters": OBJ,
            "strict": True,
        },  # strict spelled out, nested too
        {"name": "f", "description": "d"},  # no parameters: {}
    ],
)
def test_official_profile_renders_tools_as_deepseek_recipe_normalises_them(
    pipeline: ChatPipeline, function: dict[str, Any]
) -> None:
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": function}],
    }
    assert openai_prompt(pipeline, body) == recipe_prompt(dr.ChatCompletionRequest, body)


def test_preview_profile_renders_tools_as_the_preview_reference_encoder_does(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    """The April reference encoder (encoding_dsv4.py) writes the function object as sent."""
    from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
    from deepseek_frontend.formats import dsv4

    from .test_recipe_oracle import render_only

    config = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash"))
    preview = render_only(config, prompt_tokenizer)
    function = {"name": "f", "parameters": OBJ, "strict": True}
    body = {
        "model": "deepseek-v4-flash",
        "messages": [{"role": "user", "content": "x"}],
        "tools": [{"type": "function", "function": function}],
    }
    prompt = preview.tokenizer.decode(preview.prepare(openai_to_chat_request(body, config, "r")).input_ids)
    reference = dsv4.encode_messages(
        [{"role": "system", "content": "", "tools": body["tools"]}, body["messages"][0]], "thinking"
    )
    assert prompt == reference
    assert '"strict": true' in prompt
