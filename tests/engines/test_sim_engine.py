"""The in-process simulated engine: DSV4 output for the prompt it receives, and engine semantics."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import jsonschema
import pytest

from deepseek_frontend.engines.base import DecodingConstraint
from deepseek_frontend.engines.sim.engine import PrefixCache, SimulatedEngine, prompt_bytes
from deepseek_frontend.engines.sim.model import read_prompt
from deepseek_frontend.errors import EngineStreamError, EngineUnavailableError
from deepseek_frontend.parsing import parse_completion
from deepseek_frontend.parsing.constraints import (
    build_json_schema_constraint,
    build_tool_call_constraint,
    ebnf_accepts,
)

from .conftest import SEARCH_TOOL, TOOLS, WEATHER_TOOL, collect, prompt_ids, request_for

EOS_TEXT = "<｜end▁of▁sentence｜>"


def run(engine: SimulatedEngine, ids: list[int], **sampling: Any) -> tuple[list[int], list[Any]]:
    return asyncio.run(collect(engine, request_for(ids, **sampling)))


def text_of(prompt_tokenizer: Any, ids: list[int]) -> str:
    return prompt_tokenizer.decode(ids, skip_special_tokens=False)


def schema_of(tool: dict) -> dict:
    return tool["function"]["parameters"]


def test_same_prompt_and_seed_give_the_same_ids_and_chunking(prompt_tokenizer: Any) -> None:
    ids = prompt_ids("Tell me about the sea", thinking=True)
    first = run(SimulatedEngine(prompt_tokenizer, tokens_per_chunk=3), ids)
    second = run(SimulatedEngine(prompt_tokenizer, tokens_per_chunk=3), ids)
    assert first[0] == second[0]
    assert [c.token_ids for c in first[1]] == [c.token_ids for c in second[1]]
    assert all(len(c.token_ids) == 3 for c in first[1][:-1])


def test_different_seeds_vary_the_wording(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer)
    ids = prompt_ids("Tell me about the sea")
    outputs = {tuple(run(engine, ids, seed=seed)[0]) for seed in range(4)}
    assert len(outputs) == 4


def test_thinking_mode_answer_has_reasoning_then_text_then_eos(prompt_tokenizer: Any) -> None:
    out, chunks = run(SimulatedEngine(prompt_tokenizer), prompt_ids("Tell me about the sea", thinking=True))
    text = text_of(prompt_tokenizer, out)
    assert out[-1] == prompt_tokenizer.eos_token_id
    assert chunks[-1].finish_reason == "stop" and chunks[-1].matched_stop == prompt_tokenizer.eos_token_id
    parsed = parse_completion(text, family="deepseek_v4", thinking=True)
    assert parsed.reasoning_content.startswith("The user wrote: Tell me about the sea.")
    assert "Tell me about the sea" in parsed.content
    assert parsed.tool_calls == []


def test_chat_mode_answer_has_no_reasoning(prompt_tokenizer: Any) -> None:
    out, _ = run(SimulatedEngine(prompt_tokenizer), prompt_ids("Tell me about the sea"))
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v4", thinking=False)
    assert parsed.reasoning_content == ""
    assert parsed.content == "You said: Tell me about the sea."


def test_reply_with_exactly_is_obeyed(prompt_tokenizer: Any) -> None:
    out, _ = run(
        SimulatedEngine(prompt_tokenizer), prompt_ids("Reply with exactly: STOP here please\nthanks")
    )
    assert text_of(prompt_tokenizer, out) == "STOP here please" + EOS_TEXT


def test_write_n_words_produces_n_words(prompt_tokenizer: Any) -> None:
    out, _ = run(
        SimulatedEngine(prompt_tokenizer),
        prompt_ids("Please write 300 words about anything"),
        max_new_tokens=5000,
    )
    assert len(text_of(prompt_tokenizer, out).removesuffix(EOS_TEXT).split()) == 300


def test_special_spellings_are_real_special_ids(prompt_tokenizer: Any) -> None:
    out, _ = run(
        SimulatedEngine(prompt_tokenizer),
        prompt_ids("What is the weather in Paris?", tools=TOOLS, thinking=True),
    )
    assert prompt_tokenizer.encode_raw("</think>")[0] in out
    dsml = prompt_tokenizer.encode_raw("｜DSML｜")
    assert len(dsml) == 1 and dsml[0] in out


def test_a_tool_request_produces_a_parsable_schema_valid_call(prompt_tokenizer: Any) -> None:
    out, _ = run(
        SimulatedEngine(prompt_tokenizer),
        prompt_ids("What is the weather in Paris?", tools=TOOLS, thinking=True),
    )
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v4", thinking=True)
    assert [c.name for c in parsed.tool_calls] == ["get_weather"]
    args = json.loads(parsed.tool_calls[0].arguments)
    jsonschema.validate(args, schema_of(WEATHER_TOOL))
    assert args["location"] == "Paris"
    assert parsed.reasoning_content.endswith("I should call get_weather.")


def test_nested_schema_arguments_are_valid(prompt_tokenizer: Any) -> None:
    out, _ = run(SimulatedEngine(prompt_tokenizer), prompt_ids("Search the web for cats", tools=TOOLS))
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v4", thinking=False)
    assert [c.name for c in parsed.tool_calls] == ["web_search"]
    jsonschema.validate(json.loads(parsed.tool_calls[0].arguments), schema_of(SEARCH_TOOL))


def test_parallel_request_with_two_cities_calls_the_tool_twice(prompt_tokenizer: Any) -> None:
    ids = prompt_ids("What's the weather in Paris and Tokyo? Check both in parallel.", tools=TOOLS)
    out, _ = run(SimulatedEngine(prompt_tokenizer), ids)
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v4", thinking=False)
    assert [json.loads(c.arguments)["location"] for c in parsed.tool_calls] == ["Paris", "Tokyo"]


def test_parallel_request_naming_two_tools_calls_each(prompt_tokenizer: Any) -> None:
    ids = prompt_ids("Use get_weather and web_search for Rome, both at once in parallel", tools=TOOLS)
    out, _ = run(SimulatedEngine(prompt_tokenizer), ids)
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v4", thinking=False)
    assert [c.name for c in parsed.tool_calls] == ["get_weather", "web_search"]


def test_a_tool_result_is_answered_in_text(prompt_tokenizer: Any) -> None:
    ids = prompt_ids("What is the weather in Paris?", tools=TOOLS, tool_result="sunny, 21 degrees")
    out, _ = run(SimulatedEngine(prompt_tokenizer), ids)
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v4", thinking=False)
    assert parsed.tool_calls == []
    assert parsed.content == "Based on the tool result: sunny, 21 degrees."


def test_without_tools_a_weather_question_gets_text(prompt_tokenizer: Any) -> None:
    out, _ = run(SimulatedEngine(prompt_tokenizer), prompt_ids("What is the weather in Paris?"))
    assert "｜DSML｜" not in text_of(prompt_tokenizer, out)


def test_dsv32_prompt_gets_function_calls_block(prompt_tokenizer: Any) -> None:
    ids = prompt_ids("What is the weather in Paris?", tools=TOOLS, family="deepseek_v32")
    out, _ = run(SimulatedEngine(prompt_tokenizer), ids)
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v32", thinking=False)
    assert [c.name for c in parsed.tool_calls] == ["get_weather"]


def test_named_tool_constraint_is_satisfied_even_when_the_user_asks_for_text(prompt_tokenizer: Any) -> None:
    named = {"type": "function", "function": {"name": "web_search"}}
    constraint = build_tool_call_constraint("deepseek_v4", TOOLS, named, thinking=True)
    ids = prompt_ids("Reply with exactly: hello", tools=TOOLS, thinking=True)
    out, _ = run(SimulatedEngine(prompt_tokenizer), ids, constraint=constraint)
    text = text_of(prompt_tokenizer, out)
    assert ebnf_accepts(constraint.value, text.removesuffix(EOS_TEXT))
    parsed = parse_completion(text, family="deepseek_v4", thinking=True)
    assert [c.name for c in parsed.tool_calls] == ["web_search"]
    jsonschema.validate(json.loads(parsed.tool_calls[0].arguments), schema_of(SEARCH_TOOL))


def test_required_constraint_keeps_the_call_the_user_asked_for(prompt_tokenizer: Any) -> None:
    constraint = build_tool_call_constraint("deepseek_v4", TOOLS, "required", thinking=False)
    ids = prompt_ids("What is the weather in Oslo?", tools=TOOLS)
    out, _ = run(SimulatedEngine(prompt_tokenizer), ids, constraint=constraint)
    text = text_of(prompt_tokenizer, out).removesuffix(EOS_TEXT)
    assert ebnf_accepts(constraint.value, text)
    assert 'invoke name="get_weather"' in text and ">Oslo<" in text


def test_json_schema_constraint_output_is_valid_json_for_the_schema(prompt_tokenizer: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "temps": {"type": "array", "items": {"type": "number", "minimum": 10}, "minItems": 3},
            "ok": {"type": "boolean"},
            "kind": {"enum": ["a", "b"]},
        },
        "required": ["city", "temps", "ok", "kind"],
        "additionalProperties": False,
    }
    ids = prompt_ids("Give me JSON for Berlin", thinking=True)
    out, _ = run(SimulatedEngine(prompt_tokenizer), ids, constraint=build_json_schema_constraint(schema))
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v4", thinking=True)
    jsonschema.validate(json.loads(parsed.content), schema)


def test_regex_constraints_are_not_claimed(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer)
    assert engine.supports_constraint("ebnf") and engine.supports_constraint("json_schema")
    assert not engine.supports_constraint("regex")
    with pytest.raises(Exception, match="cannot enforce"):
        run(engine, prompt_ids("hi"), constraint=DecodingConstraint("regex", "a+"))


def test_max_new_tokens_cuts_with_finish_length(prompt_tokenizer: Any) -> None:
    out, chunks = run(
        SimulatedEngine(prompt_tokenizer, tokens_per_chunk=4), prompt_ids("write 50 words"), max_new_tokens=10
    )
    assert len(out) == 10
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 10


def test_a_stop_token_id_ends_the_output_and_is_reported(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer)
    ids = prompt_ids("Tell me about the sea", thinking=True)
    full, _ = run(engine, ids)
    think_end = prompt_tokenizer.encode_raw("</think>")[0]
    out, chunks = run(engine, ids, stop_token_ids=(think_end,))
    assert out == full[: full.index(think_end) + 1]
    assert chunks[-1].finish_reason == "stop" and chunks[-1].matched_stop == think_end


def test_usage_counts_prompt_completion_and_cached_pages(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer, page_size=16)
    ids = prompt_ids("Tell me about the sea", tools=TOOLS)
    _, first = run(engine, ids)
    _, second = run(engine, ids[:-3] + prompt_ids("Something else entirely")[-3:])
    assert first[-1].prompt_tokens == len(ids)
    assert first[-1].cached_tokens == 0
    assert second[-1].cached_tokens == (len(ids) - 4) // 16 * 16
    assert first[-1].completion_tokens == sum(len(c.token_ids) for c in first)


def test_prefix_cache_reports_whole_pages_of_the_longest_seen_prefix() -> None:
    cache = PrefixCache(page_size=4, max_pages=100)
    assert cache.lookup_and_insert(list(range(20))) == 0
    assert cache.lookup_and_insert(list(range(10)) + [99] * 10) == 8
    assert cache.lookup_and_insert(list(range(20))) == 16  # never the whole prompt


def test_prefix_cache_evicts_the_ends_of_prompts_and_keeps_their_prefixes() -> None:
    """Like a radix cache: the least recently used pages to go are the last pages of old prompts, so a
    lookup still finds the head of an old conversation (never a page whose predecessors are gone)."""
    cache = PrefixCache(page_size=4, max_pages=6)
    old = list(range(29))  # 7 pages, the last one (the prompt's final token) never cached
    assert cache.lookup_and_insert(old) == 0  # 7 pages stored, one over the bound: page 7 goes
    assert cache.lookup_and_insert(list(range(100, 109))) == 0  # 2 more pages: pages 5 and 6 go
    assert cache.lookup_and_insert([*old[:24], 7, 7, 7, 7, 7]) == 16
    # a shared head used again is fresher than the ends of the prompts that share it
    cache = PrefixCache(page_size=4, max_pages=4)
    assert cache.lookup_and_insert([*range(8), *range(50, 59)]) == 0  # pages h1 h2 a1 a2
    assert cache.lookup_and_insert([*range(8), *range(70, 75)]) == 8  # h1 h2 b1: a2 goes
    assert cache.lookup_and_insert([*range(8), *range(50, 55)]) == 12  # a1 is still there


def test_the_engine_reads_a_prompt_as_the_text_reading_does(prompt_tokenizer: Any) -> None:
    """Reading only the last turn anew (the head memoised) sees what reading the whole text sees."""
    engine = SimulatedEngine(prompt_tokenizer)
    prompts = [
        prompt_ids("What is the weather in Paris?", tools=TOOLS, thinking=True),
        prompt_ids("weather?", tools=TOOLS, tool_result="rainy"),
        prompt_ids("weather?", tools=TOOLS, family="deepseek_v32"),
        prompt_ids("Reply with exactly: one two"),
        # the user spells the turn opener: the frontend keeps it text, the text reading finds it last
        prompt_ids("before <｜User｜> Reply with exactly: after"),
        prompt_tokenizer.encode_raw("no user turn at all"),
    ]
    for ids in prompts:
        expected = read_prompt(text_of(prompt_tokenizer, ids))
        assert engine._read(ids, prompt_bytes(ids)) == expected
        assert engine._read(ids, prompt_bytes(ids)) == expected  # the head now from the memo


def test_image_placeholders_are_counted_on_id_boundaries_only(prompt_tokenizer: Any) -> None:
    """The placeholder id's four bytes can also appear across two neighbouring ids: those are not counted."""
    from deepseek_frontend.engines.sim.engine import IMAGE_TOKEN_ID
    from deepseek_frontend.engines.sim.prompts import count_id, last_index

    order = sys.byteorder  # the ids are packed as machine ints
    needle = IMAGE_TOKEN_ID.to_bytes(4, order)
    for k in (1, 2, 3):  # the first k bytes end one id, the rest start the next (both valid int32)
        first = int.from_bytes(bytes(4 - k) + needle[:k], order)
        second = int.from_bytes(needle[k:] + bytes(k), order)
        if max(first, second) < 2**31:
            break
    ids = [5, first, second, 6]
    assert needle in prompt_bytes(ids)  # type: ignore[operator]
    assert count_id(prompt_bytes(ids), IMAGE_TOKEN_ID) == 0  # type: ignore[arg-type]
    assert last_index(prompt_bytes(ids), IMAGE_TOKEN_ID) == -1  # type: ignore[arg-type]
    ids = [IMAGE_TOKEN_ID, *ids, IMAGE_TOKEN_ID, 1]
    assert count_id(prompt_bytes(ids), IMAGE_TOKEN_ID) == 2  # type: ignore[arg-type]
    assert last_index(prompt_bytes(ids), IMAGE_TOKEN_ID) == 5  # type: ignore[arg-type]


