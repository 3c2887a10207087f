"""Protocol checks of ``/v1/models`` and ``/v1/chat/completions`` through the ``openai`` client: response
and stream shape, usage, reasoning split and thinking switches, tool calls (required, auto, parallel,
argument types, special characters, no parameters, results, ``tool_choice`` none).

The requests a model-judgement check reuses are memoised on the :class:`~.context.SuiteContext`
(``plain_chat``, ``thinking_response``, ``auto_stream``, ``parallel_stream``, ``note_call``,
``tool_result_turn``).
"""

from __future__ import annotations

import json
from typing import Any

from deepseek_frontend.e2e.context import (
    EMPTY_SCHEMA,
    MEETING_SCHEMA,
    MEETING_TOOL,
    NOTE_TOOL,
    PARALLEL_PROMPT,
    SERVER_TIME_TOOL,
    SPECIAL_TEXT,
    THINKING_OFF,
    THINKING_ON,
    TOOL_RESULT,
    WEATHER_PROMPT,
    WEATHER_SCHEMA,
    WEATHER_TOOL,
    SuiteContext,
    user,
)
from deepseek_frontend.e2e.expectations import (
    StreamSummary,
    expect,
    expect_message_calls,
    expect_no_markup,
    expect_stream_envelope,
    expect_streamed_calls,
    expect_usage,
    reasoning_of,
    single_choice,
    summarize_stream,
)
from deepseek_frontend.e2e.runner import CheckFailed, Inconclusive


def check_models_list(ctx: SuiteContext) -> str:
    """The model is listed, or is a name the server answers to (a glob alias such as ``claude-*`` is
    answered but not listed): ``GET /v1/models/{id}`` resolves it under the name asked for."""
    import openai  # the e2e extra, as in every check

    ids = [m.id for m in ctx.openai.models.list()]
    if ctx.model in ids:
        return f"{len(ids)} model(s)"
    try:
        card = ctx.openai.models.retrieve(ctx.model)
    except openai.NotFoundError:
        raise CheckFailed(
            f"{ctx.model!r} not in /v1/models ({ids}) and GET /v1/models/{{id}} is 404"
        ) from None
    expect(card.id == ctx.model, f"GET /v1/models/{ctx.model} answered id {card.id!r}")
    return f"{len(ids)} model(s) listed; {ctx.model!r} is answered by GET /v1/models/{{id}}"


def plain_chat(ctx: SuiteContext) -> Any:
    return ctx.once(
        "plain_chat", lambda: ctx.chat(user("Reply with exactly: e2e-ok"), extra_body=THINKING_OFF)
    )


def check_plain_chat(ctx: SuiteContext) -> str:
    response = plain_chat(ctx)
    expect(response.object == "chat.completion", f"object {response.object!r}")
    expect(response.id, "empty id")
    choice = single_choice(response)
    expect(choice.message.role == "assistant", f"role {choice.message.role!r}")
    expect(isinstance(choice.message.content, str) and choice.message.content.strip(), "empty content")
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}, expected stop")
    expect(not choice.message.tool_calls, "tool calls without tools")
    expect_no_markup(choice.message.content, "content")
    expect_usage(response.usage, "usage")
    return f"{response.usage.completion_tokens} tokens"


def check_stream_shape(ctx: SuiteContext) -> str:
    chunks = ctx.chat_stream(user("Write 12 words about the sea."), extra_body=THINKING_OFF)
    expect_stream_envelope(chunks)
    summary = summarize_stream(chunks)
    expect(summary.content.strip(), "no content streamed")
    expect(summary.finish_reasons == ["stop"], f"finish_reason {summary.finish_reasons}")
    expect(not summary.reasoning, "reasoning_content streamed with thinking off")
    # the text as a client assembles it: markup split over two deltas is caught too
    expect_no_markup(summary.content, "streamed content")
    return f"{len(chunks)} chunks, content in {summary.content_deltas} delta(s)"


