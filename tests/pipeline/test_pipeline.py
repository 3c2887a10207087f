"""ChatPipeline: prepare (render, tokenize, limits, constraints) and stream (detokenize, parse, stop, usage).

The engine is scripted (``tests/support/engine.py``), so each test controls the exact chunking.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from deepseek_frontend.errors import (
    ContextLengthError,
    EngineStreamError,
    EngineUnavailableError,
    RequestError,
    UnsupportedFeatureError,
)
from deepseek_frontend.parsing import ContentDelta, ReasoningDelta, ToolCallArgumentsDelta, ToolCallStart
from deepseek_frontend.pipeline.chat import (
    UNKNOWN_RESERVATION_MARGIN,
    ChatPipeline,
    ChatRequest,
    ChoiceAccumulator,
    PipelineChunk,
    PipelineConfig,
    collect,
)
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.engine import ScriptedEngine

CONFIG = PipelineConfig(
    served_model_name="deepseek-v4-flash",
    family="deepseek_v4",
    engine="sim",
    context_length=4096,
    reasoning_effort_profile="preview",
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = (
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)


def request(**fields: Any) -> ChatRequest:
    base: dict[str, Any] = {
        "messages": [{"role": "user", "content": "hello"}],
        "request_id": "chatcmpl-t",
        "model": "deepseek-v4-flash",
    }
    return ChatRequest(**{**base, **fields})


def make(tokenizer: PromptTokenizer, pieces: list[str], config: PipelineConfig = CONFIG, **engine: Any):
    backend = ScriptedEngine(tokenizer, pieces, **engine)
    return ChatPipeline(config, tokenizer, backend), backend


def run(pipeline: ChatPipeline, req: ChatRequest) -> list[ChoiceAccumulator]:
    async def go() -> list[ChoiceAccumulator]:
        prepared = pipeline.prepare(req)
        return await collect(await pipeline.start(prepared))

    return asyncio.run(go())


def chunks_of(pipeline: ChatPipeline, req: ChatRequest) -> list[PipelineChunk]:
    async def go() -> list[PipelineChunk]:
        streams = await pipeline.start(pipeline.prepare(req))
        return [c async for c in streams[0]]

    return asyncio.run(go())


def test_prepare_renders_the_prompt_ends_in_think_and_stops_on_eos(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, [])
    thinking = pipeline.prepare(request())
    chat = pipeline.prepare(request(thinking=False))
    assert prompt_tokenizer.decode(thinking.input_ids[-1:]) == "<think>"
    assert prompt_tokenizer.decode(chat.input_ids[-1:]) == "</think>"
    assert thinking.input_ids[0] == prompt_tokenizer.bos_token_id
    assert thinking.sampling.stop_token_ids == (prompt_tokenizer.eos_token_id,)
    # the fake engine reports no capabilities: the default leaves the documented reservation margin
    assert thinking.sampling.max_new_tokens == (
        CONFIG.context_length - thinking.prompt_tokens - UNKNOWN_RESERVATION_MARGIN
    )


def test_tool_choice_none_keeps_tools_out_of_the_prompt(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, [])
    with_tools = pipeline.prepare(request(tools=[WEATHER]))
    without = pipeline.prepare(request(tools=[WEATHER], tool_choice="none"))
    assert "get_weather" in prompt_tokenizer.decode(with_tools.input_ids)
    assert "get_weather" not in prompt_tokenizer.decode(without.input_ids)
    assert without.tools is None


def test_prompt_plus_max_tokens_over_the_context_is_rejected(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, [])
    with pytest.raises(ContextLengthError) as info:
        pipeline.prepare(request(max_tokens=4096))
    assert info.value.param == "max_tokens"
    assert info.value.code == "context_length_exceeded"
    long = request(messages=[{"role": "user", "content": "word " * 5000}])
    with pytest.raises(ContextLengthError) as info:
        pipeline.prepare(long)
    assert info.value.param == "messages"


def test_required_tool_choice_builds_a_grammar_or_is_refused(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, [])
    prepared = pipeline.prepare(request(tools=[WEATHER], tool_choice="required"))
    assert prepared.sampling.constraint is not None
    assert prepared.sampling.constraint.kind == "ebnf"
    assert "get_weather" in prepared.sampling.constraint.value
    weak, _ = make(prompt_tokenizer, [], constraints=frozenset())
    with pytest.raises(UnsupportedFeatureError) as info:
        weak.prepare(
            request(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
        )
    assert info.value.param == "tool_choice"
    with pytest.raises(RequestError):
        pipeline.prepare(request(tool_choice="required"))


def test_json_response_format_is_constrained_in_chat_mode(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, [])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    prepared = pipeline.prepare(request(thinking=False, response_format=rf))
    assert prepared.sampling.constraint is not None and prepared.sampling.constraint.kind == "json_schema"
    thinking = pipeline.prepare(request(response_format=rf))
    # enforced in thinking mode too: a grammar with free reasoning first
    # (tests/pipeline/test_structured_output.py)
    assert thinking.sampling.constraint is not None and thinking.sampling.constraint.kind == "ebnf"


def test_stream_splits_reasoning_content_and_counts_usage(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, ["Let me ", "think.", "</think>", "The answer", " is 4."])
    [acc] = run(pipeline, request())
    assert acc.reasoning_content == "Let me think."
    assert acc.content == "The answer is 4."
    assert acc.finish_reason == "stop"
    usage = acc.usage
    total = sum(
        len(prompt_tokenizer.encode_raw(p)) for p in ["Let me ", "think.", "</think>", "The answer", " is 4."]
    )
    assert usage.completion_tokens == total + 1  # + EOS
    assert (
        usage.reasoning_tokens
        == len(prompt_tokenizer.encode_raw("Let me ")) + len(prompt_tokenizer.encode_raw("think.")) + 1
    ), "reasoning tokens: the reasoning chunks plus the </think> chunk"
    assert usage.cached_tokens == 3
    assert usage.prompt_tokens == pipeline.prepare(request()).prompt_tokens


def test_stream_yields_one_chunk_per_engine_chunk_and_ends_once(prompt_tokenizer: PromptTokenizer) -> None:
    pieces = ["a", "b", "</think>", "c"]
    pipeline, _ = make(prompt_tokenizer, pieces)
    chunks = chunks_of(pipeline, request())
    assert len(chunks) == len(pieces) + 1  # + the EOS chunk
    assert [c.end is not None for c in chunks] == [False] * len(pieces) + [True]
    kinds = [type(e) for c in chunks for e in c.events]
    assert kinds == [ReasoningDelta, ReasoningDelta, ContentDelta]


def test_tool_calls_stream_and_finish_with_tool_calls(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, ["Checking.", CALL])
    [acc] = run(pipeline, request(thinking=False, tools=[WEATHER]))
    assert acc.content == "Checking."
    [call] = acc.tool_calls
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert call.id.startswith("call_")
    assert acc.finish_reason == "tool_calls"
    chunks = chunks_of(pipeline, request(thinking=False, tools=[WEATHER]))
    kinds = {type(e) for c in chunks for e in c.events}
    assert {ToolCallStart, ToolCallArgumentsDelta} <= kinds


def test_a_stop_string_across_chunks_truncates_and_aborts_the_engine(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    pipeline, engine = make(prompt_tokenizer, ["Hello wor", "ld, ST", "OP here", " and more", " text"])
    [acc] = run(pipeline, request(thinking=False, stop=("STOP",)))
    assert acc.content == "Hello world, "
    assert acc.finish_reason == "stop"
    assert acc.end is not None and acc.end.stop_sequence == "STOP"
    assert engine.closed == ["chatcmpl-t"], "the engine request was aborted at the match"


def test_stop_strings_do_not_apply_to_reasoning(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, ["think STOP", "</think>", "answer STOP rest"])
    [acc] = run(pipeline, request(stop=("STOP",)))
    assert acc.reasoning_content == "think STOP"
    assert acc.content == "answer "


def test_length_finish_is_reported(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, ["</think>", "cut he"], finish="length")
    [acc] = run(pipeline, request())
    assert acc.finish_reason == "length"
    assert acc.content == "cut he"


def test_n_choices_run_concurrently_with_their_own_seeds(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, engine = make(prompt_tokenizer, ["</think>", "same"])
    accs = run(pipeline, request(n=3, seed=10))
    assert [a.index for a in accs] == [0, 1, 2]
    assert [a.content for a in accs] == ["same"] * 3
    assert sorted(r.sampling.seed for r in engine.requests) == [10, 11, 12]
    assert len({r.request_id for r in engine.requests}) == 3


def test_failure_before_the_first_token_raises_from_start(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, ["x"], fail_at=0)
    with pytest.raises(EngineUnavailableError):
        run(pipeline, request())


def test_failure_mid_stream_raises_a_stream_error_after_the_delivered_chunks(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    pipeline, _ = make(prompt_tokenizer, ["</think>", "one", "two"], fail_at=2)

    async def go() -> tuple[list[PipelineChunk], BaseException | None]:
        [stream] = await pipeline.start(pipeline.prepare(request()))
        got: list[PipelineChunk] = []
        try:
            async for chunk in stream:
                got.append(chunk)
        except EngineStreamError as exc:
            return got, exc
        return got, None

    got, error = asyncio.run(go())
    assert error is not None
    assert "127.0.0.1" not in str(error)
    assert [e.text for c in got for e in c.events] == ["one"]


def test_closing_a_stream_early_aborts_the_engine_request(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, engine = make(prompt_tokenizer, ["a", "b", "c", "d"])

    async def go() -> None:
        [stream] = await pipeline.start(pipeline.prepare(request()))
        async for _ in stream:
            break
        await stream.aclose()

    asyncio.run(go())
    assert engine.closed == ["chatcmpl-t"]


def test_raw_prompts_pass_through_without_parsing(prompt_tokenizer: PromptTokenizer) -> None:
    pipeline, _ = make(prompt_tokenizer, ["<think>raw", "</think>text"])
    req = request(messages=(), thinking=False, max_tokens=10)

    async def go() -> list[ChoiceAccumulator]:
        prepared = pipeline.prepare_raw(req, [1, 2, 3])
        return await collect(await pipeline.start(prepared))

    [acc] = asyncio.run(go())
    assert acc.content == "<think>raw</think>text", (
        "raw completions keep special spellings, drop the final EOS"
    )
    with pytest.raises(RequestError) as info:
        pipeline.prepare_raw(req, [prompt_tokenizer.vocab_size + 5])
    assert info.value.param == "prompt[0]"


def test_the_engine_gets_the_prompt_ids_as_the_tokenizer_holds_them(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    """Each request's ids reach the in-process engine as the tokenizer's 4-byte array (what that
    engine reads as bytes instead of packing a list), for a cold prompt and for a follow-up whose
    head the prefix cache gave; workers over HTTP get a list."""
    from array import array

    pipeline, backend = make(prompt_tokenizer, ["Hi"])
    first = [{"role": "user", "content": "Summarise the design notes. " * 40}]
    answer = {"role": "assistant", "content": "Done."}
    follow_up = [*first, answer, {"role": "user", "content": "And the tests?"}]
    for messages in (first, follow_up):
        hits = prompt_tokenizer.prefix_cache.hits
        run(pipeline, request(messages=messages))
        sent = backend.requests[-1]
        assert isinstance(sent.input_ids, array) and sent.input_ids.typecode == "i"
        assert len(sent.input_ids) > 100
    assert prompt_tokenizer.prefix_cache.hits == hits + 1, "the follow-up's head was not the cached one"
    # workers over HTTP get a list: their JSON body carries it
    pipeline, backend = make(prompt_tokenizer, ["Hi"], dataclasses.replace(CONFIG, engine="sglang"))
    run(pipeline, request(messages=first))
    assert type(backend.requests[-1].input_ids) is list


def test_the_in_process_engine_gets_the_tokenizer_array_as_ids_of_its_own(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    """The in-process engine gets the prompt's ids as the tokenizer's compact array (no list of
    Python ints is built for it), a worker over HTTP the same ids as a list. The array is the
    request's own: a consumer that wrote over it would not change the prefix cache's entry, so a
    follow-up built on that entry is what a cold encode gives."""
    from array import array

    pipeline, backend = make(prompt_tokenizer, ["Hi"])
    http, http_backend = make(prompt_tokenizer, ["Hi"], dataclasses.replace(CONFIG, engine="sglang"))
    first = [{"role": "user", "content": "List the open questions of the design. " * 40}]
    follow_up = [*first, {"role": "assistant", "content": "Two."}, {"role": "user", "content": "Which?"}]
    run(http, request(messages=first))
    run(pipeline, request(messages=first))
    sent = backend.requests[-1].input_ids
    assert isinstance(sent, array) and type(http_backend.requests[-1].input_ids) is list
    assert http_backend.requests[-1].input_ids == list(sent)
    sent[:] = array("i", [0]) * len(sent)
    hits = prompt_tokenizer.prefix_cache.hits
    run(pipeline, request(messages=follow_up))
    assert prompt_tokenizer.prefix_cache.hits == hits + 1, "the follow-up's head was not the cached one"
    warm = list(backend.requests[-1].input_ids)
    prompt_tokenizer.prefix_cache.clear()
    prompt_tokenizer.cache.clear()
    run(pipeline, request(messages=follow_up))
    assert warm == list(backend.requests[-1].input_ids)