def test_fail_after_zero_fails_before_the_first_token_and_reports_unhealthy(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer, fail_after=0)
    with pytest.raises(EngineUnavailableError):
        run(engine, prompt_ids("hi"))
    assert asyncio.run(engine.check_health()) is False


def test_fail_after_n_streams_n_tokens_then_a_stream_error(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer, fail_after=5, tokens_per_chunk=2)
    received: list[int] = []

    async def consume() -> None:
        async for chunk in engine.generate(request_for(prompt_ids("write 30 words"))):
            received.extend(chunk.token_ids)

    with pytest.raises(EngineStreamError):
        asyncio.run(consume())
    assert len(received) == 5
    assert engine.stats.failed == 1


def test_abort_ends_the_stream_with_finish_abort(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer)

    async def scenario() -> list[Any]:
        chunks = []
        async for chunk in engine.generate(request_for(prompt_ids("write 100 words"), rid="r-abort")):
            chunks.append(chunk)
            if len(chunks) == 3:
                await engine.abort("r-abort")
        return chunks

    chunks = asyncio.run(scenario())
    assert len(chunks) == 4 and chunks[-1].finish_reason == "abort" and chunks[-1].token_ids == []
    assert list(engine.stats.aborted_ids) == ["r-abort~"]


def test_closing_the_stream_early_counts_as_an_abort(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer)

    async def scenario() -> None:
        stream = engine.generate(request_for(prompt_ids("write 100 words"), rid="r-close"))
        await anext(stream)
        await stream.aclose()

    asyncio.run(scenario())
    assert engine.stats.aborted == 1 and engine.stats.running == 0


