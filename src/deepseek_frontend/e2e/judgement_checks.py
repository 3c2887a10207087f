"""Model-judgement checks: what a good model does with the protocol checks' responses (reused through the
:class:`~.context.SuiteContext` memo, one request per scenario) -- follows an exact instruction, adds,
calls and picks the right tool, copies special text verbatim, uses a tool result, names an image's colour.
"""

from __future__ import annotations

import json

from deepseek_frontend.e2e.chat_checks import (
    auto_stream,
    note_call,
    parallel_stream,
    plain_chat,
    thinking_response,
    tool_result_turn,
)
from deepseek_frontend.e2e.context import SPECIAL_TEXT, TIME_TOOL, WEATHER_TOOL, SuiteContext, user
from deepseek_frontend.e2e.expectations import expect, single_choice
from deepseek_frontend.e2e.image_checks import image_chat


def judge_instruction_following(ctx: SuiteContext) -> str:
    content = (single_choice(plain_chat(ctx)).message.content or "").strip()
    expect(content == "e2e-ok", f"asked to reply exactly 'e2e-ok', got {content[:60]!r}")
    return "exact reply"


def judge_arithmetic(ctx: SuiteContext) -> str:
    content = single_choice(thinking_response(ctx)).message.content or ""
    expect("42" in content, f"17 + 25 answered as {content.strip()[:60]!r}")
    return "42"


def judge_auto_tool_call(ctx: SuiteContext) -> str:
    summary = auto_stream(ctx)
    names = [n for c in summary.calls.values() for n in c.names]
    expect(names == ["get_weather"], f"asked to use get_weather, called {names or 'nothing'}")
    return "called get_weather"


def judge_parallel_calls(ctx: SuiteContext) -> str:
    summary = parallel_stream(ctx)
    cities: list[str] = []
    for call in summary.calls.values():
        try:
            cities.append(str(json.loads(call.arguments).get("city", "")))
        except (json.JSONDecodeError, AttributeError):
            cities.append("?")
    expect(len(cities) >= 2, f"asked for two parallel calls, got {len(cities)}")
    joined = " ".join(cities).lower()
    expect("paris" in joined and "tokyo" in joined, f"cities {cities}, expected Paris and Tokyo")
    return ", ".join(cities)


def judge_tool_selection(ctx: SuiteContext) -> str:
    prompt = "What's the weather like in Paris? I'm packing for a trip."
    choice = single_choice(ctx.chat(user(prompt), tools=[TIME_TOOL, WEATHER_TOOL], tool_choice="auto"))
    names = [c.function.name for c in choice.message.tool_calls or []]
    expect(names == ["get_weather"], f"expected one get_weather call, got {names or 'none'}")
    return "picked get_weather over get_time"


def judge_special_characters_exact(ctx: SuiteContext) -> str:
    calls = single_choice(note_call(ctx)).message.tool_calls or []
    expect(calls, "no tool call")
    text = json.loads(calls[0].function.arguments).get("text")
    expect(text == SPECIAL_TEXT, f"text differs from the requested one: {text!r}")
    return "verbatim"


def judge_tool_result_used(ctx: SuiteContext) -> str:
    content = single_choice(tool_result_turn(ctx)).message.content or ""
    expect(
        "18" in content or "ZX-41" in content, f"the answer does not use the tool result: {content[:80]!r}"
    )
    return "quoted the result"


def judge_image_colour(ctx: SuiteContext) -> str:
    content = (single_choice(image_chat(ctx)).message.content or "").lower()
    expect("red" in content, f"asked the colour of a red image, answered {content[:80]!r}")
    return "red"
