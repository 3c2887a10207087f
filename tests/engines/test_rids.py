"""Engine rids (generation.py ``engine_rid``, ``leg_id``) and the simulated engine's SGLang aborts.

SGLang aborts every live request whose rid *starts with* the aborted one (``managers/scheduler.py``
``Scheduler.abort_request``), and its tokenizer manager forwards an ``/abort_request`` only for a rid it
holds (one tokenizer worker). The simulated engine does both, in process and behind ``sim-engine``.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx

from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import build_sim_app
from deepseek_frontend.errors import EngineRejectedRequestError
from deepseek_frontend.generation import RID_END, EngineChunk, engine_rid, leg_id

from .conftest import prompt_ids, request_for, serve_app, wait_until


def legs_of(request_id: str) -> list[str]:
    """Every kind of leg one request may run: choices, migrations, pair retries, and their nesting."""
    out = [request_id]
    for choice in [request_id, *(leg_id(request_id, f"c{i}") for i in range(16))]:
        for migrated in [choice, *(leg_id(choice, f"m{m}") for m in range(1, 4))]:
            out += [migrated, leg_id(migrated, "pd1")]
    return sorted(set(out))


def test_no_engine_rid_of_any_leg_is_a_prefix_of_another() -> None:
    ids = [
        *legs_of("chatcmpl-7f3a"),
        *legs_of("chatcmpl-7f3a1"),  # an id that extends another
        *legs_of("resp-9"),
        "odd~id",
        "odd%7Eid",  # what the escaped "odd~id" would read as, unescaped
        "odd%id",
    ]
    rids = [engine_rid(i) for i in ids]
    assert len(set(rids)) == len(ids), "distinct ids, distinct rids"
    assert all(r.count(RID_END) == 1 and r.endswith(RID_END) for r in rids)
    assert all(r != i for r, i in zip(rids, ids, strict=True)), "a bare request id is never a rid"
    clashes = [(a, b) for a, b in itertools.permutations(rids, 2) if b.startswith(a)]
    assert clashes == []


def test_a_closed_stream_aborts_every_stream_its_rid_prefixes(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=5)
    ids = prompt_ids("write 500 words")

    async def drain(stream: Any, into: list[EngineChunk]) -> None:
        async for chunk in stream:
            into.append(chunk)

    async def scenario() -> tuple[list[EngineChunk], list[EngineChunk]]:
        # rids as a worker gets them on the wire: "x-1" is a prefix of "x-10"
        short = engine.run(request_for(ids, rid="x-1", max_new_tokens=2000))
        await anext(short)
        long_chunks: list[EngineChunk] = []
        other: list[EngineChunk] = []
        longer = asyncio.create_task(
            drain(engine.run(request_for(ids, rid="x-10", max_new_tokens=2000)), long_chunks)
        )
        unrelated = asyncio.create_task(
            drain(engine.run(request_for(ids, rid="y-10", max_new_tokens=30)), other)
        )
        await wait_until(lambda: len(long_chunks) > 2)
        await short.aclose()  # type: ignore[attr-defined]
        await asyncio.wait_for(asyncio.gather(longer, unrelated), 30)
        return long_chunks, other

    long_chunks, other = asyncio.run(scenario())
    assert long_chunks[-1].finish_reason == "abort"
    assert other[-1].finish_reason != "abort"
    assert list(engine.stats.aborted_ids) == ["x-1", "x-10"]


def test_the_frontends_rids_keep_an_abort_to_its_own_request(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=5)
    ids = prompt_ids("write 500 words")

    async def scenario() -> list[str | None]:
        streams = [
            engine.generate(request_for(ids, rid=leg_id("x", f"c{i}"), max_new_tokens=300))
            for i in (1, 10, 11)
        ]
        firsts = [await anext(s) for s in streams]
        assert all(f.finish_reason is None for f in firsts)
        await engine.abort(leg_id("x", "c1"))
        finishes: list[str | None] = []
        for s in streams:
            last = None
            async for chunk in s:
                last = chunk
            finishes.append(last.finish_reason if last else None)
        return finishes

    assert asyncio.run(scenario()) == ["abort", "length", "length"]


def test_a_rid_already_running_is_refused_like_sglang(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=5)
    ids = prompt_ids("write 100 words")

    async def scenario() -> None:
        first = engine.generate(request_for(ids, rid="same"))
        await anext(first)
        try:
            await anext(engine.generate(request_for(ids, rid="same")))
        except EngineRejectedRequestError as exc:
            assert exc.status_code == 400 and "Duplicate request ID detected: same~" in exc.message
        else:
            raise AssertionError("a duplicate rid was accepted")
        finally:
            await first.aclose()  # type: ignore[attr-defined]

    asyncio.run(scenario())


def test_abort_request_is_forwarded_only_for_a_held_rid_then_matches_by_prefix(prompt_tokenizer: Any) -> None:
    async def scenario(tokenizer_workers: int) -> tuple[str, str]:
        engine = SimulatedEngine(prompt_tokenizer, itl_ms=5)
        app = build_sim_app(engine, tokenizer_worker_num=tokenizer_workers)
        async with serve_app(app) as url, httpx.AsyncClient(timeout=30) as http:
            body = {"input_ids": prompt_ids("write 500 words"), "sampling_params": {"max_new_tokens": 100}}

            async def finish_of(rid: str) -> str:
                answer = await http.post(url + "/generate", json={**body, "rid": rid})
                return str(answer.json()["meta_info"]["finish_reason"]["type"])

            legs = [asyncio.create_task(finish_of(rid)) for rid in ("job-10", "job-2")]
            await wait_until(lambda: engine.stats.running == 2)
            await http.post(url + "/abort_request", json={"rid": "job-1"})  # held by nobody
            await http.post(url + "/abort_request", json={"rid": ""})  # ignored, as SGLang ignores it
            one, two = await asyncio.gather(*legs)
            return one, two

    assert asyncio.run(scenario(1)) == ("length", "length")
    # with several tokenizer workers SGLang forwards it anyway, and the scheduler matches "job-10"
    assert asyncio.run(scenario(2)) == ("abort", "length")


def test_abort_all_ends_every_request(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=5)

    async def scenario() -> list[str]:
        async with serve_app(build_sim_app(engine)) as url, httpx.AsyncClient(timeout=30) as http:
            body = {"input_ids": prompt_ids("write 500 words"), "sampling_params": {"max_new_tokens": 200}}
            legs = [asyncio.create_task(http.post(url + "/generate", json={**body, "rid": r})) for r in "ab"]
            await wait_until(lambda: engine.stats.running == 2)
            await http.post(url + "/abort_request", json={"abort_all": True})
            return [(await leg).json()["meta_info"]["finish_reason"]["type"] for leg in legs]

    assert asyncio.run(scenario()) == ["abort", "abort"]