def test_concurrent_streams_interleave_with_zero_delays(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer)
    order: list[str] = []

    async def one(rid: str) -> None:
        async for _ in engine.generate(request_for(prompt_ids("write 20 words"), rid=rid)):
            order.append(rid)

    async def both() -> None:
        await asyncio.gather(one("a"), one("b"))

    asyncio.run(both())
    # neither stream runs to completion before the other starts
    assert order.index("b") < len(order) - order[::-1].index("a") - 1


def test_thinking_after_a_tool_result_reasons_about_the_result(prompt_tokenizer: Any) -> None:
    ids = prompt_ids("What is the weather in Paris?", tools=TOOLS, tool_result="sunny", thinking=True)
    out, _ = run(SimulatedEngine(prompt_tokenizer), ids)
    parsed = parse_completion(text_of(prompt_tokenizer, out), family="deepseek_v4", thinking=True)
    assert parsed.reasoning_content == "The tool returned: sunny. I can answer now."
    assert parsed.content == "Based on the tool result: sunny."


def test_a_chunk_size_range_varies_chunks_like_speculative_decoding_and_replays(
    prompt_tokenizer: Any,
) -> None:
    ids = prompt_ids("write 200 words about the sea")
    fixed, _ = run(SimulatedEngine(prompt_tokenizer), ids)
    out, chunks = run(SimulatedEngine(prompt_tokenizer, tokens_per_chunk=1, max_tokens_per_chunk=4), ids)
    again, replay = run(SimulatedEngine(prompt_tokenizer, tokens_per_chunk=1, max_tokens_per_chunk=4), ids)
    assert out == fixed  # the chunking changes, the output does not
    sizes = [len(c.token_ids) for c in chunks[:-1]]
    assert set(sizes) == {1, 2, 3, 4}  # every size in the range occurs over ~200 tokens
    assert [c.token_ids for c in replay] == [c.token_ids for c in chunks] and again == out
    with pytest.raises(ValueError, match="max_tokens_per_chunk"):
        SimulatedEngine(prompt_tokenizer, tokens_per_chunk=3, max_tokens_per_chunk=2)


