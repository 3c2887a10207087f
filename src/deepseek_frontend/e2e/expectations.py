"""The assertions conformance checks are made of: each fails its check with :class:`~.runner.CheckFailed`
and a message saying what came back -- markup leaks, tool-call arguments against their schema, usage
figures, the streamed chat-completion envelope -- plus the reassembly of a streamed chat completion
(:func:`summarize_stream`) those assertions read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from deepseek_frontend.e2e.runner import CheckFailed

#: Text that must never reach a client: DeepSeek special-token spellings, think tags, DSML markup.
MARKUP = ("<｜", "｜>", "｜DSML｜", "<think>", "</think>", "end▁of▁sentence")


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def expect_no_markup(text: str | None, where: str) -> None:
    for marker in MARKUP:
        expect(marker not in (text or ""), f"{where} contains {marker!r}: {(text or '')[:80]!r}")


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
    #: an id or a name arrived after argument text had (a client cannot file the arguments it holds)
    named_late: bool = False

    @property
    def arguments(self) -> str:
        return "".join(self.argument_deltas)


@dataclass
class StreamSummary:
    """A streamed chat completion reassembled, plus the ordering facts the checks assert on.

    How many deltas a text took is not one of them: a server may merge engine output that is
    already waiting into one delta (and a fast engine makes that the rule), and a client's
    reassembly does not depend on it. ``content_deltas`` is kept for the checks' detail text.
    """

    chunks: list[Any]
    content: str
    reasoning: str
    content_deltas: int
    #: reasoning arrived in a delta after one that carried content. A delta carrying both is in
    #: order: its ``reasoning_content`` is read before its ``content`` (the reasoning ended inside
    #: that delta), as every client that renders both does.
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
            if text := reasoning_of(delta):
                reasoning.append(text)
                reasoning_after_content |= bool(content)  # content of an earlier delta
            if delta.content:
                content.append(delta.content)
            for tc in delta.tool_calls or []:
                call = calls.setdefault(tc.index, StreamedCall(tc.index))
                if tc.id:
                    call.ids.append(tc.id)
                    call.named_late |= bool(call.argument_deltas)
                if tc.function is not None:
                    if tc.function.name:
                        call.names.append(tc.function.name)
                        call.named_late |= bool(call.argument_deltas)
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
    """Streamed tool calls assemble: indexes 0..n-1, one id and one name each (sent once, before any
    argument text), unique ids, argument deltas -- however many -- that concatenate to schema-valid
    JSON without markup; finish ``tool_calls``."""
    calls = [summary.calls[i] for i in sorted(summary.calls)]
    expect([c.index for c in calls] == list(range(len(calls))), f"tool call indexes {sorted(summary.calls)}")
    parsed = []
    for call in calls:
        where = f"call {call.index}"
        expect(len(call.ids) == 1, f"{where}: id sent {len(call.ids)} times")
        expect(call.names == [name], f"{where}: names {call.names}, expected [{name!r}] once")
        expect(not call.named_late, f"{where}: its id or name arrived after argument text")
        parsed.append(parse_arguments(call.arguments, schema, where))
        expect_no_markup(call.arguments, f"{where} arguments")
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


def expect_usage_anthropic(usage: Any) -> None:
    expect(usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0, f"usage {usage}")
