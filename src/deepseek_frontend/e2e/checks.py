"""The conformance checks: what any OpenAI/Anthropic-compatible DeepSeek endpoint must get right.

Every check sends real requests through the official ``openai`` and ``anthropic`` client libraries (what
users run), then asserts on what came back. Prompts are phrased so that a real DeepSeek model *and* this
project's simulated engine (``deepseek_frontend.engines.sim.model``: it calls a tool when the last user turn
names it, one call per capitalised place name when asked for "parallel"/"both" calls, and quotes a tool
result when one follows the last user turn) take the path the check needs.

Protocol checks assert wire contracts (see ``runner``); model-judgement checks reuse the same responses (one
request per scenario, memoised in :class:`SuiteContext`) and assert what a good model would do with them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from deepseek_frontend.e2e.runner import Check, CheckFailed, Inconclusive, Skipped

#: Text that must never reach a client: DeepSeek special-token spellings, think tags, DSML markup.
MARKUP = ("<｜", "｜>", "｜DSML｜", "<think>", "</think>", "end▁of▁sentence")

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name, for example Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
TIME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "description": "IANA time zone, for example Europe/Paris"}},
    "required": ["timezone"],
}
MEETING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "attendees": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "duration_minutes": {"type": "integer", "minimum": 15, "maximum": 240},
        "recurring": {"type": "boolean"},
        "location": {
            "type": "object",
            "properties": {"room": {"type": "string"}, "floor": {"type": "integer"}},
            "required": ["room", "floor"],
        },
    },
    "required": ["attendees", "duration_minutes", "recurring", "location"],
}
#: Quotes, backslash, tab, newline, HTML, non-Latin scripts, emoji and U+2028: everything JSON must escape
#: or carry verbatim.
SPECIAL_TEXT = 'Say "hi" \\ to <b>Zoë</b> & 東京 😀\tnow\nthen | done\u2028.'
NOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "enum": [SPECIAL_TEXT]}},
    "required": ["text"],
}
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
TOOL_RESULT = "Paris: 18 degrees Celsius, light rain. Report code ZX-41."


def openai_tool(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


WEATHER_TOOL = openai_tool("get_weather", "Get the current weather for a city.", WEATHER_SCHEMA)
TIME_TOOL = openai_tool("get_time", "Get the current local time in a time zone.", TIME_SCHEMA)
MEETING_TOOL = openai_tool("schedule_meeting", "Put a meeting in the calendar.", MEETING_SCHEMA)
NOTE_TOOL = openai_tool("save_note", "Save a note with the exact text given.", NOTE_SCHEMA)
SERVER_TIME_TOOL = openai_tool(
    "get_server_time", "Return the server's clock; takes no arguments.", EMPTY_SCHEMA
)

WEATHER_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
PARALLEL_PROMPT = "Get the weather in Paris and in Tokyo. Call get_weather for both cities in parallel."
THINKING_OFF: dict[str, Any] = {"thinking": {"type": "disabled"}}
THINKING_ON: dict[str, Any] = {"thinking": {"type": "enabled"}}


@dataclass
class SuiteContext:
    """What every check gets: the two clients, the model name, limits, and a per-run response memo."""

    openai: Any  #: openai.OpenAI
    anthropic: Any  #: anthropic.Anthropic
    model: str
    max_tokens: int = 4096
    _memo: dict[str, Any] = field(default_factory=dict)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` the first time ``key`` is asked for, the same value afterwards (an exception is
        remembered and re-raised too, so a judgement check reports the failed request it depends on)."""
        if key not in self._memo:
            try:
                self._memo[key] = (True, make())
            except Exception as exc:
                self._memo[key] = (False, exc)
        ok, value = self._memo[key]
        if not ok:
            raise value
        return value

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        """A non-streaming chat completion (``extra_body`` carries DeepSeek fields such as ``thinking``)."""
        return self.openai.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_tokens, **kwargs
        )

    def chat_stream(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
        """All chunks of a streamed chat completion, with usage requested."""
        stream = self.openai.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=self.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
        return list(stream)


# --------------------------------------------------------------------------------------------------------
# assertion helpers


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def expect_no_markup(text: str | None, where: str) -> None:
    for marker in MARKUP:
        expect(marker not in (text or ""), f"{where} contains {marker!r}: {(text or '')[:80]!r}")


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def reasoning_of(obj: Any) -> str | None:
    """``reasoning_content`` of a message or delta (an extra field; the openai client keeps it as an
    attribute)."""
    value = getattr(obj, "reasoning_content", None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get("reasoning_content")
    return value


def parse_arguments(arguments: str | None, schema: dict[str, Any], where: str) -> dict[str, Any]:
    """Tool-call arguments as a dict, valid against ``schema``; fails the check otherwise."""
    try:
        value = json.loads(arguments or "")
    except json.JSONDecodeError as exc:
        raise CheckFailed(f"{where}: arguments are not JSON ({exc}): {arguments!r}") from exc
    expect(isinstance(value, dict), f"{where}: arguments are not a JSON object: {arguments!r}")
    validate_schema(value, schema, where)
    return value


def validate_schema(value: Any, schema: dict[str, Any], where: str) -> None:
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(value), key=lambda e: list(e.path))
    expect(not errors, f"{where}: arguments break the schema: {errors[0].message if errors else ''}")


def single_choice(response: Any) -> Any:
    expect(len(response.choices) == 1, f"expected 1 choice, got {len(response.choices)}")
    return response.choices[0]


def expect_usage(usage: Any, where: str) -> None:
    expect(usage is not None, f"{where}: no usage")
    expect(usage.prompt_tokens > 0, f"{where}: prompt_tokens = {usage.prompt_tokens}")
    expect(usage.completion_tokens > 0, f"{where}: completion_tokens = {usage.completion_tokens}")
    expect(
        usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
        f"{where}: total_tokens {usage.total_tokens} != {usage.prompt_tokens} + {usage.completion_tokens}",
    )


@dataclass
class StreamedCall:
    index: int
    ids: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    argument_deltas: list[str] = field(default_factory=list)

    @property
    def arguments(self) -> str:
        return "".join(self.argument_deltas)


@dataclass
class StreamSummary:
    """A streamed chat completion reassembled, plus the shape facts the checks assert on."""

    chunks: list[Any]
    content: str
    reasoning: str
    content_deltas: int
    reasoning_after_content: bool
    finish_reasons: list[str]
    calls: dict[int, StreamedCall]
    usage_chunks: list[int]  #: positions of chunks that carry usage


def summarize_stream(chunks: list[Any]) -> StreamSummary:
    content: list[str] = []
    reasoning: list[str] = []
    reasoning_after_content = False
    finish: list[str] = []
    calls: dict[int, StreamedCall] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                content.append(delta.content)
            if text := reasoning_of(delta):
                reasoning.append(text)
                reasoning_after_content |= bool(content)
            for tc in delta.tool_calls or []:
                call = calls.setdefault(tc.index, StreamedCall(tc.index))
                if tc.id:
                    call.ids.append(tc.id)
                if tc.function is not None:
                    if tc.function.name:
                        call.names.append(tc.function.name)
                    if tc.function.arguments:
                        call.argument_deltas.append(tc.function.arguments)
            if choice.finish_reason:
                finish.append(choice.finish_reason)
    return StreamSummary(
        chunks=chunks,
        content="".join(content),
        reasoning="".join(reasoning),
        content_deltas=len(content),
        reasoning_after_content=reasoning_after_content,
        finish_reasons=finish,
        calls=calls,
        usage_chunks=[i for i, c in enumerate(chunks) if getattr(c, "usage", None) is not None],
    )


def expect_stream_envelope(chunks: list[Any]) -> None:
    """Every chunk is a ``chat.completion.chunk`` of one id, the first delta carries the assistant role, and
    exactly one finish reason arrives, on the last chunk that has choices."""
    expect(chunks, "the stream had no chunks")
    ids = {c.id for c in chunks}
    expect(len(ids) == 1 and all(ids), f"chunk ids differ or are empty: {sorted(ids)[:3]}")
    expect(
        all(c.object == "chat.completion.chunk" for c in chunks),
        "a chunk's object is not chat.completion.chunk",
    )
    expect(all(isinstance(c.created, int) and c.model for c in chunks), "a chunk lacks created or model")
    with_choices = [c for c in chunks if c.choices]
    expect(with_choices, "no chunk carried choices")
    expect(
        with_choices[0].choices[0].delta.role == "assistant", "the first delta does not carry role=assistant"
    )
    expect(all(ch.index == 0 for c in with_choices for ch in c.choices), "a choice index is not 0")
    finishing = [i for i, c in enumerate(with_choices) if c.choices[0].finish_reason]
    expect(len(finishing) == 1, f"{len(finishing)} chunks carry a finish_reason (expected exactly 1)")
    expect(finishing[0] == len(with_choices) - 1, "deltas arrived after the finish_reason")


def expect_streamed_calls(summary: StreamSummary, schema: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Streamed tool calls are well-formed: indexes 0..n-1, one id and one name each (sent once, before
    the arguments), unique ids, arguments that concatenate to schema-valid JSON; finish ``tool_calls``."""
    calls = [summary.calls[i] for i in sorted(summary.calls)]
    expect([c.index for c in calls] == list(range(len(calls))), f"tool call indexes {sorted(summary.calls)}")
    parsed = []
    for call in calls:
        where = f"call {call.index}"
        expect(len(call.ids) == 1, f"{where}: id sent {len(call.ids)} times")
        expect(call.names == [name], f"{where}: names {call.names}, expected [{name!r}] once")
        parsed.append(parse_arguments(call.arguments, schema, where))
        for delta in call.argument_deltas:
            expect_no_markup(delta, f"{where} argument delta")
    ids = [c.ids[0] for c in calls]
    expect(len(set(ids)) == len(ids), f"tool call ids repeat: {ids}")
    expect(
        summary.finish_reasons == ["tool_calls"],
        f"finish_reason {summary.finish_reasons}, expected tool_calls",
    )
    return parsed


def expect_message_calls(choice: Any, schema: dict[str, Any], name: str) -> list[dict[str, Any]]:
    calls = choice.message.tool_calls or []
    expect(
        calls, f"no tool call (finish_reason {choice.finish_reason}, content {choice.message.content!r:.60})"
    )
    expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}, expected tool_calls")
    ids = [c.id for c in calls]
    expect(all(ids) and len(set(ids)) == len(ids), f"tool call ids missing or repeated: {ids}")
    out = []
    for i, call in enumerate(calls):
        expect(call.type == "function", f"call {i}: type {call.type!r}")
        expect(call.function.name == name, f"call {i}: name {call.function.name!r}, expected {name!r}")
        out.append(parse_arguments(call.function.arguments, schema, f"call {i}"))
    expect_no_markup(choice.message.content, "content")
    return out


# --------------------------------------------------------------------------------------------------------
# protocol checks


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
    expect(summary.content_deltas >= 2, f"content arrived in {summary.content_deltas} delta(s), not streamed")
    expect(summary.finish_reasons == ["stop"], f"finish_reason {summary.finish_reasons}")
    for chunk in chunks:
        for choice in chunk.choices:
            expect_no_markup(choice.delta.content, "content delta")
    return f"{len(chunks)} chunks"


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
    for chunk in chunks:
        for choice in chunk.choices:
            expect_no_markup(choice.delta.content, "content delta")
            expect_no_markup(reasoning_of(choice.delta), "reasoning delta")
    if not summary.reasoning:
        raise Inconclusive("the model produced no reasoning in thinking mode")
    expect(not summary.reasoning_after_content, "reasoning deltas arrived after content had started")
    expect(summary.content.strip(), "no content after the reasoning")
    return f"{len(summary.reasoning)} reasoning chars"


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
    deltas = len(summary.calls[0].argument_deltas)
    expect(deltas >= 2, f"arguments arrived in {deltas} delta(s), not incrementally")
    return f"{deltas} argument deltas"


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


# --------------------------------------------------------------------------------------------------------
# images and DeepSeek-V4.1 (skipped, with the server's reason, when the model reads no images)

#: Every image costs the model at least this many tokens (a 13 x 13 grid of 42 px cells, an upscaled small
#: image: rows * (columns + 1) + 2); a prompt that counts an image as one placeholder token under-reports.
MIN_IMAGE_TOKENS = 184
IMAGE_PROMPT = "What is the main colour of this image? Answer with one word."
#: What a server says when its model reads text only (this frontend, and wording common elsewhere).
_NO_IMAGE_WORDS = ("image", "text only", "text-only", "vision", "multimodal")


def solid_image(colour: tuple[int, int, int] = (220, 20, 20), size: tuple[int, int] = (96, 64)) -> bytes:
    """A small solid-colour PNG (red by default): any vision model names its colour."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, "PNG")
    return out.getvalue()


def image_data_url() -> str:
    import base64

    return "data:image/png;base64," + base64.b64encode(solid_image()).decode("ascii")


def _image_messages(text: str = IMAGE_PROMPT) -> list[dict[str, Any]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": image_data_url()}},
            ],
        }
    ]