def test_a_consumer_that_falls_behind_gets_the_missed_steps_in_one_chunk(prompt_tokenizer: Any) -> None:
    """The engine decodes on its own clock: steps that pass while the consumer is busy are ready at
    once, as one chunk; it never runs ahead of the clock, and the output is the same."""
    ids = prompt_ids("write 40 words about the sea")
    fixed, _ = run(SimulatedEngine(prompt_tokenizer), ids)
    itl = 0.02
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=itl * 1000, tokens_per_chunk=1)

    async def slow_consumer() -> tuple[list[int], list[int], list[tuple[float, int]]]:
        loop = asyncio.get_running_loop()
        out: list[int] = []
        sizes: list[int] = []
        progress: list[tuple[float, int]] = []
        stream = engine.generate(request_for(ids))
        first = await anext(stream)
        started = loop.time()
        out.extend(first.token_ids)
        async for chunk in stream:
            out.extend(chunk.token_ids)
            sizes.append(len(chunk.token_ids))
            progress.append((loop.time() - started, len(out) - len(first.token_ids)))
            if len(sizes) == 3:
                await asyncio.sleep(5 * itl)  # busy elsewhere for five steps
        return out, sizes, progress

    out, sizes, progress = asyncio.run(slow_consumer())
    assert out == fixed
    assert sizes[3] >= 4  # the steps that passed meanwhile, in the next chunk
    for elapsed, tokens in progress:
        assert tokens <= elapsed / itl + 1  # never ahead of the clock


