"""OpenAI chunk building: one SSE event per engine chunk, order-preserving delta merges, usage shape."""

from __future__ import annotations

import json

from deepseek_frontend.api.openai.chat_response import ChunkWriter, build_response, events_to_deltas
from deepseek_frontend.edge.sse import DONE, data_event, named_event
from deepseek_frontend.parsing import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
)
from deepseek_frontend.pipeline.chat import ChatRequest, ChoiceAccumulator, PipelineChunk, StreamEnd, Usage


def parse_event(raw: bytes) -> dict:
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    return json.loads(raw[6:-2])


def test_events_of_one_chunk_merge_into_one_delta_in_order() -> None:
    events = [ReasoningDelta("a"), ReasoningDelta("b"), ContentDelta("c"), ContentDelta("d")]
    assert events_to_deltas(events) == [{"reasoning_content": "ab", "content": "cd"}]


def test_an_event_that_would_reorder_starts_a_new_delta() -> None:
    events = [ContentDelta("x"), ReasoningDelta("y"), ContentDelta("z")]
    assert events_to_deltas(events) == [{"content": "x"}, {"reasoning_content": "y", "content": "z"}]


def test_tool_call_start_and_arguments_merge_per_call() -> None:
    events = [
        ToolCallStart(0, "call_a", "f"),
        ToolCallArgumentsDelta(0, '{"x": '),
        ToolCallArgumentsDelta(0, "1}"),
        ToolCallEnd(0),
        ToolCallStart(1, "call_b", "g"),
        ToolCallArgumentsDelta(1, "{}"),
    ]
    assert events_to_deltas(events) == [
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                },
                {
                    "index": 1,
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "g", "arguments": "{}"},
                },
            ]
        }
    ]
    assert events_to_deltas([ToolCallArgumentsDelta(2, '"k"')]) == [
        {"tool_calls": [{"index": 2, "function": {"arguments": '"k"'}}]}
    ]


def test_chunk_writer_emits_the_openai_chunk_envelope() -> None:
    writer = ChunkWriter("chatcmpl-1", 1700000000, "deepseek-v4-flash")
    role = parse_event(writer.role(0))
    assert role == {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "deepseek-v4-flash",
        "service_tier": "default",
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
    }
    usage = Usage(prompt_tokens=10, completion_tokens=5, reasoning_tokens=2, cached_tokens=8)
    end = StreamEnd("stop", usage)
    events = writer.chunk(PipelineChunk(1, [ContentDelta("hi")], None, end))
    assert [parse_event(e)["choices"][0] for e in events] == [
        {"index": 1, "delta": {"content": "hi"}, "logprobs": None, "finish_reason": None},
        {"index": 1, "delta": {}, "logprobs": None, "finish_reason": "stop"},
    ]
    final = parse_event(writer.usage(usage))
    assert final["choices"] == []
    assert final["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 8},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }


def test_an_empty_engine_chunk_sends_nothing() -> None:
    writer = ChunkWriter("chatcmpl-1", 0, "m")
    assert writer.chunk(PipelineChunk(0, [])) == []


def test_usage_of_n_choices_counts_the_prompt_once() -> None:
    a = Usage(prompt_tokens=10, completion_tokens=4, reasoning_tokens=1, cached_tokens=0)
    b = Usage(prompt_tokens=10, completion_tokens=6, reasoning_tokens=2, cached_tokens=0)
    combined = Usage.combine([a, b])
    assert (combined.prompt_tokens, combined.completion_tokens, combined.reasoning_tokens) == (10, 10, 3)
    assert combined.total_tokens == 20


def test_non_streamed_response_is_the_accumulation_of_the_chunks() -> None:
    acc = ChoiceAccumulator(0)
    acc.add(PipelineChunk(0, [ReasoningDelta("why"), ContentDelta("")]))
    acc.add(PipelineChunk(0, [ToolCallStart(0, "call_x", "f"), ToolCallArgumentsDelta(0, "{}")]))
    acc.add(PipelineChunk(0, [], None, StreamEnd("tool_calls", Usage(3, 4, 1, 0))))
    req = ChatRequest(messages=[], request_id="chatcmpl-9", model="m")
    response = build_response(req, [acc], 5)
    assert response["object"] == "chat.completion"
    assert response["choices"] == [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "why",
                "tool_calls": [
                    {"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ]
    assert response["usage"]["completion_tokens_details"] == {"reasoning_tokens": 1}


def test_sse_framing() -> None:
    assert data_event({"a": "x\ny"}) == b'data: {"a":"x\\ny"}\n\n'
    assert named_event("message_start", {"type": "message_start"}) == (
        b'event: message_start\ndata: {"type":"message_start"}\n\n'
    )
    assert DONE == b"data: [DONE]\n\n"


def test_the_single_text_fast_path_matches_the_general_chunk_shape() -> None:
    writer = ChunkWriter("chatcmpl-1", 7, "m")
    for index, event in ((0, ContentDelta('q"\n😀')), (2, ReasoningDelta("r"))):
        [fast] = writer.chunk(PipelineChunk(index, [event]))
        key = "content" if isinstance(event, ContentDelta) else "reasoning_content"
        assert parse_event(fast) == parse_event(writer.delta(index, {key: event.text}))


def test_a_chunk_encoded_as_one_body_part_is_its_events_joined() -> None:
    writer = ChunkWriter("chatcmpl-1", 7, "m")
    end = StreamEnd("stop", Usage(prompt_tokens=3, completion_tokens=2))
    for chunk in (
        PipelineChunk(0, [ContentDelta("plain")]),
        PipelineChunk(1, [ReasoningDelta("why")]),
        PipelineChunk(0, [ReasoningDelta("why"), ContentDelta("so")]),
        PipelineChunk(0, [ContentDelta("last")], None, end),
        PipelineChunk(0, []),
    ):
        assert writer.encode(chunk) == b"".join(writer.chunk(chunk))