def check_stream_usage(ctx: SuiteContext) -> str:
    chunks = ctx.chat_stream(user("Write 5 words about rivers."), extra_body=THINKING_OFF)
    summary = summarize_stream(chunks)
    expect(
        summary.usage_chunks == [len(chunks) - 1],
        f"usage on chunks {summary.usage_chunks}, expected only the last",
    )
    last = chunks[-1]
    expect(last.choices == [], "the usage chunk has choices (include_usage sends it with choices: [])")
    expect_usage(last.usage, "stream usage")
    return f"{last.usage.prompt_tokens}+{last.usage.completion_tokens} tokens"


def thinking_response(ctx: SuiteContext) -> Any:
    prompt = "What is 17 + 25? Think it through, then answer with just the number."
    return ctx.once("thinking", lambda: ctx.chat(user(prompt), extra_body=THINKING_ON))


def check_reasoning_split(ctx: SuiteContext) -> str:
    choice = single_choice(thinking_response(ctx))
    reasoning = reasoning_of(choice.message)
    expect_no_markup(choice.message.content, "content")
    expect_no_markup(reasoning, "reasoning_content")
    if not reasoning:
        raise Inconclusive("the model produced no reasoning in thinking mode")
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r} (raise --max-tokens?)")
    expect(choice.message.content and choice.message.content.strip(), "no answer after the reasoning")
    return f"{len(reasoning)} reasoning chars"


def check_reasoning_split_stream(ctx: SuiteContext) -> str:
    chunks = ctx.chat_stream(user("Is 91 a prime number? Answer yes or no."), extra_body=THINKING_ON)
    expect_stream_envelope(chunks)
    summary = summarize_stream(chunks)
    expect_no_markup(summary.content, "streamed content")
    expect_no_markup(summary.reasoning, "streamed reasoning_content")
    if not summary.reasoning:
        raise Inconclusive("the model produced no reasoning in thinking mode")
    expect(not summary.reasoning_after_content, "reasoning arrived in a delta after one with content")
    expect(summary.content.strip(), "no content after the reasoning")
    expect(
        summary.finish_reasons == ["stop"], f"finish_reason {summary.finish_reasons} (raise --max-tokens?)"
    )
    return f"{len(summary.reasoning)} reasoning chars, then {len(summary.content)} content chars"


def check_thinking_off(ctx: SuiteContext) -> str:
    spellings = {
        "thinking.type=disabled": THINKING_OFF,
        "chat_template_kwargs.thinking=false": {"chat_template_kwargs": {"thinking": False}},
    }
    for label, extra in spellings.items():
        response = (
            plain_chat(ctx)
            if extra is THINKING_OFF
            else ctx.chat(user("Reply with exactly: e2e-ok"), extra_body=extra)
        )
        choice = single_choice(response)
        expect(not reasoning_of(choice.message), f"{label}: reasoning_content present with thinking off")
        expect(choice.message.content and choice.message.content.strip(), f"{label}: empty content")
        expect_no_markup(choice.message.content, f"{label}: content")
    return "both spellings"


def required_call(ctx: SuiteContext) -> Any:
    return ctx.once(
        "required",
        lambda: ctx.chat(user(WEATHER_PROMPT), tools=[WEATHER_TOOL], tool_choice="required"),
    )


def check_tool_required(ctx: SuiteContext) -> str:
    choice = single_choice(required_call(ctx))
    calls = expect_message_calls(choice, WEATHER_SCHEMA, "get_weather")
    return f"{len(calls)} call(s): " + json.dumps(calls[0], ensure_ascii=False)


def weather_stream(ctx: SuiteContext, key: str, prompt: str) -> StreamSummary:
    """The streamed answer to ``prompt`` with get_weather offered (``tool_choice`` auto), once per ``key``."""
    return ctx.once(
        key,
        lambda: summarize_stream(ctx.chat_stream(user(prompt), tools=[WEATHER_TOOL], tool_choice="auto")),
    )


def auto_stream(ctx: SuiteContext) -> StreamSummary:
    return weather_stream(ctx, "auto_stream", WEATHER_PROMPT)


def check_tool_auto_stream(ctx: SuiteContext) -> str:
    summary = auto_stream(ctx)
    expect_stream_envelope(summary.chunks)
    expect_no_markup(summary.content, "content")
    if not summary.calls:
        raise Inconclusive("the model answered in text instead of calling get_weather")
    expect_streamed_calls(summary, WEATHER_SCHEMA, "get_weather")
    return f"arguments in {len(summary.calls[0].argument_deltas)} delta(s)"


