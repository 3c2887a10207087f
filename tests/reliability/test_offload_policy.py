"""Which work leaves the event loop: the uncached part of a prompt, on threads that let the loop run.

A follow-up of a cached conversation must prepare on the loop (it has nothing to tokenize, and on
the offload queue it would wait behind every cold prompt of a burst); a cold prompt's tokenizing
goes to the offload threads -- batched with the others queued meanwhile, at the event loop's
priority; both give exactly the ids a plain synchronous ``prepare`` gives. On those threads the
tokenizer must give the GIL back (``Tokenizer.encode`` holds it throughout), and the threads for
outsized work run nicer than the event loop.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from array import array
from typing import Any

import pytest

from deepseek_frontend.api.openai.chat_request import to_chat_request
from deepseek_frontend.engines.config import EngineConfig
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.errors import FormatError
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.pipeline.chat import ChatPipeline
from deepseek_frontend.pipeline.offload import OFFLOAD_NICENESS, BatchJob, OffloadPool, take_batch
from deepseek_frontend.pipeline.request import PreparedRequest
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer

pytestmark = pytest.mark.timeout(120)

WORDS = ["the", "frontend", "renders", "prompts", "and", "parses", "tool", "calls", "from", "every", "chunk"]


CONFIG = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash"), engine=EngineConfig(kind="sim"))


def _pipeline() -> ChatPipeline:
    """The served model's pipeline over a tokenizer of its own (its caches start cold)."""
    tokenizer = PromptTokenizer.load()
    app = create_app(CONFIG, tokenizer=tokenizer, backend=SimulatedEngine(tokenizer))
    return app.state.frontend.models.default.pipeline


def _text(n_words: int, salt: str) -> str:
    return f"{salt}: " + " ".join(WORDS[(i * 7) % len(WORDS)] for i in range(n_words))


def _record_offloads(pipeline: ChatPipeline) -> list[Any]:
    """The functions ``pipeline`` runs on its offload threads from now on (alone or batched), in order."""
    offloaded: list[Any] = []
    run, run_batched = pipeline.offload.run, pipeline.offload.run_batched

    async def recording_run(fn: Any, *args: Any) -> Any:
        offloaded.append(fn)
        return await run(fn, *args)

    async def recording_run_batched(fn: Any, item: Any, weight: int) -> None:
        offloaded.append(fn)
        await run_batched(fn, item, weight)

    pipeline.offload.run = recording_run  # type: ignore[method-assign]
    pipeline.offload.run_batched = recording_run_batched  # type: ignore[method-assign]
    return offloaded


def test_a_cached_follow_up_prepares_on_the_loop_and_a_cold_prompt_tokenizes_on_a_thread() -> None:
    pipeline, reference = _pipeline(), _pipeline()
    offloaded = _record_offloads(pipeline)
    config = CONFIG
    history = [{"role": "user", "content": _text(3000, "design notes")}]
    assert len(history[0]["content"]) > 4 * pipeline.offload_min_chars

    async def scenario() -> None:
        first = await pipeline.prepare_async(to_chat_request({"messages": history}, config, "r1"))
        assert len(offloaded) == 1, "the cold prompt was tokenized on the loop"
        follow_up = [*history, {"role": "assistant", "content": "Done."}, {"role": "user", "content": "And?"}]
        second = await pipeline.prepare_async(to_chat_request({"messages": follow_up}, config, "r2"))
        assert len(offloaded) == 1, "a follow-up of a cached conversation waited for an offload thread"
        for messages, prepared in ((history, first), (follow_up, second)):
            expected = reference.prepare(to_chat_request({"messages": messages}, config, "ref"))
            assert prepared.input_ids == expected.input_ids

    asyncio.run(scenario())


def test_a_short_cold_prompt_stays_on_the_loop() -> None:
    pipeline = _pipeline()
    offloaded = _record_offloads(pipeline)
    messages = [{"role": "user", "content": _text(20, "short")}]
    asyncio.run(pipeline.prepare_async(to_chat_request({"messages": messages}, CONFIG, "r")))
    assert offloaded == []


