"""A request's priority on the wire (engine-facts E1, E2): SGLang's ``priority`` only to a worker whose
``/server_info`` says it schedules by priority (sign flipped for low-values-first), never otherwise;
vLLM's negated (lower runs earlier), left out for 0 and for a worker known to run fcfs; and the
simulated engine, started with priority scheduling, serving the frontend's SGLang client by it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson

from deepseek_frontend.engines.sglang import SGLangClient, capabilities_from_server_info
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.scheduler import SchedulerSettings
from deepseek_frontend.engines.sim.server import build_sim_app
from deepseek_frontend.generation import LOWEST_PRIORITY, engine_rid
from deepseek_frontend.routing.migration import continuation

from .conftest import collect, prompt_ids, request_for, serve_app, wait_until
from .test_vllm_client import fake_vllm_032, gen_chunk, sse

SGLANG_PRIORITY_INFO = {
    "enable_priority_scheduling": True,
    "schedule_low_priority_values_first": False,
    "priority_scheduling_preemption_threshold": 10,
    "disable_priority_preemption": False,
    "default_priority_value": None,
    "abort_on_priority_when_disabled": False,
    "schedule_policy": "fcfs",
}


def with_priority(priority: int | None) -> Any:
    return dataclasses.replace(request_for([1, 2, 3]), priority=priority)


def test_sglang_capabilities_say_how_a_worker_orders_priorities() -> None:
    assert capabilities_from_server_info({}).priority_order is None
    off = {**SGLANG_PRIORITY_INFO, "enable_priority_scheduling": False}
    assert capabilities_from_server_info(off).priority_order is None
    on = capabilities_from_server_info(SGLANG_PRIORITY_INFO)
    assert on.priority_order == "high_first"
    assert on.extra["priority_scheduling_preemption_threshold"] == 10
    flipped = {**SGLANG_PRIORITY_INFO, "schedule_low_priority_values_first": True}
    assert capabilities_from_server_info(flipped).priority_order == "low_first"


def test_sglang_gets_a_priority_only_when_it_schedules_by_it_and_with_its_sign() -> None:
    assert "priority" not in SGLangClient.request_body(with_priority(10))
    assert "priority" not in SGLangClient.request_body(with_priority(10), None)
    assert SGLangClient.request_body(with_priority(10), "high_first")["priority"] == 10
    assert SGLangClient.request_body(with_priority(10), "low_first")["priority"] == -10
    # a batch line: the lowest there is, still a signed 64-bit integer after the flip
    assert SGLangClient.request_body(with_priority(LOWEST_PRIORITY), "low_first")["priority"] == 1 << 31
    # with priority scheduling on, SGLang puts a request without one last: ours never go without
    assert SGLangClient.request_body(with_priority(None), "high_first")["priority"] == 0


def test_a_continuation_keeps_its_priority() -> None:
    assert continuation(with_priority(7), [5, 6], 1).priority == 7


def vllm_run(server_info: dict | None, priority: int | None, *, token_api: bool = True) -> dict:
    chunks = [sse(gen_chunk([1], "stop")), b"data: [DONE]\n\n"]
    app = fake_vllm_032(chunks, server_info=server_info, token_api_status=None if token_api else 404)

    async def body() -> dict:
        from deepseek_frontend.engines.vllm import VLLMClient

        async with serve_app(app) as url:
            client = VLLMClient(url, model="deepseek-v4")
            try:
                await client.discover()
                await collect(client, with_priority(priority))
            finally:
                await client.aclose()
        return app.state.seen["body"]

    return asyncio.run(body())


def policy(name: str) -> dict:
    return {"vllm_config": {"scheduler_config": {"policy": name}}}


def test_vllm_gets_the_negated_priority_unless_it_is_0_or_the_worker_runs_fcfs() -> None:
    # priority policy: lower values run first, so the frontend's 10 goes out as -10
    assert vllm_run(policy("priority"), 10)["priority"] == -10
    assert vllm_run(policy("priority"), 10, token_api=False)["priority"] == -10  # /v1/completions too
    assert "priority" not in vllm_run(policy("priority"), 0)
    assert "priority" not in vllm_run(policy("fcfs"), 10)
    # policy unknown (no VLLM_SERVER_DEV_MODE): vLLM 0.32 / 0.33 take it and ignore it under fcfs
    assert vllm_run(None, LOWEST_PRIORITY)["priority"] == 1 << 31


def test_the_sim_engine_with_priority_scheduling_serves_the_sglang_client_by_priority(
    prompt_tokenizer: Any,
) -> None:
    """One place in the batch, held; then a default-priority request and a more important one: the
    frontend's client reads /server_info, sends each priority, and the more important one runs
    first although it came second."""
    settings = SchedulerSettings(max_running_requests=1, enable_priority_scheduling=True)
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=2.0, scheduling=settings)
    ids = prompt_ids("Tell me about the sea")

    def req(rid: str, priority: int, max_new: int = 8) -> Any:
        return dataclasses.replace(
            request_for(ids, rid=rid, max_new_tokens=max_new, ignore_eos=True), priority=priority
        )

    async def body() -> tuple[list[str], Any]:
        async with serve_app(build_sim_app(engine)) as url:
            client = SGLangClient(url)
            try:
                caps = await client.discover()
                holder = asyncio.create_task(collect(client, req("holder", 0, 200)))
                await wait_until(lambda: engine.scheduler is not None and len(engine.scheduler.running) == 1)
                first = asyncio.create_task(collect(client, req("default", 0)))
                await wait_until(lambda: engine.stats.waiting == 1)
                second = asyncio.create_task(collect(client, req("urgent", 5)))
                await wait_until(lambda: engine.stats.waiting == 2)
                await asyncio.gather(holder, first, second)
            finally:
                await client.aclose()
        assert engine.scheduler is not None
        return list(engine.scheduler.admitted), caps

    admitted, caps = asyncio.run(asyncio.wait_for(body(), 30))
    assert caps.priority_order == "high_first"
    assert admitted == [engine_rid(r) for r in ("holder", "urgent", "default")]


def test_the_sim_engine_aborts_a_priority_it_takes_none_of_as_sglang_does(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(
        prompt_tokenizer, scheduling=SchedulerSettings(abort_on_priority_when_disabled=True)
    )
    ids = prompt_ids("Tell me about the sea")

    async def body() -> list[dict]:
        import httpx

        async with serve_app(build_sim_app(engine)) as url, httpx.AsyncClient(base_url=url) as http:
            payload = {
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": 4},
                "stream": True,
                "priority": 1,
            }
            answer = await http.post("/generate", content=orjson.dumps(payload))
            return [orjson.loads(line[5:]) for line in answer.text.splitlines() if line.startswith("data: {")]

    (event,) = asyncio.run(body())
    assert event["meta_info"]["finish_reason"]["status_code"] == 503
    assert "priority is disabled" in event["meta_info"]["finish_reason"]["message"]
