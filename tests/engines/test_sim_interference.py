"""Prefill interference on an aggregated simulated worker: a long prompt holds everyone's decode steps.

A real engine runs a prefill batch instead of a decode step (SGLang schedules a waiting prefill
first), chunk by chunk (``--chunked-prefill-size``): while a long prompt is prefilled, no other
stream on the worker gets a token. The engine's own accounting (``/sim/stats``) says how many
chunks held decoding streams and for how long; the clock's own guarantee is checked on the event
loop's clock (a step boundary can never fall inside a hold).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from deepseek_frontend.engines.sim.clock import StepClock
from tests.support.servers import start_sim_engine

from .conftest import prompt_ids

US_PER_TOKEN = 100.0
CHUNK = 1024
#: the decoding stream's length: 2 s at 5 ms a step, the long prompt's prefill about 0.6 s of it
TOKENS = 400


def test_a_hold_lets_the_step_in_progress_finish_then_moves_the_next_past_its_end() -> None:
    async def scenario() -> tuple[float, float, float, int, int]:
        loop = asyncio.get_running_loop()
        clock = StepClock(0.01)
        await clock.next_step()
        before = clock.steps()
        start = loop.time()
        in_progress = clock.next_step()
        delay = clock.hold(0.05)  # a prefill arrives while streams wait for a step
        await in_progress
        await clock.next_step()
        after_hold = loop.time() - start
        # a step that rides on the hold (mixed chunk) completes at its end, not a period later
        start = loop.time()
        waiter = clock.next_step()
        assert clock.hold(0.03, carries_step=True) == 0.0
        await waiter
        return delay, after_hold, loop.time() - start, before, clock.steps()

    delay, after_hold, carried, before, after = asyncio.run(scenario())
    slack = 1e-3  # the loop may run a timer this early
    assert 0 < delay <= 0.01, "the prefill waits for the step in progress, at most a period"
    assert after_hold >= delay + 0.05 + 0.01 - slack, "no step inside the hold; the next a period after it"
    assert carried >= 0.03 - slack
    assert after == before + 3


def _long_prompt() -> list[int]:
    ids = prompt_ids("Summarise: " + "The quick brown fox jumps over the lazy dog. " * 500)
    assert len(ids) > 4 * CHUNK
    return ids


@pytest.mark.parametrize("mixed", [False, True])
def test_a_long_prefill_holds_the_other_streams_decode_steps_chunk_by_chunk(mixed: bool) -> None:
    flags = ["--itl-ms", "5", "--kv-cache-tokens", "1000000", "--prefill-us-per-token", str(US_PER_TOKEN)]
    flags += ["--chunked-prefill-size", str(CHUNK)]
    if mixed:
        flags.append("--enable-mixed-chunk")
    long = _long_prompt()
    decoding = {
        "input_ids": prompt_ids("Write a long story"),
        "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True},
        "stream": True,
    }
    with start_sim_engine(*flags) as server:

        async def scenario() -> tuple[list[int], dict[str, Any]]:
            async with httpx.AsyncClient(timeout=120) as client:
                ids: list[int] = []
                prefill: asyncio.Future[Any] | None = None
                async with client.stream("POST", server.url + "/generate", json=decoding) as stream:
                    async for line in stream.aiter_lines():
                        if not line.startswith("data: {"):
                            continue
                        ids.extend(json.loads(line[6:])["output_ids"])
                        if prefill is None:  # the stream is decoding: now a long prompt arrives
                            body = {"input_ids": long, "sampling_params": {"max_new_tokens": 1}}
                            prefill = asyncio.ensure_future(client.post(server.url + "/generate", json=body))
                assert prefill is not None
                assert (await prefill).status_code == 200
                return ids, (await client.get(server.url + "/sim/stats")).json()

        ids, stats = asyncio.run(scenario())
    chunks = -(-len(long) // CHUNK)
    assert stats["prefill_chunks"] == 1 + chunks, "the decoding stream's own prompt was one chunk"
    assert stats["prefill_chunks_holding_decode"] == chunks
    assert stats["decode_held_ms"] == pytest.approx(len(long) * US_PER_TOKEN / 1000, rel=1e-3)
    assert len(ids) == TOKENS, "held, not cut short"
