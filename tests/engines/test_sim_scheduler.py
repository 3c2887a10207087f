"""The simulated engine's running batch and priority scheduling, as SGLang's (engine-facts E1):
queue order, the priority a request gets, preemption past the threshold, a full queue, and what a
preempted stream looks like to its client."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest

from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.scheduler import (
    PREEMPTED_FROM_QUEUE_MESSAGE,
    PRIORITY_DISABLED_MESSAGE,
    QUEUE_FULL_MESSAGE,
    QueueAbortError,
    SchedulerSettings,
    SimScheduler,
    Ticket,
)
from deepseek_frontend.engines.sim.server import build_sim_app
from deepseek_frontend.generation import GenerateRequest, SamplingParams

from .conftest import collect, prompt_ids, serve_app, wait_until

PRIORITY = SchedulerSettings(max_running_requests=1, enable_priority_scheduling=True)


def scenario(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(body(), 30))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def queue_behind_one(scheduler: SimScheduler, priorities: list[int | None]) -> list[asyncio.Task[bool]]:
    """One request holding the batch's only place, then one waiting request per priority, in order
    (each named by its index); the tasks of the waiting ones."""
    holder = scheduler.ticket("holder", 0)
    assert await scheduler.admit(holder)
    tasks = []
    for i, priority in enumerate(priorities):
        tasks.append(asyncio.create_task(scheduler.admit(scheduler.ticket(f"r{i}", priority))))
        await settle()
    assert scheduler.waiting == len(priorities)
    scheduler.admitted.clear()
    return tasks


async def drain(scheduler: SimScheduler, count: int) -> list[str]:
    """Finish the running request ``count + 1`` times over; the order the waiting ones ran in."""
    for _ in range(count + 1):
        (running,) = scheduler.running
        scheduler.release(running)
        await settle()
    return list(scheduler.admitted)


def test_without_priority_scheduling_the_queue_is_first_come_first_served() -> None:
    async def body() -> list[str]:
        scheduler = SimScheduler(SchedulerSettings(max_running_requests=1))
        await queue_behind_one(scheduler, [1, 100, None, 50])
        return await drain(scheduler, 3)

    assert scenario(body) == ["r0", "r1", "r2", "r3"]


def test_with_priority_scheduling_the_queue_runs_by_priority_then_arrival() -> None:
    async def body() -> list[str]:
        scheduler = SimScheduler(PRIORITY)
        await queue_behind_one(scheduler, [1, 1, 10, 1, 5])
        return await drain(scheduler, 4)

    assert scenario(body) == ["r2", "r4", "r0", "r1", "r3"]


def test_low_priority_values_first_flips_the_order() -> None:
    async def body() -> list[str]:
        settings = SchedulerSettings(
            max_running_requests=1, enable_priority_scheduling=True, schedule_low_priority_values_first=True
        )
        scheduler = SimScheduler(settings)
        await queue_behind_one(scheduler, [1, 1, 10, 1, 5])
        return await drain(scheduler, 4)

    assert scenario(body) == ["r0", "r1", "r3", "r4", "r2"]


def test_a_request_without_a_priority_gets_the_default_value_or_else_the_least_preferred() -> None:
    high_first = SimScheduler(PRIORITY)
    assert high_first.ticket("a", None).priority == -sys.maxsize - 1
    low_first = SimScheduler(
        SchedulerSettings(enable_priority_scheduling=True, schedule_low_priority_values_first=True)
    )
    assert low_first.ticket("a", None).priority == sys.maxsize
    defaulted = SimScheduler(SchedulerSettings(enable_priority_scheduling=True, default_priority_value=3))
    assert defaulted.ticket("a", None).priority == 3
    assert defaulted.ticket("a", 7).priority == 7


def test_a_priority_sent_to_a_worker_without_priority_scheduling_is_ignored_or_aborted() -> None:
    assert SimScheduler(SchedulerSettings(max_running_requests=1)).ticket("a", 99).priority == 0
    strict = SimScheduler(SchedulerSettings(abort_on_priority_when_disabled=True))
    with pytest.raises(QueueAbortError) as refused:
        strict.ticket("a", 99)
    assert refused.value.status_code == 503 and refused.value.message == PRIORITY_DISABLED_MESSAGE
    assert strict.ticket("b", None).priority == 0  # no priority: served as ever


async def decoding(scheduler: SimScheduler, rid: str, priority: int) -> Ticket:
    ticket = scheduler.ticket(rid, priority)
    assert await scheduler.admit(ticket)
    ticket.decoding = True
    return ticket


def test_a_running_request_is_preempted_only_by_a_priority_more_than_the_threshold_above() -> None:
    async def body() -> tuple[bool, bool, list[str], int]:
        scheduler = SimScheduler(PRIORITY)
        low = await decoding(scheduler, "low", 0)
        # 10 above: not more than the threshold (10), so it waits
        level = asyncio.create_task(scheduler.admit(scheduler.ticket("level", 10)))
        await settle()
        after_level = low.preempted
        # 11 above: the running request gives up its place at once
        urgent = asyncio.create_task(scheduler.admit(scheduler.ticket("urgent", 11)))
        await settle()
        assert urgent.done() and urgent.result() is True and not level.done()
        # the preempted request is back in the queue, behind the one of priority 10
        scheduler.release(next(iter(scheduler.running)))
        await settle()
        return after_level, low.preempted, list(scheduler.admitted), scheduler.preempted

    after_level, preempted, admitted, count = scenario(body)
    assert after_level is False and preempted is True and count == 1
    assert admitted == ["low", "urgent", "level"]


def test_a_request_still_in_its_prefill_or_with_preemption_disabled_is_not_preempted() -> None:
    async def body(settings: SchedulerSettings, decoding_first: bool) -> bool:
        scheduler = SimScheduler(settings)
        low = scheduler.ticket("low", 0)
        assert await scheduler.admit(low)
        low.decoding = decoding_first
        urgent = asyncio.create_task(scheduler.admit(scheduler.ticket("urgent", 1000)))
        await settle()
        urgent.cancel()
        return low.preempted

    disabled = SchedulerSettings(
        max_running_requests=1, enable_priority_scheduling=True, disable_priority_preemption=True
    )
    assert scenario(lambda: body(PRIORITY, False)) is False
    assert scenario(lambda: body(disabled, True)) is False
    assert scenario(lambda: body(PRIORITY, True)) is True


async def full_queue_then(settings: SchedulerSettings, arriving: int) -> tuple[str, str]:
    """A full queue of priorities 5, 1, 1 behind a running request, then an arrival at ``arriving``:
    who was aborted (the arrival, or the waiter it displaced) and with what message."""
    scheduler = SimScheduler(settings)
    tasks = await queue_behind_one(scheduler, [5, 1, 1])
    late = asyncio.create_task(scheduler.admit(scheduler.ticket("late", arriving)))
    await settle()
    if late.done():
        with pytest.raises(QueueAbortError) as refused:
            late.result()
        return "late", refused.value.message
    (aborted,) = [i for i, task in enumerate(tasks) if task.done()]
    with pytest.raises(QueueAbortError) as refused:
        tasks[aborted].result()
    assert scheduler.waiting == 3  # the arrival took its place
    late.cancel()
    return f"r{aborted}", refused.value.message


def test_a_full_queue_aborts_the_arrival_or_with_priorities_the_least_preferred_waiter() -> None:
    fcfs = SchedulerSettings(max_running_requests=1, max_queued_requests=3)
    assert scenario(lambda: full_queue_then(fcfs, 100)) == ("late", QUEUE_FULL_MESSAGE)
    by_priority = dataclasses.replace(fcfs, enable_priority_scheduling=True)
    # strictly better than the least preferred (priority 1; the newer of the two goes)
    assert scenario(lambda: full_queue_then(by_priority, 2)) == ("r2", PREEMPTED_FROM_QUEUE_MESSAGE)
    # no better: the arrival is refused
    assert scenario(lambda: full_queue_then(by_priority, 1)) == ("late", QUEUE_FULL_MESSAGE)


def test_an_abort_takes_a_waiting_request_out_of_the_queue_at_once() -> None:
    async def body() -> tuple[bool, int, list[str]]:
        scheduler = SimScheduler(PRIORITY)
        (first, _second) = await queue_behind_one(scheduler, [1, 1])
        assert scheduler.abort("r0") and not scheduler.abort("nobody")
        await settle()
        result = first.result()
        return result, scheduler.waiting, await drain(scheduler, 1)

    assert scenario(body) == (False, 1, ["r1"])


# ------------------------------------------------------------------------------ the engine


def engine_with(prompt_tokenizer: Any, settings: SchedulerSettings, itl_ms: float = 2.0) -> SimulatedEngine:
    return SimulatedEngine(prompt_tokenizer, itl_ms=itl_ms, scheduling=settings)


def request(rid: str, priority: int | None, max_new_tokens: int = 60) -> GenerateRequest:
    ids = prompt_ids("Tell me about the sea and the ships on it, at length")
    return GenerateRequest(
        rid, ids, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True), priority=priority
    )


def test_a_preempted_stream_pauses_while_the_urgent_one_runs_then_writes_its_whole_answer(
    prompt_tokenizer: Any,
) -> None:
    async def body() -> tuple[list[int], list[int], list[str], int]:
        alone, _ = await collect(SimulatedEngine(prompt_tokenizer), request("low", 0))
        engine = engine_with(prompt_tokenizer, PRIORITY)
        order: list[str] = []
        low_ids: list[int] = []

        async def low() -> None:
            async for chunk in engine.generate(request("low", 0)):
                low_ids.extend(chunk.token_ids)
                order.append("low")

        async def urgent() -> None:
            async for _chunk in engine.generate(request("urgent", 100, max_new_tokens=10)):
                order.append("urgent")

        low_task = asyncio.create_task(low())
        await wait_until(lambda: len(order) >= 5)
        await urgent()
        await low_task
        assert engine.scheduler is not None
        return alone, low_ids, order, engine.scheduler.preempted

    alone, low_ids, order, preempted = scenario(body)
    assert preempted == 1
    # once the urgent request ran, the low one wrote nothing until it was done
    first_urgent = order.index("urgent")
    last_urgent = len(order) - 1 - order[::-1].index("urgent")
    assert set(order[first_urgent : last_urgent + 1]) == {"urgent"}
    assert low_ids == alone  # nothing lost, nothing repeated


def test_the_sim_server_reports_its_scheduling_and_queues_with_its_headers_sent(
    prompt_tokenizer: Any,
) -> None:
    settings = SchedulerSettings(
        max_running_requests=1, enable_priority_scheduling=True, max_queued_requests=1
    )
    engine = engine_with(prompt_tokenizer, settings, itl_ms=5.0)
    ids = prompt_ids("Tell me about the sea")

    def body_of(rid: str, priority: Any, max_new: int = 400) -> bytes:
        payload = {
            "rid": rid,
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True},
            "stream": True,
            "priority": priority,
        }
        return orjson.dumps(payload)

    async def body() -> None:
        async with (
            serve_app(build_sim_app(engine)) as url,
            httpx.AsyncClient(base_url=url, timeout=20) as http,
        ):
            info = (await http.get("/server_info")).json()
            assert info["enable_priority_scheduling"] is True and info["max_running_requests"] == 1
            assert info["priority_scheduling_preemption_threshold"] == 10
            assert info["schedule_low_priority_values_first"] is False
            assert info["abort_on_priority_when_disabled"] is False
            bad = await http.post("/generate", content=body_of("bad", "high"))
            assert bad.status_code == 400 and "priority" in bad.text
            async with http.stream("POST", "/generate", content=body_of("holder", 5)) as holder:
                assert holder.status_code == 200
                await wait_until(lambda: engine.scheduler is not None and len(engine.scheduler.running) == 1)
                # the batch is full: the next request has its headers at once, and waits
                async with http.stream("POST", "/generate", content=body_of("waiter", 1)) as waiter:
                    assert waiter.status_code == 200
                    await wait_until(lambda: engine.stats.waiting == 1)
                    load = (await http.get("/get_load")).json()
                    assert load == {"num_reqs": 1, "num_waiting_reqs": 1}
                    # a better arrival at the full queue takes the waiter's place: its stream ends
                    # with SGLang's abort finish
                    async with http.stream("POST", "/generate", content=body_of("better", 3, 5)) as better:
                        lines = [line async for line in waiter.aiter_lines() if line.startswith("data:")]
                        await better.aclose()
                    finish = orjson.loads(lines[0][5:])["meta_info"]["finish_reason"]
                    assert finish == {
                        "type": "abort",
                        "message": PREEMPTED_FROM_QUEUE_MESSAGE,
                        "status_code": 503,
                    }
                    assert lines[-1] == "data: [DONE]"

    scenario(body)
