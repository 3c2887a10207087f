"""Anthropic tool search: ``defer_loading`` tools and ``tool_reference`` blocks, converted and rendered.

A deferred tool is nowhere in the prompt, the grammar or the parser until a ``tool_reference``
in a ``tool_result`` names it; from that result on its schema is in the prompt (inside the
result) and the model may call it. Earlier turns render byte for byte the same, so the prompt
of turn N is a prefix of the prompt of turn N+1 and the engine's prefix cache keeps hitting.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from deepseek_frontend.api.anthropic.convert import convert_messages_request
from deepseek_frontend.errors import RequestError
from deepseek_frontend.formats import join_segments
from deepseek_frontend.parsing.constraints import build_tool_call_constraint, ebnf_accepts
from deepseek_frontend.pipeline.chat import ChatRequest, PromptRenderer

SEARCH = {
    "name": "ToolSearch",
    "description": "Fetches full schema definitions for deferred tools.",
    "input_schema": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "defer_loading": True,
}
STOCKS = {
    "name": "get_stock_price",
    "description": "Last price of a ticker.",
    "input_schema": {"type": "object", "properties": {"ticker": {"type": "string"}}},
    "defer_loading": True,
}
TOOLS = [SEARCH, WEATHER, STOCKS]

WEATHER_JSON = json.dumps(
    {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": WEATHER["input_schema"],
    },
    ensure_ascii=False,
)

# (family, effort profile): every family the server renders
FAMILIES = [
    ("deepseek_v4", "preview"),
    ("deepseek_v4", "official"),
    ("deepseek_v41", "release"),
    ("deepseek_v32", ""),
]


def turn(n: int) -> list[dict[str, Any]]:
    """The first ``n`` messages of a tool-search conversation (1, 3 or 5 make a request)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in Paris? Use get_weather."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I need the weather tool.", "signature": "s"},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "ToolSearch",
                    "input": {"query": "select:get_weather"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "tool_reference", "tool_name": "get_weather"}],
                },
                {"type": "text", "text": "Tool loaded."},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Now call it.", "signature": "s"},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_2", "content": "Sunny, 21 C"}],
        },
    ]
    return messages[:n]


def convert(messages: list[dict[str, Any]], tools: list[dict[str, Any]] = TOOLS, **extra: Any) -> Any:
    return convert_messages_request(
        {"model": "m", "max_tokens": 64, "system": "Be brief.", "messages": messages, "tools": tools, **extra}
    )


def render(family: str, profile: str, converted: Any, *, thinking: bool) -> str:
    req = ChatRequest(
        messages=converted.messages,
        request_id="t",
        tools=converted.tools,
        tool_choice=converted.tool_choice or "auto",
        thinking=thinking,
    )
    return join_segments(PromptRenderer(family, profile or "preview").render(req))


def names(tools: Any) -> list[str]:
    return [t["function"]["name"] for t in tools or ()]


# --------------------------------------------------------------------------- conversion


def test_a_deferred_tool_is_available_only_once_a_tool_reference_names_it() -> None:
    assert names(convert(turn(1)).tools) == ["ToolSearch"]
    loaded = convert(turn(3))
    assert names(loaded.tools) == ["ToolSearch", "get_weather"]
    weather = loaded.tools[1]
    assert weather["defer_loading"] is True  # kept out of the system prompt
    tool_message = next(m for m in loaded.messages if m["role"] == "tool")
    assert tool_message == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": "",
        "tool_references": ["get_weather"],
    }


def test_text_beside_tool_references_stays_the_result_text() -> None:
    messages = turn(3)
    messages[2]["content"][0]["content"] = [
        {"type": "text", "text": "Found 1 tool."},
        {"type": "tool_reference", "tool_name": "get_weather"},
    ]
    tool_message = next(m for m in convert(messages).messages if m["role"] == "tool")
    assert tool_message["content"] == "Found 1 tool."
    assert tool_message["tool_references"] == ["get_weather"]


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        (
            lambda b: b["messages"][2]["content"][0]["content"][0].update(tool_name="nope"),
            "messages[2].content[0].content[0].tool_name",
        ),
        (
            lambda b: b["messages"][2]["content"][0]["content"][0].update(tool_name=7),
            "messages[2].content[0].content[0].tool_name",
        ),
        (lambda b: b["tools"][1].update(defer_loading="yes"), "tools[1].defer_loading"),
        (lambda b: b["tools"][0].update(defer_loading=True), "tools"),
        (lambda b: b.update(tool_choice={"type": "tool", "name": "get_stock_price"}), "tool_choice.name"),
    ],
)
def test_bad_tool_search_requests_name_the_field(patch: Any, param: str) -> None:
    body = {
        "model": "m",
        "max_tokens": 64,
        "messages": json.loads(json.dumps(turn(3))),
        "tools": json.loads(json.dumps(TOOLS)),
    }
    patch(body)
    with pytest.raises(RequestError) as err:
        convert_messages_request(body)
    assert err.value.param == param
    assert param in str(err.value)


