"""Tool search over HTTP with the official ``anthropic`` SDK: search, load, call, answer.

The simulated model (engines/sim/model.py, "Tool search" and "Loaded tools") calls the
``ToolSearch`` tool for a tool-like word that names no declared tool, then calls the tool a
``tool_reference`` loaded, then answers from its result -- the loop Claude Code runs. Each
request's prompt extends the previous one, which the engine's prefix cache shows in
``cache_read_input_tokens``.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from deepseek_frontend.engines.sim.engine import PAGE_SIZE

from .test_tool_search import SEARCH, STOCKS, WEATHER

MODEL = "claude-sonnet-4-5"
#: the simulated engine reports cached tokens in whole pages of this many tokens
PAGE = PAGE_SIZE
#: an agent's standing instructions: long enough (over a page) that the loop's prompts share cached pages
SYSTEM = "Be brief. " + " ".join(
    f"Rule {n}: look a tool up with ToolSearch before calling it, call it with the arguments its "
    "schema names, and answer from what it returns."
    for n in range(12)
)
NO_THINKING: Any = {"type": "disabled"}


def _create(client: anthropic.Anthropic, messages: list[Any], **extra: Any) -> Any:
    return client.messages.create(
        model=MODEL,
        max_tokens=300,
        system=SYSTEM,
        tools=[SEARCH, WEATHER, STOCKS],
        thinking=NO_THINKING,
        messages=messages,
        **extra,
    )


def _prompt_tokens(message: Any) -> int:
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


def test_search_load_call_answer_loop_with_prefix_cache_hits(client: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris? Use get_weather."}]
    first = _create(client, messages)
    search = next(b for b in first.content if b.type == "tool_use")
    assert (search.name, search.input) == ("ToolSearch", {"query": "select:get_weather"})

    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": search.id,
                    "content": [{"type": "tool_reference", "tool_name": "get_weather"}],
                }
            ],
        },
    ]
    second = _create(client, messages)
    call = next(b for b in second.content if b.type == "tool_use")
    assert call.name == "get_weather" and isinstance(call.input.get("city"), str)
    # the first prompt is a prefix of the second: all its whole pages come from the cache
    assert second.usage.cache_read_input_tokens >= _prompt_tokens(first) // PAGE * PAGE > 0

    counted = client.messages.count_tokens(
        model=MODEL,
        system=SYSTEM,
        tools=[SEARCH, WEATHER, STOCKS],
        thinking=NO_THINKING,
        messages=messages,
    )
    assert counted.input_tokens == _prompt_tokens(second)

    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}],
        },
    ]
    third = _create(client, messages)
    assert third.stop_reason == "end_turn"
    assert "Sunny, 21 C" in "".join(b.text for b in third.content if b.type == "text")
    assert third.usage.cache_read_input_tokens >= _prompt_tokens(second) // PAGE * PAGE


def test_unreferenced_deferred_tools_are_not_in_the_prompt(client: anthropic.Anthropic) -> None:
    messages: list[Any] = [{"role": "user", "content": "Reply with exactly: hi"}]
    plain = client.messages.count_tokens(model=MODEL, tools=[SEARCH], messages=messages)
    with_deferred = client.messages.count_tokens(
        model=MODEL, tools=[SEARCH, WEATHER, STOCKS], messages=messages
    )
    assert with_deferred.input_tokens == plain.input_tokens
    loaded_up_front = client.messages.count_tokens(
        model=MODEL, tools=[SEARCH, {**WEATHER, "defer_loading": False}], messages=messages
    )
    assert loaded_up_front.input_tokens > plain.input_tokens


def test_forcing_a_referenced_deferred_tool_calls_it(client: anthropic.Anthropic) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "Find a tool."},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_s", "name": "ToolSearch", "input": {"query": "stock"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_s",
                    "content": [{"type": "tool_reference", "tool_name": "get_stock_price"}],
                },
                {"type": "text", "text": "Now use it."},
            ],
        },
    ]
    forced = _create(client, messages, tool_choice={"type": "tool", "name": "get_stock_price"})
    assert [b.name for b in forced.content if b.type == "tool_use"] == ["get_stock_price"]


@pytest.mark.parametrize(
    ("tool_name", "tools", "where"),
    [
        ("get_time", [SEARCH, WEATHER], "messages[2].content[0].content[0].tool_name"),
        ("get_weather", [{**SEARCH, "defer_loading": True}, WEATHER], "tools"),
    ],
)
def test_bad_tool_search_requests_are_invalid_request_errors(
    client: anthropic.Anthropic, tool_name: str, tools: list[Any], where: str
) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "tool_reference", "tool_name": tool_name}],
                }
            ],
        },
    ]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=50, tools=tools, messages=messages)
    body = err.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith(f"{where}:")