def test_tokenizing_a_long_text_on_a_thread_lets_other_threads_run() -> None:
    tokenizer = PromptTokenizer.load()
    text = _text(10_000, "long")  # one run, under the piece-splitting length: one encode call
    assert 1024 < len(text) < 65_536
    expected = tokenizer.text.encode(text, add_special_tokens=False).ids
    trials, woke_early = 10, 0
    for _ in range(trials):
        started = threading.Event()
        record: dict[str, Any] = {}

        def work(started: threading.Event = started, record: dict[str, Any] = record) -> None:
            record["set"] = time.perf_counter()
            started.set()
            record["ids"] = tokenizer._encode_texts([text])[0]
            record["encode_s"] = time.perf_counter() - record["set"]

        worker = threading.Thread(target=work)
        worker.start()
        started.wait()
        # Coming back from wait() needs the GIL: while an encode holds it, this thread waits for
        # the whole encode; when the encode releases it, this thread runs at once.
        woke_after = time.perf_counter()
        worker.join()
        assert record["ids"] == expected
        woke_early += (woke_after - record["set"]) < record["encode_s"] / 2
    assert woke_early >= trials // 2, f"this thread ran during the encode in {woke_early} of {trials} trials"


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are a Linux feature")
def test_offload_threads_run_nicer_than_the_event_loop() -> None:
    pool = OffloadPool(1)

    def own_niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def scenario() -> int:
        return await pool.run(own_niceness)

    try:
        thread_nice = asyncio.run(scenario())
    finally:
        pool.close()
    loop_nice = own_niceness()
    assert thread_nice == min(19, loop_nice + OFFLOAD_NICENESS)


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread nice values are a Linux feature")
def test_batched_cold_prompts_are_tokenized_at_the_loops_priority() -> None:
    """Admitting ordinary cold prompts is every new request's work, not outsized work that may wait."""
    pool = OffloadPool(1)
    seen: list[int] = []

    def own_niceness(items: list[Any]) -> list[BaseException | None]:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return [None] * len(items)

    try:
        asyncio.run(pool.run_batched(own_niceness, None, 1))
    finally:
        pool.close()
    assert seen == [os.getpriority(os.PRIO_PROCESS, threading.get_native_id())]


def test_the_tokenizer_self_check_runs_on_an_offload_thread_not_the_loop() -> None:
    """The sampled whole-prompt check of the id caches (1 prompt in 512; 36 ms for 12K tokens) must not
    stall the loop: on the loop it goes to a thread, and still switches the caches off on a mismatch."""
    pipeline = _pipeline()
    tokenizer = pipeline.tokenizer
    tokenizer.self_check_rate = 1.0
    checked_on: list[threading.Thread] = []
    check = tokenizer.self_check

    def recording_check(segments: Any, ids: list[int]) -> None:
        checked_on.append(threading.current_thread())
        check(segments, ids)

    tokenizer.self_check = recording_check  # type: ignore[method-assign]
    text = _text(50, "cached run")
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}

    async def scenario() -> tuple[threading.Thread, list[int], list[int]]:
        loop_thread = threading.current_thread()
        good = list((await pipeline.prepare_async(to_chat_request(body, CONFIG, "a"))).input_ids)
        # corrupt the run's cached ids, as a tokenizer bug would, and forget the prompt itself
        tokenizer.cache.put(text, (1, 2, 3))
        tokenizer.prefix_cache.clear()
        bad = list((await pipeline.prepare_async(to_chat_request(body, CONFIG, "b"))).input_ids)
        deadline = time.monotonic() + 30
        while len(checked_on) < 2 or tokenizer.cache.max_bytes != 0:
            assert time.monotonic() < deadline, "the self-checks did not run"
            await asyncio.sleep(0.01)
        return loop_thread, good, bad

    loop_thread, good, bad = asyncio.run(scenario())
    assert checked_on and all(t is not loop_thread for t in checked_on)
    assert bad != good  # served from the corrupt entry; the check then switched the caches off
    assert tokenizer.cache.max_bytes == 0 and tokenizer.prefix_cache.max_entries == 0
    again = pipeline.prepare(to_chat_request(body, CONFIG, "c"))
    assert list(again.input_ids) == good


def _held_until(gate: threading.Event) -> Any:
    """A batch function that keeps the batch thread busy until ``gate`` is set."""

    def hold(items: list[Any]) -> list[BaseException | None]:
        assert gate.wait(30), "the gate was never opened"
        return [None] * len(items)

    return hold


def test_cold_prompts_arriving_together_are_tokenized_in_one_call_each_with_its_own_ids() -> None:
    """Cold prompts queued while the batch thread is busy go to the tokenizer together; each request
    still gets exactly the ids a synchronous ``prepare`` gives, and a prompt whose text cannot be
    tokenized fails alone."""
    pipeline, reference = _pipeline(), _pipeline()
    calls: list[int] = []
    encode_arrays = pipeline.tokenizer._encode_arrays

    def counting_encode(texts: list[str], *, bulk: bool = False) -> list[array]:
        calls.append(len(texts))
        return encode_arrays(texts, bulk=bulk)

    pipeline.tokenizer._encode_arrays = counting_encode  # type: ignore[method-assign]
    bodies = [{"messages": [{"role": "user", "content": _text(1500, f"prompt {i}")}]} for i in range(12)]
    bad = {"messages": [{"role": "user", "content": _text(1500, "bad") + "\ud800"}]}

    async def scenario() -> list[PreparedRequest | BaseException]:
        gate = threading.Event()
        # hold the batch thread so that every prompt below queues behind this one
        held = asyncio.ensure_future(pipeline.offload.run_batched(_held_until(gate), 0, 1))
        await asyncio.sleep(0.05)
        tasks = [
            asyncio.ensure_future(pipeline.prepare_async(to_chat_request(body, CONFIG, f"r{i}")))
            for i, body in enumerate([*bodies[:6], bad, *bodies[6:]])
        ]
        await asyncio.sleep(0.2)
        gate.set()
        await held
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = asyncio.run(scenario())
    assert max(calls) >= 12, f"the cold prompts were tokenized in calls of {calls} texts"
    failed = results.pop(6)
    assert isinstance(failed, FormatError) and "surrogate" in failed.message
    for body, prepared in zip(bodies, results, strict=True):
        assert isinstance(prepared, PreparedRequest)
        expected = reference.prepare(to_chat_request(body, CONFIG, "ref"))
        assert prepared.input_ids == expected.input_ids