def test_a_referenced_deferred_tool_may_be_the_named_tool_choice() -> None:
    converted = convert(turn(3), tool_choice={"type": "tool", "name": "get_weather"})
    assert converted.tool_choice == {"type": "function", "function": {"name": "get_weather"}}


# --------------------------------------------------------------------------- rendering


def test_the_referenced_schema_is_written_inside_the_tool_result_on_v4() -> None:
    prompt = render("deepseek_v4", "preview", convert(turn(3)), thinking=False)
    expected = (
        "<｜User｜><tool_result>### Available Tool Schemas\n\n"
        + WEATHER_JSON
        + "\n\nYou MUST strictly follow the above defined tool name and parameter schemas "
        "to invoke tool calls.</tool_result>\n\nTool loaded.<｜Assistant｜></think>"
    )
    assert prompt.endswith(expected)
    assert prompt.count('"name": "get_weather"') == 1  # not in the system prompt
    assert "get_stock_price" not in prompt  # never referenced: nowhere


def test_the_referenced_schema_uses_the_v32_function_list_inside_the_result() -> None:
    prompt = render("deepseek_v32", "", convert(turn(3)), thinking=False)
    assert (
        "<result>Here are the functions available in JSONSchema format:\n<functions>\n"
        + WEATHER_JSON
        + "\n</functions></result>"
    ) in prompt
    assert prompt.count('"name": "get_weather"') == 1 and "get_stock_price" not in prompt


# V3.2 in thinking mode drops earlier turns' reasoning once a later turn exists (the family's own
# rule, references or not), so its prompts are not prefixes of each other; every other case is.
PREFIX_CASES = [(f, p, t) for f, p in FAMILIES for t in (True, False) if not (f == "deepseek_v32" and t)]


@pytest.mark.parametrize(("family", "profile", "thinking"), PREFIX_CASES)
def test_each_turn_prompt_is_a_byte_prefix_of_the_next(family: str, profile: str, thinking: bool) -> None:
    prompts = [render(family, profile, convert(turn(n)), thinking=thinking) for n in (1, 3, 5)]
    assert prompts[1].startswith(prompts[0])  # the reference does not change the turns before it
    assert prompts[2].startswith(prompts[1])  # nor do later turns change the result that loaded it
    assert WEATHER_JSON not in prompts[0] and WEATHER_JSON in prompts[1]


@pytest.mark.parametrize(("family", "profile"), FAMILIES)
@pytest.mark.parametrize("thinking", [True, False])
def test_a_reference_changes_nothing_before_its_tool_result(
    family: str, profile: str, thinking: bool
) -> None:
    plain = json.loads(json.dumps(turn(5)))
    plain[2]["content"][0]["content"] = "no tools found"
    loaded = render(family, profile, convert(turn(5)), thinking=thinking)
    unloaded = render(family, profile, convert(plain, tools=[SEARCH, WEATHER, STOCKS]), thinking=thinking)
    opener = "<tool_result>" if family != "deepseek_v32" else "<result>"
    head = loaded[: loaded.index(opener) + len(opener)]
    assert unloaded.startswith(head)
    assert unloaded[len(head) :].startswith("no tools found")
    assert loaded[len(head) :].startswith(
        "Here are the functions" if family == "deepseek_v32" else "### Available"
    )


@pytest.mark.parametrize(("family", "profile"), FAMILIES)
def test_unreferenced_deferred_tools_do_not_change_the_prompt(family: str, profile: str) -> None:
    with_all = render(family, profile, convert(turn(3)), thinking=True)
    only_loaded = render(family, profile, convert(turn(3), tools=[SEARCH, WEATHER]), thinking=True)
    assert with_all == only_loaded


def test_a_reference_without_tools_in_the_prompt_renders_the_result_text_only() -> None:
    # tool_choice none: no tools in the prompt at all, so nothing is loaded either
    prompt = render("deepseek_v4", "preview", convert(turn(3), tool_choice={"type": "none"}), thinking=False)
    assert "get_weather" not in prompt.split("<｜User｜>", 2)[2]
    assert "<tool_result></tool_result>" in prompt


# --------------------------------------------------------------------------- constraints


def _call(name: str, args: dict[str, str]) -> str:
    params = "".join(
        f'<｜DSML｜parameter name="{k}" string="true">{v}</｜DSML｜parameter>\n' for k, v in args.items()
    )
    invoke = f'<｜DSML｜invoke name="{name}">\n{params}</｜DSML｜invoke>'
    return f"<｜DSML｜tool_calls>\n{invoke}\n</｜DSML｜tool_calls>"


def test_a_forced_tool_call_grammar_has_referenced_deferred_tools_and_no_others() -> None:
    before = build_tool_call_constraint("deepseek_v4", convert(turn(1)).tools, "required", thinking=False)
    after = build_tool_call_constraint("deepseek_v4", convert(turn(3)).tools, "required", thinking=False)
    weather = _call("get_weather", {"city": "Paris"})
    stocks = _call("get_stock_price", {"ticker": "ACME"})
    assert ebnf_accepts(after.value, weather)
    assert ebnf_accepts(after.value, _call("ToolSearch", {"query": "x"}))
    assert not ebnf_accepts(after.value, stocks)
    assert not ebnf_accepts(before.value, weather)