def image_chat(ctx: SuiteContext) -> Any:
    """The chat answer to a small red image (memoised); raises ``Skipped`` when the model reads no images."""

    def make() -> Any:
        import openai

        try:
            return ctx.chat(_image_messages(), extra_body=THINKING_OFF)
        except openai.BadRequestError as exc:
            message = str(exc)
            if any(word in message.lower() for word in _NO_IMAGE_WORDS):
                raise Skipped(f"the model reads no images: {message[:160]}") from exc
            raise

    return ctx.once("image_chat", make)


def check_image_chat(ctx: SuiteContext) -> str:
    response = image_chat(ctx)
    choice = single_choice(response)
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}, expected stop")
    expect(isinstance(choice.message.content, str) and choice.message.content.strip(), "empty content")
    expect_no_markup(choice.message.content, "content")
    expect_usage(response.usage, "usage")
    text_only = ctx.chat(user(IMAGE_PROMPT), extra_body=THINKING_OFF)
    added = response.usage.prompt_tokens - text_only.usage.prompt_tokens
    expect(
        added >= MIN_IMAGE_TOKENS - 1,
        f"the image added {added} prompt tokens; an image is at least {MIN_IMAGE_TOKENS} tokens to the model",
    )
    return f"image = {added} prompt tokens"


