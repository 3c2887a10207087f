"""The simulated engine's KV cache model (engines/sim/kv.py): cached prefixes, LRU eviction, prefill cost."""

from __future__ import annotations

import asyncio
import random

import pytest

import deepseek_frontend.engines.sim.kv as sim_kv
from deepseek_frontend.engines.sim.kv import SimKvCache, kv_cache_from_args, parse_kv_events_config
from deepseek_frontend.engines.sim.resume import split_continuation

PAGE = 16


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100_000) for _ in range(n)]


def test_a_repeated_prefix_is_cached_in_whole_pages_but_never_the_last_token() -> None:
    cache = SimKvCache(PAGE * 100, page_size=PAGE)
    prompt = ids(PAGE * 4 + 5, 1)
    assert cache.insert(prompt) == 0
    assert cache.lookup([*prompt, *ids(30, 2)]) == PAGE * 4
    assert cache.insert(prompt[: PAGE * 4]) == PAGE * 4 - 1, "the last token is always computed"
    assert cache.lookup(ids(PAGE * 4, 3)) == 0


def test_eviction_takes_the_least_recently_used_leaves_first() -> None:
    cache = SimKvCache(PAGE * 8, page_size=PAGE)
    shared = ids(PAGE * 2, 1)
    a = [*shared, *ids(PAGE * 3, 2)]
    b = [*shared, *ids(PAGE * 3, 3)]
    cache.insert(a)
    cache.insert(b)  # 8 pages: full
    cache.insert([*shared, *ids(PAGE * 2, 4)])  # 2 new pages: a's two deepest pages go
    assert cache.lookup([*a, 0]) == PAGE * 3, "a lost its leaves, kept its prefix"
    assert cache.lookup([*b, 0]) == PAGE * 5
    assert cache.used_tokens == PAGE * 8 and cache.evicted_pages == 2


