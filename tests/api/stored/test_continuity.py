"""Reasoning continuity: a client that drops the reasoning of a tool-calling answer gets the prompt
of a client that kept it -- for the same API key, byte-equal turn text and tool-call ids only."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support import tools
from tests.support.servers import Server

from .conftest import API_KEY, MODEL, sdk, start_stored

OTHER_KEY = "continuity-other-key"
QUESTION = "What's the weather in Paris?"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with start_stored("--api-key", OTHER_KEY) as running:
        yield running


def _restored(server: Server, api: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    match = re.search(rf'deepseek_frontend_reasoning_restored_total{{api="{api}"}} ([0-9.e+]+)', text)
    return float(match.group(1)) if match else 0.0


def _chat_followup(client: openai.OpenAI, assistant: dict[str, Any], call_id: str) -> int:
    response = client.chat.completions.create(
        model=MODEL,
        tools=[tools.WEATHER.openai()],  # type: ignore[list-item]
        messages=[
            {"role": "user", "content": QUESTION},
            assistant,  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call_id, "content": '{"temp": 21}'},
        ],
    )
    assert response.usage is not None
    return response.usage.prompt_tokens


def test_chat_reasoning_dropped_by_the_client_is_restored(server: Server) -> None:
    client = sdk(server)
    first = client.chat.completions.create(
        model=MODEL, tools=[tools.WEATHER.openai()], messages=[{"role": "user", "content": QUESTION}]
    )
    message = first.choices[0].message
    assert message.tool_calls and message.reasoning_content  # type: ignore[attr-defined]
    call_id = message.tool_calls[0].id
    turn = {
        "role": "assistant",
        "content": message.content,
        "tool_calls": [c.model_dump() for c in message.tool_calls],
    }
    before = _restored(server, "chat")
    kept = _chat_followup(client, {**turn, "reasoning_content": message.reasoning_content}, call_id)  # type: ignore[attr-defined]
    assert _restored(server, "chat") == before  # the client kept it: nothing to restore
    dropped = _chat_followup(client, turn, call_id)
    assert dropped == kept  # the same prompt as the client that kept the reasoning
    assert _restored(server, "chat") == before + 1
    # never guessing: another text, or another API key, renders what the client sent
    changed = _chat_followup(client, {**turn, "content": (message.content or "") + " "}, call_id)
    assert changed < kept
    assert _chat_followup(sdk(server, OTHER_KEY), turn, call_id) < kept
    assert _restored(server, "chat") == before + 1


def test_responses_reasoning_item_dropped_by_the_client_is_restored(server: Server) -> None:
    client = sdk(server)
    common: dict[str, Any] = {"model": MODEL, "store": False, "tools": [tools.WEATHER.responses()]}
    first = client.responses.create(**common, input=QUESTION)
    output = [item.model_dump(exclude_none=True) for item in first.output]
    assert any(item["type"] == "reasoning" for item in output)
    call = next(item for item in output if item["type"] == "function_call")
    result = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temp": 21}'}
    before = _restored(server, "responses")
    kept = client.responses.create(**common, input=[{"role": "user", "content": QUESTION}, *output, result])
    without = [item for item in output if item["type"] != "reasoning"]
    dropped = client.responses.create(
        **common, input=[{"role": "user", "content": QUESTION}, *without, result]
    )
    assert kept.usage is not None and dropped.usage is not None
    assert dropped.usage.input_tokens == kept.usage.input_tokens
    assert _restored(server, "responses") == before + 1
    other = sdk(server, OTHER_KEY).responses.create(
        **common, input=[{"role": "user", "content": QUESTION}, *without, result]
    )
    assert other.usage is not None and other.usage.input_tokens < kept.usage.input_tokens


def test_anthropic_thinking_dropped_by_the_client_is_restored(server: Server) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=60)
    common: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 1024,
        "tools": [tools.WEATHER.anthropic()],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    question = {"role": "user", "content": QUESTION}
    first = client.messages.create(**common, messages=[question])
    blocks = [block.model_dump(exclude_none=True) for block in first.content]
    assert blocks[0]["type"] == "thinking" and any(b["type"] == "tool_use" for b in blocks)
    use = next(b for b in blocks if b["type"] == "tool_use")
    result = {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "21 C"}],
    }
    before = _restored(server, "anthropic")
    kept = client.messages.create(
        **common, messages=[question, {"role": "assistant", "content": blocks}, result]
    )
    without = [b for b in blocks if b["type"] != "thinking"]
    dropped = client.messages.create(
        **common, messages=[question, {"role": "assistant", "content": without}, result]
    )
    assert _prompt_tokens(dropped.usage) == _prompt_tokens(kept.usage)
    assert _restored(server, "anthropic") == before + 1
    other = anthropic.Anthropic(base_url=server.url, api_key=OTHER_KEY, max_retries=0, timeout=60)
    counted = other.messages.count_tokens(
        **{k: v for k, v in common.items() if k != "max_tokens"},
        messages=[question, {"role": "assistant", "content": without}, result],
    )
    assert counted.input_tokens < _prompt_tokens(kept.usage)  # another key: rendered as sent


def _prompt_tokens(usage: Any) -> int:
    """Anthropic's usage splits the prompt: uncached input plus cache reads and writes."""
    return (
        usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    )