def check_anthropic_image(ctx: SuiteContext) -> str:
    import base64

    image_chat(ctx)  # skips this check too when the model reads no images
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(solid_image()).decode()}
    message = ctx.anthropic.messages.create(
        model=ctx.model,
        max_tokens=ctx.max_tokens,
        thinking={"type": "disabled"},
        messages=[
            {
                "role": "user",
                "content": [{"type": "image", "source": source}, {"type": "text", "text": IMAGE_PROMPT}],
            }
        ],
    )
    expect(message.stop_reason == "end_turn", f"stop_reason {message.stop_reason!r}, expected end_turn")
    texts = [b.text for b in message.content if b.type == "text"]
    expect("".join(texts).strip(), "no text block")
    for text in texts:
        expect_no_markup(text, "text block")
    expect(
        message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) >= MIN_IMAGE_TOKENS,
        f"input_tokens {message.usage.input_tokens} do not count the image",
    )
    return f"{sum(map(len, texts))} chars"


def check_image_token_text(ctx: SuiteContext) -> str:
    """A literal image token typed by a user is text: no error (clients resend failing turns), no image."""
    response = ctx.chat(user("Reply with exactly: <｜deepseek_image｜> ok"), extra_body=THINKING_OFF)
    choice = single_choice(response)
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}")
    expect(
        response.usage.prompt_tokens < MIN_IMAGE_TOKENS,
        f"prompt_tokens {response.usage.prompt_tokens}: the typed token was taken for an image",
    )
    return f"{response.usage.prompt_tokens} prompt tokens"