def test_prefill_time_is_proportional_to_the_uncached_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []

    async def record(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr(sim_kv.asyncio, "sleep", record)
    cache = SimKvCache(PAGE * 100, page_size=PAGE, prefill_us_per_token=10.0)
    prompt = ids(PAGE * 10, 1)

    async def scenario() -> tuple[int, int]:
        first = await cache.prefill(prompt, 0.002)
        second = await cache.prefill([*prompt, *ids(PAGE, 2)])
        return first, second

    first, second = asyncio.run(scenario())
    assert (first, second) == (0, PAGE * 10)
    assert slept == [pytest.approx(0.002 + PAGE * 10 * 10e-6), pytest.approx(PAGE * 10e-6)]
    assert cache.stats()["kv_cached_tokens"] == PAGE * 10


def test_the_kv_events_config_is_read_like_sglang_reads_it() -> None:
    assert parse_kv_events_config('{"publisher": "zmq", "endpoint": "tcp://*:1"}')["publisher"] == "zmq"
    for bad, message in (
        ("{", "not JSON"),
        ("[]", "JSON object"),
        ('{"publisher": "kafka"}', "publisher"),
        ('{"endpoint": 5}', "endpoint"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_kv_events_config(bad)


def test_cache_flags_need_a_cache_size() -> None:
    class Args:
        kv_cache_tokens = None
        kv_events_config = '{"publisher": "zmq"}'
        prefill_us_per_token = 0.0
        kv_page_size = PAGE

    with pytest.raises(ValueError, match="--kv-cache-tokens"):
        kv_cache_from_args(Args())
    Args.kv_events_config = None
    assert kv_cache_from_args(Args()) is None


def test_a_prompt_that_continues_the_models_own_answer_is_recognised() -> None:
    assistant = 7
    prompt = [1, 2, 3, assistant, 9]  # ... <｜Assistant｜><think>
    plan = [40, 41, 42, 43, 2]

    def planner(p: object) -> list[int]:
        assert list(p) == prompt  # type: ignore[arg-type]
        return plan

    assert split_continuation([*prompt, 40, 41], assistant, planner) == (2, plan)
    assert split_continuation([*prompt, 40, 99], assistant, planner) is None, "not its own output"
    assert split_continuation(prompt, assistant, planner) is None, "a plain prompt"
    assert split_continuation([1, 2], assistant, planner) is None


# ----------------------------------------------------------------------- DeepSeek-V4's sliding window


def swa_cache(pages: int = 100, ratio: float = 0.5) -> SimKvCache:
    # a 16-token page with an 8-token window: one live page before a boundary is a live window
    return SimKvCache(PAGE * pages, page_size=PAGE, swa_ratio=ratio, window=8)


def test_a_follow_up_that_extends_prompt_and_output_hits_at_the_live_tail() -> None:
    cache = swa_cache()
    prompt, output = ids(PAGE * 4 + 3, 1), ids(PAGE * 6, 2)
    cache.insert(prompt)  # after its prefill: the prompt's pages have live SWA
    cache.finished([*prompt, *output], len(prompt))
    follow_up = [*prompt, *output, *ids(PAGE * 2, 3)]
    # the whole sequence is in the full cache, and its last page (the tail) is live
    assert cache.lookup(follow_up) == (len(prompt) + len(output)) // PAGE * PAGE


def test_a_prompt_that_leaves_the_output_early_falls_back_to_the_prompts_end() -> None:
    """The output's SWA is tombstoned except its tail: a match ending inside it does not hit, the
    prompt's last page boundary does (SGLang's SWA validator)."""
    cache = swa_cache()
    prompt, output = ids(PAGE * 4, 1), ids(PAGE * 6, 2)
    cache.insert(prompt)
    cache.finished([*prompt, *output], len(prompt))
    diverging = [*prompt, *output[: PAGE * 3], *ids(PAGE * 3, 4)]  # edits the output's fourth page
    assert cache.lookup(diverging) == PAGE * 4
    plain = SimKvCache(PAGE * 100, page_size=PAGE)  # without the SWA model the full prefix would hit
    plain.insert(prompt)
    plain.finished([*prompt, *output], len(prompt))
    assert plain.lookup(diverging) == PAGE * 7


def test_sliding_window_eviction_drops_hits_while_the_full_pages_stay() -> None:
    cache = swa_cache(pages=100, ratio=0.1)  # 10 pages of live window
    first = ids(PAGE * 6, 1)
    cache.insert(first)
    assert cache.lookup([*first, 1]) == PAGE * 6
    for n in range(3):  # 12 more live pages: the first prompt's window goes
        cache.insert(ids(PAGE * 4, 10 + n))
    assert cache.used_tokens == PAGE * 18, "no full page was evicted"
    assert cache.lookup([*first, 1]) == 0
    assert cache.stats()["kv_swa_live_tokens"] == PAGE * 10


def test_prompt_events_go_out_after_the_prefill_and_a_finished_requests_at_the_next_flush() -> None:
    published: list[list[object]] = []

    class Recorder:
        def publish(self, events: list[object]) -> None:
            published.append(list(events))

    async def scenario() -> None:
        cache = SimKvCache(PAGE * 100, page_size=PAGE, prefill_us_per_token=100.0, flush_s=60.0)
        cache.publisher = Recorder()  # type: ignore[assignment]
        prompt = ids(PAGE * 10, 1)
        task = asyncio.create_task(cache.prefill(prompt))
        await asyncio.sleep(0.005)  # the prefill (16 ms) is under way
        assert published == [], "SGLang publishes a prompt's blocks after its prefill batch"
        await task
        assert len(published) == 1
        cache.finished([*prompt, *ids(PAGE * 2, 2)], len(prompt))
        assert len(published) == 1, "a finished request's blocks wait for a flush"
        await cache.prefill(ids(PAGE, 3))  # the next prefill batch flushes them with its own
        assert len(published) == 2 and len(published[1]) == 2

    asyncio.run(scenario())
