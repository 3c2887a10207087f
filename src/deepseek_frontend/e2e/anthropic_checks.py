"""Protocol checks of ``/v1/messages`` through the ``anthropic`` client: a tool_use / tool_result round
trip, and the streamed event order with ``input_json_delta`` that concatenates to valid input.
"""

from __future__ import annotations

import json
from typing import Any

from deepseek_frontend.e2e.context import TOOL_RESULT, WEATHER_PROMPT, WEATHER_SCHEMA, SuiteContext, user
from deepseek_frontend.e2e.expectations import (
    expect,
    expect_no_markup,
    expect_usage_anthropic,
    validate_schema,
)
from deepseek_frontend.e2e.runner import Inconclusive


def _anthropic_tool() -> dict[str, Any]:
    return {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "input_schema": WEATHER_SCHEMA,
    }


def check_anthropic_tool_round_trip(ctx: SuiteContext) -> str:
    client, tool = ctx.anthropic, _anthropic_tool()
    messages: list[dict[str, Any]] = user(WEATHER_PROMPT)
    first = client.messages.create(
        model=ctx.model,
        max_tokens=ctx.max_tokens,
        tools=[tool],
        tool_choice={"type": "any"},
        messages=messages,
    )
    expect(first.type == "message" and first.role == "assistant", f"type {first.type!r} role {first.role!r}")
    expect(first.stop_reason == "tool_use", f"stop_reason {first.stop_reason!r}, expected tool_use")
    uses = [b for b in first.content if b.type == "tool_use"]
    expect(len(uses) >= 1, "no tool_use block")
    for block in uses:
        expect(block.id and block.name == "get_weather", f"tool_use id {block.id!r} name {block.name!r}")
        expect(isinstance(block.input, dict), "tool_use input is not an object")
        validate_schema(block.input, WEATHER_SCHEMA, "tool_use input")
    for block in first.content:
        if block.type == "text":
            expect_no_markup(block.text, "text block")
    expect_usage_anthropic(first.usage)
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": b.id, "content": TOOL_RESULT} for b in uses],
        },
    ]
    second = client.messages.create(
        model=ctx.model, max_tokens=ctx.max_tokens, tools=[tool], messages=messages
    )
    texts = [b.text for b in second.content if b.type == "text"]
    for text in texts:
        expect_no_markup(text, "final text block")
    if second.stop_reason == "tool_use":
        raise Inconclusive("the model called the tool again instead of answering")
    expect(second.stop_reason == "end_turn", f"final stop_reason {second.stop_reason!r}, expected end_turn")
    expect("".join(texts).strip(), "no text in the final answer")
    return f"{len(uses)} tool_use, then {sum(map(len, texts))} chars"


def check_anthropic_stream(ctx: SuiteContext) -> str:
    events = []
    with ctx.anthropic.messages.stream(
        model=ctx.model,
        max_tokens=ctx.max_tokens,
        tools=[_anthropic_tool()],
        tool_choice={"type": "any"},
        messages=user(WEATHER_PROMPT),
    ) as stream:
        events = [e for e in stream if e.type in _ANTHROPIC_WIRE_EVENTS]
    kinds = [e.type for e in events]
    expect(kinds and kinds[0] == "message_start", f"first event {kinds[:1]}")
    expect(kinds[-1] == "message_stop", f"last event {kinds[-1:]}")
    expect(
        kinds.count("message_delta") == 1 and kinds[-2] == "message_delta",
        "message_delta not just before stop",
    )
    open_blocks: dict[int, str] = {}
    started: list[str] = []  # block types in the order they started
    json_parts: dict[int, list[str]] = {}
    for event in events:
        if event.type == "content_block_start":
            # the SDK files a block's deltas under content[index]: indexes run 0, 1, 2, ...
            expect(event.index == len(started), f"block {event.index} started as block {len(started)}")
            expect(not open_blocks, f"block {event.index} started while {sorted(open_blocks)} open")
            open_blocks[event.index] = event.content_block.type
            started.append(event.content_block.type)
        elif event.type == "content_block_delta":
            expect(event.index in open_blocks, f"delta for block {event.index} before its start")
            if event.delta.type == "input_json_delta":
                json_parts.setdefault(event.index, []).append(event.delta.partial_json)
            elif event.delta.type == "text_delta":
                expect_no_markup(event.delta.text, "text delta")
        elif event.type == "content_block_stop":
            expect(open_blocks.pop(event.index, None) is not None, f"stop for unopened block {event.index}")
    expect(not open_blocks, f"blocks never stopped: {sorted(open_blocks)}")
    answered = [i for i, kind in enumerate(started) if kind not in _THINKING_BLOCKS]
    thought = [i for i, kind in enumerate(started) if kind in _THINKING_BLOCKS]
    expect(
        not answered or not thought or max(thought) < min(answered),
        f"a thinking block follows a text or tool_use block: {started}",
    )
    delta = events[-2]
    expect(delta.delta.stop_reason == "tool_use", f"stop_reason {delta.delta.stop_reason!r}")
    expect(json_parts, "no input_json_delta for the tool_use block")
    for index, parts in json_parts.items():
        validate_schema(json.loads("".join(parts) or "{}"), WEATHER_SCHEMA, f"block {index} input")
    return f"{len(events)} events"


_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
_ANTHROPIC_WIRE_EVENTS = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }
)