def test_a_batched_job_whose_caller_left_is_not_run() -> None:
    pool = OffloadPool(1)
    seen: list[list[int]] = []

    def record(items: list[int]) -> list[BaseException | None]:
        seen.append(items)
        return [None] * len(items)

    async def scenario() -> None:
        gate = threading.Event()
        held = asyncio.ensure_future(pool.run_batched(_held_until(gate), 0, 1))
        await asyncio.sleep(0.05)
        gone = asyncio.ensure_future(pool.run_batched(record, 1, 1))
        kept = asyncio.ensure_future(pool.run_batched(record, 2, 1))
        await asyncio.sleep(0.05)
        gone.cancel()
        gate.set()
        await held
        await kept
        deadline = time.monotonic() + 10
        while pool.pending:
            assert time.monotonic() < deadline, "a cancelled batched job was never counted done"
            await asyncio.sleep(0.01)

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
    assert seen == [[2]]


def _jobs(*weights_and_times: tuple[int, float]) -> list[BatchJob]:
    loop = asyncio.new_event_loop()
    try:
        return [
            BatchJob(loop, loop.create_future(), _held_until(threading.Event()), index, weight, queued_at)
            for index, (weight, queued_at) in enumerate(weights_and_times)
        ]
    finally:
        loop.close()


def _items(batch: list[BatchJob]) -> list[int]:
    return [job.item for job in batch]


def test_a_batch_takes_the_lightest_jobs_and_leaves_a_heavy_one_for_the_next() -> None:
    """An agent's follow-up (a few thousand new characters) is not made to wait for the cold prompts
    of new conversations queued before it; jobs of like weights still go together."""
    pending = _jobs((70, 0.0), (10, 0.0), (70, 0.0), (12, 0.0), (9, 0.0))
    assert _items(take_batch(pending, 1000, now=0.1, max_defer_s=1.0)) == [4, 1, 3]
    assert _items(pending) == [0, 2]  # in the order they came
    assert _items(take_batch(pending, 1000, now=0.1, max_defer_s=1.0)) == [0, 2]
    assert pending == []


def test_a_batch_of_like_jobs_stops_at_its_weight_bound_in_their_order() -> None:
    pending = _jobs(*[(100, 0.0)] * 10)
    assert _items(take_batch(pending, 350, now=0.0, max_defer_s=1.0)) == [0, 1, 2, 3]
    heavy = _jobs((5000, 0.0))
    assert _items(take_batch(heavy, 350, now=0.0, max_defer_s=1.0)) == [0]  # heavier than the bound: alone


def test_a_job_passed_over_for_long_goes_first() -> None:
    pending = _jobs((10, 0.9), (70, 0.0), (9, 0.95))
    batch = take_batch(pending, 1000, now=1.0, max_defer_s=0.5)
    assert _items(batch)[0] == 1  # waited 1 s behind lighter jobs: first now, the light ones after it
    assert sorted(_items(batch)) == [0, 1, 2] and pending == []


def test_light_jobs_queued_behind_a_heavy_one_run_before_it() -> None:
    pool = OffloadPool(1, batch_max_defer_s=30.0)
    batches: list[list[str]] = []

    def record(items: list[str]) -> list[BaseException | None]:
        batches.append(items)
        return [None] * len(items)

    async def scenario() -> None:
        gate = threading.Event()
        held = asyncio.ensure_future(pool.run_batched(_held_until(gate), "held", 1))
        await asyncio.sleep(0.05)
        jobs = [asyncio.ensure_future(pool.run_batched(record, "cold prompt", 70_000))]
        jobs += [asyncio.ensure_future(pool.run_batched(record, f"follow-up {i}", 10_000)) for i in range(3)]
        await asyncio.sleep(0.05)
        gate.set()
        await held
        await asyncio.wait_for(asyncio.gather(*jobs), 30)

    try:
        asyncio.run(scenario())
    finally:
        pool.close()
    assert batches == [["follow-up 0", "follow-up 1", "follow-up 2"], ["cold prompt"]]
