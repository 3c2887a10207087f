"""The suite's stream assertions test what a client depends on, not how many deltas a text took.

A frontend merges engine output that is already waiting into one delta (a fast engine, a prefill/decode
pair, a client that reads late), so one delta may carry a whole answer, all of a call's arguments, or the
end of the reasoning and the start of the content together. Those streams are correct; reasoning after
content, a call named after its arguments, markup split over two deltas or a missing finish are not.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.chat import ChatCompletionChunk

from deepseek_frontend.e2e.context import WEATHER_SCHEMA
from deepseek_frontend.e2e.expectations import expect_no_markup, expect_stream_envelope, expect_streamed_calls
from deepseek_frontend.e2e.expectations import summarize_stream as summarize
from deepseek_frontend.e2e.runner import CheckFailed


def chunk(delta: dict[str, Any], finish: str | None = None) -> ChatCompletionChunk:
    """A chunk as the openai client parses it (``reasoning_content`` lands in ``model_extra``)."""
    return ChatCompletionChunk.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def role() -> ChatCompletionChunk:
    return chunk({"role": "assistant", "content": ""})


def call_delta(
    *, id: str | None = None, name: str | None = None, arguments: str | None = None
) -> dict[str, Any]:
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    return {"tool_calls": [{"index": 0, "id": id, "type": "function" if id else None, "function": function}]}


def test_a_whole_answer_in_one_delta_is_a_complete_stream() -> None:
    chunks = [role(), chunk({"content": "The sea is wide and deep."}), chunk({}, "stop")]
    expect_stream_envelope(chunks)
    summary = summarize(chunks)
    assert summary.content == "The sea is wide and deep." and summary.finish_reasons == ["stop"]


def test_a_delta_that_ends_the_reasoning_and_starts_the_content_is_in_order() -> None:
    chunks = [
        role(),
        chunk({"reasoning_content": "91 = 7 x 13"}),
        chunk({"reasoning_content": ", so no.", "content": "No"}),
        chunk({"content": "."}, "stop"),
    ]
    summary = summarize(chunks)
    assert summary.reasoning == "91 = 7 x 13, so no." and summary.content == "No."
    assert not summary.reasoning_after_content


def test_reasoning_in_a_delta_after_content_is_out_of_order() -> None:
    chunks = [role(), chunk({"content": "No"}), chunk({"reasoning_content": "wait"}), chunk({}, "stop")]
    assert summarize(chunks).reasoning_after_content
    chunks = [role(), chunk({"content": "No"}), chunk({"reasoning_content": "wait", "content": "."})]
    assert summarize(chunks).reasoning_after_content


def test_a_call_whose_arguments_come_in_one_delta_assembles() -> None:
    chunks = [
        role(),
        chunk(call_delta(id="call_1", name="get_weather", arguments='{"city": "Paris"}')),
        chunk({}, "tool_calls"),
    ]
    assert expect_streamed_calls(summarize(chunks), WEATHER_SCHEMA, "get_weather") == [{"city": "Paris"}]


def test_a_call_named_after_its_arguments_started_fails() -> None:
    chunks = [
        role(),
        chunk(call_delta(id="call_1", arguments='{"city": ')),
        chunk(call_delta(name="get_weather", arguments='"Paris"}')),
        chunk({}, "tool_calls"),
    ]
    with pytest.raises(CheckFailed, match="after argument text"):
        expect_streamed_calls(summarize(chunks), WEATHER_SCHEMA, "get_weather")


def test_markup_split_over_two_deltas_is_caught_in_the_assembled_text() -> None:
    chunks = [role(), chunk({"content": "done <"}), chunk({"content": "/think> ok"}), chunk({}, "stop")]
    with pytest.raises(CheckFailed, match="</think>"):
        expect_no_markup(summarize(chunks).content, "streamed content")


def test_a_stream_without_a_finish_or_with_deltas_after_it_fails() -> None:
    with pytest.raises(CheckFailed, match="finish_reason"):
        expect_stream_envelope([role(), chunk({"content": "cut"})])
    with pytest.raises(CheckFailed, match="after the finish_reason"):
        expect_stream_envelope([role(), chunk({}, "stop"), chunk({"content": "late"})])