def check_v41_numeric_effort(ctx: SuiteContext) -> str:
    """DeepSeek-V4.1 (the image-reading family) takes a numeric reasoning budget 1-100."""
    try:
        image_chat(ctx)
    except Skipped as exc:
        raise Skipped(f"not DeepSeek-V4.1 ({exc})") from None
    response = ctx.chat(
        user("Reply with exactly: effort-ok"), extra_body={**THINKING_ON, "reasoning_effort": 42}
    )
    choice = single_choice(response)
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason!r}")
    expect(reasoning_of(choice.message), "thinking on with a budget: no reasoning_content")
    expect_no_markup(choice.message.content, "content")
    return "budget 42 accepted"


def judge_image_colour(ctx: SuiteContext) -> str:
    content = (single_choice(image_chat(ctx)).message.content or "").lower()
    expect("red" in content, f"asked the colour of a red image, answered {content[:80]!r}")
    return "red"


def expect_usage_anthropic(usage: Any) -> None:
    expect(usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0, f"usage {usage}")


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
    json_parts: dict[int, list[str]] = {}
    for event in events:
        if event.type == "content_block_start":
            expect(event.index not in open_blocks, f"block {event.index} started twice")
            open_blocks[event.index] = event.content_block.type
        elif event.type == "content_block_delta":
            expect(event.index in open_blocks, f"delta for block {event.index} before its start")
            if event.delta.type == "input_json_delta":
                json_parts.setdefault(event.index, []).append(event.delta.partial_json)
            elif event.delta.type == "text_delta":
                expect_no_markup(event.delta.text, "text delta")
        elif event.type == "content_block_stop":
            expect(open_blocks.pop(event.index, None) is not None, f"stop for unopened block {event.index}")
    expect(not open_blocks, f"blocks never stopped: {sorted(open_blocks)}")
    delta = events[-2]
    expect(delta.delta.stop_reason == "tool_use", f"stop_reason {delta.delta.stop_reason!r}")
    expect(json_parts, "no input_json_delta for the tool_use block")
    for index, parts in json_parts.items():
        validate_schema(json.loads("".join(parts) or "{}"), WEATHER_SCHEMA, f"block {index} input")
    return f"{len(events)} events"


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