def test_a_long_plan_is_written_off_the_event_loop(prompt_tokenizer: Any) -> None:
    """Whatever the simulated model writes, the event loop keeps its turns meanwhile: a cold
    100000-word answer is planned on the engine's planning thread, so a ticker coroutine keeps
    running before the first chunk arrives (planned on the loop it could not tick at all)."""
    engine = SimulatedEngine(prompt_tokenizer)
    ticks = 0
    first_at: list[int] = []

    async def ticker(stop: asyncio.Event) -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(ticker(stop))
        await asyncio.sleep(0)
        start = ticks
        stream = engine.generate(request_for(prompt_ids("write 100000 words"), rid="r-long"))
        await anext(stream)
        first_at.append(ticks - start)
        await stream.aclose()
        stop.set()
        await task

    asyncio.run(scenario())
    assert first_at[0] >= 3, first_at


def test_example_values_are_bounded_whatever_the_schema_asks() -> None:
    """Counts far past any max_tokens (the frontend refuses them; a sim-engine server may still be
    sent them) give a bounded value, planned at once, instead of a MemoryError or a hang."""
    from deepseek_frontend.engines.sim.model import MAX_EXAMPLE_TOTAL, example_value

    nested = {"type": "array", "minItems": 10**6, "items": {"type": "string", "minLength": 10**6}}
    for schema in (
        {"type": "array", "items": {"type": "integer"}, "minItems": 1e9},
        {"type": "string", "minLength": 1e12},
        {"type": "array", "minItems": 10**6, "items": nested},
        {"type": "integer", "minimum": 1e300, "multipleOf": 1e-300},
    ):
        size = len(json.dumps(example_value(schema)))
        assert size <= 2 * MAX_EXAMPLE_TOTAL, (schema, size)
