"""Priorities, service tiers and deadlines, as a client sees them (edge/priority.py, fleet/admission.py).

Each scenario serves one model with one request slot (``max_concurrent_requests`` 1) over real HTTP,
and holds the slot with a request the engine keeps waiting until the test lets it go, so what queues
behind it, and in which order it is served, is the test's to decide -- no timing involved.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from deepseek_frontend.api.batches.execute import BATCH_PRIORITY, call_route
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServingLimits
from deepseek_frontend.fleet.config_file import Fleet
from deepseek_frontend.generation import GenerateRequest
from deepseek_frontend.keys.tenants import TenantTable
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer
from tests.engines.conftest import serve_app
from tests.support.engine import ScriptedEngine

MODEL = "deepseek-v4-flash"
#: the priority of the request that holds the slot: the gated engine keeps it until released
HOLD = 999
CHAT = "/v1/chat/completions"


@dataclass(eq=False)
class GatedEngine(ScriptedEngine):
    """The scripted engine, but a request at priority :data:`HOLD` waits for :attr:`gate` first."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    #: the requests waiting at the gate (or that did)
    held: list[GenerateRequest] = field(default_factory=list)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Any]:
        if request.priority == HOLD:
            self.held.append(request)
            await self.gate.wait()
        async for chunk in super().generate(request):
            yield chunk


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """``app`` on a free localhost port in this event loop (its lifespan run); a client for it."""
    async with serve_app(app, lifespan=True) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield client


def config(max_queued: int = 16) -> ServerConfig:
    limits = ServingLimits(max_concurrent_requests=1, max_queued_requests=max_queued, queue_timeout=30)
    return ServerConfig(ModelConfig(served_model_name=MODEL, context_length=8192), limits=limits)