# --------------------------------------------------------------------------------------------------------
# model-judgement checks (reuse the protocol checks' responses where they can)


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


def all_checks() -> list[Check]:
    """Every check in run order (protocol first, then judgement ones that reuse their responses)."""
    protocol: Iterable[tuple[str, str, Callable[[SuiteContext], str]]] = [
        ("models_list", "GET /v1/models lists the model", check_models_list),
        ("plain_chat", "non-streaming chat: shape, finish stop, usage, no markup", check_plain_chat),
        (
            "stream_chunk_shape",
            "streamed chat: one id, role first, one finish, content in deltas",
            check_stream_shape,
        ),
        (
            "stream_usage",
            "stream_options.include_usage: usage only on a final choices-less chunk",
            check_stream_usage,
        ),
        (
            "reasoning_split",
            "thinking on: reasoning_content and content split, no think tags",
            check_reasoning_split,
        ),
        (
            "reasoning_split_stream",
            "thinking on, streamed: reasoning deltas precede content",
            check_reasoning_split_stream,
        ),
        ("thinking_off", "thinking off (two spellings): no reasoning, content only", check_thinking_off),
        ("tool_required", "tool_choice required: a call with schema-valid arguments", check_tool_required),
        (
            "tool_auto_stream",
            "tool_choice auto, streamed: incremental arguments, name once",
            check_tool_auto_stream,
        ),
        (
            "parallel_tool_calls",
            "several calls in one turn: indexes, unique ids, valid arguments",
            check_parallel_calls,
        ),
        (
            "tool_argument_types",
            "int, bool, array and object arguments keep their JSON types",
            check_tool_argument_types,
        ),
        (
            "special_characters",
            "quotes, backslashes, newlines, unicode in arguments stay valid JSON",
            check_special_characters,
        ),
        (
            "tool_without_parameters",
            "a tool with no parameters gets {} arguments",
            check_tool_without_parameters,
        ),
        (
            "tool_result_round_trip",
            "a tool result in the history is consumed into a text answer",
            check_tool_result_round_trip,
        ),
        ("tool_choice_none", "tool_choice none: text only, no calls, no DSML", check_tool_choice_none),
        (
            "anthropic_tool_round_trip",
            "/v1/messages: tool_use then tool_result -> end_turn",
            check_anthropic_tool_round_trip,
        ),
        (
            "anthropic_stream_events",
            "/v1/messages streamed: event order, input_json_delta is valid JSON",
            check_anthropic_stream,
        ),
        ("image_chat", "an image_url part reaches the model; usage counts its tokens", check_image_chat),
        ("anthropic_image", "/v1/messages: a base64 image block is answered", check_anthropic_image),
        (
            "image_token_as_text",
            "a typed <｜deepseek_image｜> is text: no error, no image",
            check_image_token_text,
        ),
        (
            "v41_numeric_effort",
            "DeepSeek-V4.1: reasoning_effort 42 (numeric budget) is accepted",
            check_v41_numeric_effort,
        ),
    ]
    judgement: Iterable[tuple[str, str, Callable[[SuiteContext], str]]] = [
        ("follows_exact_reply", "replies exactly as instructed", judge_instruction_following),
        ("answers_arithmetic", "17 + 25 = 42 after thinking", judge_arithmetic),
        ("calls_tool_when_asked", "auto mode: calls the tool the user asked for", judge_auto_tool_call),
        (
            "makes_parallel_calls",
            "asked for two cities in parallel: two calls, right cities",
            judge_parallel_calls,
        ),
        ("selects_the_right_tool", "two tools offered: picks the weather one", judge_tool_selection),
        (
            "copies_special_text_verbatim",
            "the special-character text arrives unchanged",
            judge_special_characters_exact,
        ),
        ("uses_tool_result", "the final answer uses the tool result", judge_tool_result_used),
        ("names_image_colour", "asked the colour of a red image: says red", judge_image_colour),
    ]
    return [Check(n, "protocol", d, f) for n, d, f in protocol] + [
        Check(n, "model-judgement", d, f) for n, d, f in judgement
    ]