def parallel_stream(ctx: SuiteContext) -> StreamSummary:
    return weather_stream(ctx, "parallel", PARALLEL_PROMPT)


def check_parallel_calls(ctx: SuiteContext) -> str:
    summary = parallel_stream(ctx)
    expect_stream_envelope(summary.chunks)
    if len(summary.calls) < 2:
        raise Inconclusive(f"the model made {len(summary.calls)} call(s), not parallel ones")
    args = expect_streamed_calls(summary, WEATHER_SCHEMA, "get_weather")
    return ", ".join(a["city"] for a in args)


def check_tool_argument_types(ctx: SuiteContext) -> str:
    prompt = (
        "Schedule a recurring 45 minute meeting with alice@example.com and bob@example.com in room Orion "
        "on floor 3. Use the schedule_meeting tool."
    )
    choice = single_choice(ctx.chat(user(prompt), tools=[MEETING_TOOL], tool_choice="required"))
    args = expect_message_calls(choice, MEETING_SCHEMA, "schedule_meeting")[0]
    expect(
        type(args["duration_minutes"]) is int,
        f"duration_minutes is {type(args['duration_minutes']).__name__}",
    )
    expect(type(args["recurring"]) is bool, f"recurring is {type(args['recurring']).__name__}")
    expect(type(args["location"]["floor"]) is int, "location.floor is not an integer")
    return json.dumps(args, ensure_ascii=False)


def note_call(ctx: SuiteContext) -> Any:
    quoted = json.dumps(SPECIAL_TEXT, ensure_ascii=False)
    prompt = f"Save a note with exactly this text (use the save_note tool): {quoted}"
    return ctx.once("note", lambda: ctx.chat(user(prompt), tools=[NOTE_TOOL], tool_choice="required"))


def check_special_characters(ctx: SuiteContext) -> str:
    choice = single_choice(note_call(ctx))
    calls = choice.message.tool_calls or []
    expect(calls, f"no tool call (finish_reason {choice.finish_reason})")
    raw = calls[0].function.arguments
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"arguments are not JSON ({exc}): {raw!r}") from exc
    expect(
        isinstance(args, dict) and isinstance(args.get("text"), str), f"no string 'text' argument: {raw!r}"
    )
    expect_no_markup(args["text"], "text argument")
    return f"{len(args['text'])} chars"


def check_tool_without_parameters(ctx: SuiteContext) -> str:
    prompt = "What time is it on the server? Use the get_server_time tool."
    choice = single_choice(ctx.chat(user(prompt), tools=[SERVER_TIME_TOOL], tool_choice="required"))
    args = expect_message_calls(choice, EMPTY_SCHEMA, "get_server_time")[0]
    expect(args == {}, f"arguments {args}, expected {{}}")
    return "{}"


def tool_result_turn(ctx: SuiteContext) -> Any:
    messages = [
        *user(WEATHER_PROMPT),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_e2e_weather_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_e2e_weather_1", "content": TOOL_RESULT},
    ]
    return ctx.once("tool_result", lambda: ctx.chat(messages, tools=[WEATHER_TOOL]))


def check_tool_result_round_trip(ctx: SuiteContext) -> str:
    choice = single_choice(tool_result_turn(ctx))
    expect_no_markup(choice.message.content, "content")
    if choice.message.tool_calls:
        raise Inconclusive("the model called a tool again instead of answering")
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}")
    expect(choice.message.content and choice.message.content.strip(), "empty final answer")
    return f"{len(choice.message.content)} chars"


def check_tool_choice_none(ctx: SuiteContext) -> str:
    choice = single_choice(ctx.chat(user(WEATHER_PROMPT), tools=[WEATHER_TOOL], tool_choice="none"))
    expect(not choice.message.tool_calls, "tool_calls returned with tool_choice none")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    expect(choice.message.content and choice.message.content.strip(), "empty content")
    expect_no_markup(choice.message.content, "content")
    expect("invoke name=" not in choice.message.content, "DSML invoke text in content")
    return f"{len(choice.message.content)} chars"