def chat(content: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 16, **fields}


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (bounded by the scenario's own timeout)."""
    while not condition():
        await asyncio.sleep(0.005)
    del what


def run(body: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(body(), 60))


class Scene:
    """A served app with its gated engine, and the admission queue of its one model."""

    def __init__(
        self, prompt_tokenizer: PromptTokenizer, cfg: ServerConfig, fleet: Fleet | None = None
    ) -> None:
        self.engine = GatedEngine(prompt_tokenizer, pieces=["Hello", " there"])
        self.app = create_app(cfg, tokenizer=prompt_tokenizer, backend=self.engine, fleet=fleet)

    @property
    def admission(self) -> Any:
        return self.app.frontend.models.only.admission

    async def hold(
        self, client: httpx.AsyncClient, headers: dict[str, str] | None = None
    ) -> asyncio.Task[Any]:
        """Take the one slot with a request the engine keeps until :meth:`release`."""
        task = asyncio.create_task(
            client.post(CHAT, json=chat("hold"), headers={"x-request-priority": str(HOLD), **(headers or {})})
        )
        await until(lambda: bool(self.engine.held), "the holder reached the engine")
        return task

    async def queue(
        self, client: httpx.AsyncClient, body: dict[str, Any], **headers: str
    ) -> asyncio.Task[Any]:
        """Send a request and wait until it waits in the queue."""
        before = self.admission.queued
        task = asyncio.create_task(client.post(CHAT, json=body, headers=headers))
        await until(lambda: self.admission.queued > before or task.done(), "the request queued")
        return task

    def release(self) -> None:
        self.engine.gate.set()


def served_order(scene: Scene) -> list[int | None]:
    """The priorities of the requests the engine got, in the order it got them (the holder left out)."""
    return [r.priority for r in scene.engine.requests if r.priority != HOLD]


# ------------------------------------------------------------------------------ order


def test_a_more_important_request_goes_ahead_of_the_ones_queued_before_it(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    scene = Scene(prompt_tokenizer, config())

    async def body() -> list[int | None]:
        async with serving(scene.app) as client:
            holder = await scene.hold(client)
            low = [
                await scene.queue(client, chat(f"low {i}"), **{"x-request-priority": "1"}) for i in range(4)
            ]
            high = await scene.queue(client, chat("high"), **{"x-request-priority": "10"})
            scene.release()
            for answer in await asyncio.gather(holder, *low, high):
                assert answer.status_code == 200
        return served_order(scene)

    assert run(body) == [10, 1, 1, 1, 1]


def test_dynamos_priority_header_and_service_tiers_order_the_queue_too(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    scene = Scene(prompt_tokenizer, config())

    async def body() -> list[int | None]:
        async with serving(scene.app) as client:
            holder = await scene.hold(client)
            queued = [
                await scene.queue(client, chat(service_tier="flex")),
                await scene.queue(client, chat()),
                await scene.queue(client, chat(service_tier="auto")),
                await scene.queue(client, chat(service_tier="priority")),
                await scene.queue(client, chat(), **{"x-dynamo-request-priority": "50"}),
            ]
            scene.release()
            await asyncio.gather(holder, *queued)
        return served_order(scene)

    assert run(body) == [50, 10, 0, 0, -10]


def test_within_a_priority_the_earlier_deadline_goes_first(prompt_tokenizer: PromptTokenizer) -> None:
    scene = Scene(prompt_tokenizer, config())

    async def body() -> list[str]:
        async with serving(scene.app) as client:
            holder = await scene.hold(client)
            queued = [
                await scene.queue(client, chat("none")),
                await scene.queue(client, chat("late"), **{"x-request-timeout-ms": "25000"}),
                await scene.queue(client, chat("soon"), **{"x-request-timeout-ms": "20000"}),
            ]
            scene.release()
            await asyncio.gather(holder, *queued)
        texts = [prompt_tokenizer.decode(r.input_ids) for r in scene.engine.requests if r.priority != HOLD]
        return [next(word for word in ("none", "late", "soon") if word in text) for text in texts]

    assert run(body) == ["soon", "late", "none"]


# ------------------------------------------------------------------------------ overload


def test_a_full_queue_refuses_the_least_important_first(prompt_tokenizer: PromptTokenizer) -> None:
    scene = Scene(prompt_tokenizer, config(max_queued=2))

    async def body() -> None:
        async with serving(scene.app) as client:
            holder = await scene.hold(client)
            first = await scene.queue(client, chat("a"), **{"x-request-priority": "0"})
            second = await scene.queue(client, chat("b"), **{"x-request-priority": "0"})
            # no more important than the queue: refused itself, at once
            same = await client.post(CHAT, json=chat("c"), headers={"x-request-priority": "0"})
            assert same.status_code == 429 and same.headers["retry-after"] == "1"
            assert same.json()["error"]["type"] == "rate_limit_error"
            # more important: the newest of the least important waiters is answered 429 at once
            urgent = asyncio.create_task(
                client.post(CHAT, json=chat("d"), headers={"x-request-priority": "5"})
            )
            preempted = await second
            assert preempted.status_code == 429 and preempted.headers["retry-after"] == "1"
            assert "more important request took this one's place" in preempted.json()["error"]["message"]
            assert not first.done() and scene.admission.preempted == 1
            scene.release()
            answers = await asyncio.gather(holder, first, urgent)
            assert [a.status_code for a in answers] == [200, 200, 200]
            metrics = (await client.get("/metrics")).text
            assert 'deepseek_frontend_admission_preempted_total{model="deepseek-v4-flash"} 1.0' in metrics
            assert 'deepseek_frontend_admission_rejected_total{model="deepseek-v4-flash"} 2.0' in metrics
        assert served_order(scene) == [5, 0]

    run(body)


def test_an_anthropic_request_preempted_in_the_queue_gets_anthropics_429(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    scene = Scene(prompt_tokenizer, config(max_queued=1))

    async def body() -> None:
        async with serving(scene.app) as client:
            holder = await scene.hold(client)
            message = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
            before = scene.admission.queued
            waiting = asyncio.create_task(client.post("/v1/messages", json=message))
            await until(lambda: scene.admission.queued > before, "queued")
            urgent = asyncio.create_task(client.post(CHAT, json=chat(), headers={"x-request-priority": "1"}))
            refused = await waiting
            assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
            assert refused.json()["type"] == "error" and refused.json()["error"]["type"] == "rate_limit_error"
            scene.release()
            await asyncio.gather(holder, urgent)

    run(body)


# ------------------------------------------------------------------------------ deadlines


def test_a_request_whose_budget_runs_out_in_the_queue_gets_a_408_at_once(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    scene = Scene(prompt_tokenizer, config())

    async def body() -> None:
        async with serving(scene.app) as client:
            holder = await scene.hold(client)
            answer = await client.post(CHAT, json=chat(), headers={"x-request-timeout-ms": "300"})
            # answered while the slot is still held: it never reached the engine, and never waited for it
            assert not holder.done()
            assert answer.status_code == 408
            error = answer.json()["error"]
            assert error["code"] == "deadline_exceeded" and "x-request-timeout-ms: 300" in error["message"]
            assert "connection" not in answer.headers  # the body was read: the connection stays
            message = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
            anthropic = await client.post(
                "/v1/messages", json=message, headers={"x-request-timeout-ms": "200"}
            )
            assert anthropic.status_code == 408 and anthropic.json()["type"] == "error"
            assert scene.admission.expired == 2
            assert (
                'deepseek_frontend_admission_expired_total{model="deepseek-v4-flash"} 2.0'
                in (await client.get("/metrics")).text
            )
            scene.release()
            assert (await holder).status_code == 200
        assert served_order(scene) == []

    run(body)


def sim_scene(prompt_tokenizer: PromptTokenizer) -> tuple[SimulatedEngine, Any]:
    """A model on the simulated engine writing a token every 20 ms."""
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=20.0)
    return engine, create_app(config(), tokenizer=prompt_tokenizer, backend=engine)


LONG = {"max_tokens": 400, "ignore_eos": True}


def test_a_stream_past_its_budget_ends_with_the_apis_error_event_and_its_engine_request_is_aborted(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    engine, app = sim_scene(prompt_tokenizer)

    async def body() -> None:
        async with serving(app) as client:
            headers = {"x-request-timeout-ms": "400"}
            async with client.stream("POST", CHAT, json=chat(stream=True, **LONG), headers=headers) as stream:
                assert stream.status_code == 200
                events = [line[6:] async for line in stream.aiter_lines() if line.startswith("data: ")]
            assert len(events) > 2 and events[-1] != "[DONE]"
            error = orjson.loads(events[-1])["error"]
            assert error["code"] == "deadline_exceeded" and "part-way through its answer" in error["message"]
            assert all(orjson.loads(e).get("service_tier") == "default" for e in events[:-1])
            await until(lambda: engine.stats.aborted == 1 and engine.stats.running == 0, "the engine aborted")
            message = {
                "model": MODEL,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
                **LONG,
            }
            async with client.stream("POST", "/v1/messages", json=message, headers=headers) as stream:
                lines = [line async for line in stream.aiter_lines()]
            assert "event: error" in lines and "event: message_stop" not in lines
            await until(lambda: engine.stats.aborted == 2 and engine.stats.running == 0, "the engine aborted")

    run(body)


def test_an_unstreamed_answer_past_its_budget_is_a_408(prompt_tokenizer: PromptTokenizer) -> None:
    engine, app = sim_scene(prompt_tokenizer)

    async def body() -> None:
        async with serving(app) as client:
            answer = await client.post(CHAT, json=chat(**LONG), headers={"x-request-timeout-ms": "300"})
            assert answer.status_code == 408 and answer.json()["error"]["code"] == "deadline_exceeded"
            await until(lambda: engine.stats.aborted == 1 and engine.stats.running == 0, "the engine aborted")
            # a budget that suffices changes nothing
            fine = await client.post(CHAT, json=chat(max_tokens=5), headers={"x-request-timeout-ms": "20000"})
            assert fine.status_code == 200 and fine.json()["choices"][0]["finish_reason"] == "length"

    run(body)


# ------------------------------------------------------------------------------ tiers and keys


def test_the_answer_reports_the_tier_it_ran_in(prompt_tokenizer: PromptTokenizer) -> None:
    scene = Scene(prompt_tokenizer, config())
    scene.release()

    async def body() -> None:
        async with serving(scene.app) as client:
            for tier, reported in (
                ("priority", "priority"),
                ("flex", "flex"),
                ("auto", "default"),
                ("scale", "default"),
            ):
                answer = await client.post(CHAT, json=chat(service_tier=tier))
                assert answer.status_code == 200 and answer.json()["service_tier"] == reported
            plain = await client.post(CHAT, json=chat())
            assert plain.json()["service_tier"] == "default"
            header = await client.post(CHAT, json=chat(), headers={"x-request-priority": "12"})
            assert header.json()["service_tier"] == "priority"
            async with client.stream("POST", CHAT, json=chat(stream=True, service_tier="flex")) as stream:
                events = [line[6:] async for line in stream.aiter_lines() if line.startswith("data: {")]
            assert events and all(orjson.loads(e)["service_tier"] == "flex" for e in events)
            response = await client.post(
                "/v1/responses", json={"model": MODEL, "input": "hi", "service_tier": "priority"}
            )
            assert response.status_code == 200 and response.json()["service_tier"] == "priority"
            async with client.stream(
                "POST",
                "/v1/responses",
                json={"model": MODEL, "input": "hi", "stream": True, "service_tier": "flex"},
            ) as stream:
                objects = [
                    orjson.loads(line[6:])["response"]
                    for line in [line async for line in stream.aiter_lines()]
                    if line.startswith("data: ") and '"response":' in line
                ]
            assert objects and all(o["service_tier"] == "flex" for o in objects)

    run(body)
    assert [r.priority for r in scene.engine.requests] == [10, -10, 0, 0, 0, 12, -10, 10, -10]


@pytest.mark.parametrize(
    ("headers", "body", "param"),
    [
        ({"x-request-priority": "high"}, {}, "x-request-priority"),
        ({"x-request-priority": "1000001"}, {}, "x-request-priority"),
        ({"x-dynamo-request-priority": "1.5"}, {}, "x-dynamo-request-priority"),
        ({"x-request-timeout-ms": "0"}, {}, "x-request-timeout-ms"),
        ({"x-request-timeout-ms": "soon"}, {}, "x-request-timeout-ms"),
        ({}, {"service_tier": "gold"}, "service_tier"),
        ({}, {"service_tier": 3}, "service_tier"),
        ({"x-request-priority": "3"}, {"service_tier": "gold"}, "service_tier"),
    ],
)
def test_a_bad_priority_budget_or_tier_is_a_400_naming_it(
    prompt_tokenizer: PromptTokenizer, headers: dict[str, str], body: dict[str, Any], param: str
) -> None:
    scene = Scene(prompt_tokenizer, config())

    async def scenario() -> httpx.Response:
        async with serving(scene.app) as client:
            return await client.post(CHAT, json=chat(**body), headers=headers)

    answer = run(scenario)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param
    assert param in answer.json()["error"]["message"]
    assert scene.engine.requests == []


def test_an_anthropic_service_tier_is_taken_whatever_it_says(prompt_tokenizer: PromptTokenizer) -> None:
    scene = Scene(prompt_tokenizer, config())

    async def scenario() -> list[int]:
        async with serving(scene.app) as client:
            for tier in ("auto", "standard_only", "something-new"):
                message = {
                    "model": MODEL,
                    "max_tokens": 8,
                    "service_tier": tier,
                    "messages": [{"role": "user", "content": "hi"}],
                }
                assert (await client.post("/v1/messages", json=message)).status_code == 200
        return [r.priority for r in scene.engine.requests]

    assert run(scenario) == [0, 0, 0]


KEYS = [
    {"name": "capped", "key": "sk-capped", "priority": 5, "max_priority": 5},
    {"name": "free", "key": "sk-free"},
    {"name": "lowly", "key": "sk-lowly", "priority": -20},
]


def test_a_keys_default_applies_and_its_ceiling_clamps_what_its_requests_ask(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    cfg = config()
    scene = Scene(prompt_tokenizer, cfg, Fleet((cfg,), TenantTable.from_entries(KEYS)))

    def key(name: str, **headers: str) -> dict[str, str]:
        return {"authorization": f"Bearer sk-{name}", **headers}

    async def body() -> tuple[list[int | None], list[str]]:
        async with serving(scene.app) as client:
            holder = asyncio.create_task(
                client.post(CHAT, json=chat("hold"), headers=key("free", **{"x-request-priority": str(HOLD)}))
            )
            await until(lambda: bool(scene.engine.held), "the holder reached the engine")
            before = scene.admission.queued
            tasks = []
            for name, headers, fields in (
                ("capped", {"x-request-priority": "100"}, {}),  # clamped to 5
                ("capped", {}, {"service_tier": "priority"}),  # 10, clamped to 5
                ("capped", {}, {}),  # its default, 5
                ("free", {"x-request-priority": "7"}, {}),
                ("lowly", {}, {}),  # its default, -20
                ("lowly", {"x-request-priority": "0"}, {}),  # a header overrides the default
            ):
                tasks.append(
                    asyncio.create_task(client.post(CHAT, json=chat(**fields), headers=key(name, **headers)))
                )
                before += 1
                await until(lambda b=before: scene.admission.queued >= b, "queued")
            scene.release()
            answers = await asyncio.gather(holder, *tasks)
        return served_order(scene), [a.json()["service_tier"] for a in answers[1:]]

    order, tiers = run(body)
    assert order == [7, 5, 5, 5, 0, -20]
    assert tiers == ["default", "default", "default", "default", "flex", "default"]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"priority": "high"}, "keys[0].priority: must be an integer"),
        ({"max_priority": True}, "keys[0].max_priority: must be an integer"),
        ({"priority": 2_000_000}, "keys[0].priority: must be an integer from -1000000 to 1000000"),
        ({"priority": 6, "max_priority": 5}, "keys[0].priority: 6 is above the key's max_priority (5)"),
    ],
)
def test_a_keys_priorities_are_checked(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        TenantTable.from_entries([{"name": "k", "key": "sk-k", **entry}])


def test_a_batch_line_runs_at_the_lowest_priority_whatever_its_body_asks(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    scene = Scene(prompt_tokenizer, config())
    scene.release()

    async def body() -> Any:
        async with serving(scene.app):
            line = orjson.dumps(chat(service_tier="priority"))
            return await call_route(scene.app, scene.app.router, CHAT, line, tenant=None, owner="o")

    answer = run(body)
    assert answer.status == 200 and orjson.loads(answer.body)["service_tier"] == "flex"
    assert [r.priority for r in scene.engine.requests] == [BATCH_PRIORITY]
