"""The prefill/decode orchestrator (disagg/pool.py) over real HTTP against fake PD workers.

The fakes (tests/disagg/fakes.py) only finish a request when both legs of a room arrive, so every
successful request here also proves the legs went out concurrently. After every request, whatever
its end, no leg may still run on any worker (``open == 0`` everywhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from deepseek_frontend.disagg import parts as pd_parts
from deepseek_frontend.disagg.metrics import PdCollector
from deepseek_frontend.disagg.pool import DisaggregatedPool, PdConfig, RoleMismatchError, Rooms
from deepseek_frontend.engines.base import GenerateRequest, SamplingParams
from deepseek_frontend.engines.pool import StreamLimits, WorkerPool, from_urls
from deepseek_frontend.errors import (
    EngineRejectedRequestError,
    EngineTimeoutError,
    NoHealthyWorkerError,
)
from deepseek_frontend.generation import RID_END, engine_rid, leg_id
from deepseek_frontend.routing.router import Router, RouterConfig
from deepseek_frontend.routing.session import use_session
from tests.engines.conftest import wait_until

from .fakes import FIRST, TOKENS, FakeSGLangPd, FakeVllmPd, Rendezvous

PROMPT = list(range(100, 300))
#: the rid the workers run request "req-1" under
RID = engine_rid("req-1")


def pair_retry(rid: str) -> str:
    """The rid of the pair retry of the request a worker ran as ``rid``."""
    return engine_rid(leg_id(rid.removesuffix(RID_END), "pd1"))


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


def request(rid: str = "req-1", max_new: int = 5, prompt: list[int] | None = None) -> GenerateRequest:
    return GenerateRequest(
        rid, list(prompt or PROMPT), SamplingParams(max_new_tokens=max_new, temperature=0.0)
    )


def sglang_pool(urls: list[str], mode: str = "least-outstanding") -> WorkerPool:
    return from_urls(
        "sglang",
        urls,
        health_interval_s=0,
        max_attempts=1,
        router=Router(RouterConfig(mode=mode)),  # type: ignore[arg-type]
    )


@asynccontextmanager
async def sglang_pd(
    prefills: int = 1, decodes: int = 1, config: PdConfig | None = None, migration_limit: int = 0, **fake: Any
) -> AsyncIterator[tuple[DisaggregatedPool, list[FakeSGLangPd], list[FakeSGLangPd]]]:
    rv = Rendezvous()
    pre = [FakeSGLangPd("prefill", rv, **fake) for _ in range(prefills)]
    dec = [FakeSGLangPd("decode", rv) for _ in range(decodes)]
    for f in (*pre, *dec):
        await f.start()
    pool = DisaggregatedPool(
        sglang_pool([f.url for f in pre]),
        sglang_pool([f.url for f in dec]),
        config or PdConfig(),
        migration_limit=migration_limit,
    )
    try:
        await pool.start()
        yield pool, pre, dec
    finally:
        await pool.aclose()
        for f in (*pre, *dec):
            await f.close()


async def collect(pool: DisaggregatedPool, req: GenerateRequest) -> list[int]:
    out: list[int] = []
    async for chunk in pool.generate(req):
        out.extend(chunk.token_ids)
    return out


async def all_closed(*fakes: Any) -> None:
    await wait_until(lambda: all(f.open == 0 for f in fakes))


# ---------------------------------------------------------------------------------------- SGLang flow


def test_both_legs_get_the_same_body_with_the_bootstrap_trio_and_the_client_gets_the_decode_stream() -> None:
    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            assert await collect(pool, request()) == TOKENS
            await all_closed(p, d)
            await wait_until(lambda: pool.stats.outcomes["ok"] == 1)
            (pb,), (db,) = p.bodies, d.bodies
            assert pb == db  # one body, token ids included, sent to both legs
            assert pb["input_ids"] == PROMPT and pb["rid"] == RID and pb["stream"] is True
            assert pb["bootstrap_host"] == "127.0.0.1" and pb["bootstrap_port"] == 8998
            assert 0 <= pb["bootstrap_room"] < 2**63
            assert "routed_dp_rank" not in pb and "disagg_prefill_dp_rank" not in pb
            assert pool.stats.outcomes["ok"] == 1
            timings = pool.stats.timings
            assert timings["first_token"].count == 1 and timings["prefill"].count == 1
            # one of the two came first: the other is timed from it
            assert timings["decode_after_prefill"].count + timings["prefill_lag"].count == 1

    run(scenario)


@pytest.mark.parametrize(
    ("reported", "override", "expected"), [(9123, None, 9123), (None, None, 8998), (9123, 7000, 7000)]
)
def test_the_bootstrap_port_is_the_one_the_prefill_worker_reports_unless_overridden(
    reported: int | None, override: int | None, expected: int
) -> None:
    async def scenario() -> None:
        config = PdConfig(bootstrap_port=override)
        async with sglang_pd(config=config, bootstrap_port=reported) as (pool, (p,), (d,)):
            assert await collect(pool, request()) == TOKENS
            assert p.bodies[0]["bootstrap_port"] == d.bodies[0]["bootstrap_port"] == expected

    run(scenario)


def test_every_request_gets_its_own_room() -> None:
    async def scenario() -> None:
        async with sglang_pd(prefills=2, decodes=2) as (pool, pre, dec):
            outs = await asyncio.gather(*(collect(pool, request(f"r{i}")) for i in range(24)))
            assert all(o == TOKENS for o in outs)
            rooms = [b["bootstrap_room"] for f in pre for b in f.bodies]
            assert len(rooms) == 24 and len(set(rooms)) == 24
            assert sorted(rooms) == sorted(b["bootstrap_room"] for f in dec for b in f.bodies)

    run(scenario)


def test_a_room_drawn_again_by_chance_is_redrawn(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = iter([5, 5, 5, 6])
    monkeypatch.setattr(pd_parts.secrets, "randbelow", lambda limit: next(draws))
    rooms = Rooms()
    assert [rooms.draw(), rooms.draw()] == [5, 6]


def test_a_worker_whose_server_info_reports_another_role_refuses_to_start() -> None:
    async def scenario() -> None:
        rv = Rendezvous()
        p, d = FakeSGLangPd("prefill", rv), FakeSGLangPd("decode", rv, report="null")
        await p.start()
        await d.start()
        pool = DisaggregatedPool(sglang_pool([p.url]), sglang_pool([d.url]))
        try:
            with pytest.raises(RoleMismatchError) as err:
                await pool.start()
            assert d.url in str(err.value) and "--decode-worker" in str(err.value)
            assert 'disaggregation_mode "null"' in str(err.value)
        finally:
            await pool.aclose()
            await p.close()
            await d.close()

    run(scenario)


def test_a_prefill_failing_before_the_first_token_aborts_the_decode_and_retries_on_other_workers() -> None:
    async def scenario() -> None:
        async with sglang_pd(prefills=2, decodes=2) as (pool, (bad, good), dec):
            bad.mode = "fail"
            for i in range(4):
                assert await collect(pool, request(f"r{i}")) == TOKENS
            await all_closed(bad, good, *dec)
            assert bad.bodies  # ties rotate: some request started on the failing worker
            assert pool.stats.retries == pool.stats.bootstrap_failures == len(bad.bodies)
            for body in bad.bodies:
                rid, room = body["rid"], body["bootstrap_room"]
                # the retry ran on the other prefill worker, with a new room and rid
                retry = next(b for b in good.bodies if b["rid"] == pair_retry(rid))
                assert retry["bootstrap_room"] != room
                # the failed pair's decode leg was aborted, and the retry went to the other decode worker
                first = next(f for f in dec if any(b["rid"] == rid for b in f.bodies))
                await wait_until(lambda first=first, rid=rid: rid in first.aborts)
                assert all(b["rid"] != pair_retry(rid) for b in first.bodies)

    run(scenario)


def test_a_pair_that_fails_twice_ends_with_a_worker_error_and_nothing_running() -> None:
    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            p.mode = "fail"
            with pytest.raises(NoHealthyWorkerError) as err:
                await collect(pool, request())
            assert err.value.status_code == 503 and "KVTransferError" in err.value.message
            await all_closed(p, d)
            assert len(p.bodies) == len(d.bodies) == 2
            assert pool.stats.outcomes["prefill_failed"] == 1

    run(scenario)


def test_a_decode_failing_before_its_first_token_aborts_the_prefill_and_retries() -> None:
    async def scenario() -> None:
        async with sglang_pd(prefills=1, decodes=2) as (pool, (p,), (bad, good)):
            bad.mode = "fail"
            for i in range(4):
                assert await collect(pool, request(f"r{i}")) == TOKENS
            await all_closed(p, bad, good)
            assert bad.bodies
            assert pool.stats.retries == pool.stats.transfer_failures == len(bad.bodies)
            for body in bad.bodies:
                rid = body["rid"]
                # the prefill leg waited for the failed decode: aborted, then the pair retried elsewhere
                await wait_until(lambda rid=rid: rid in p.aborts)
                assert any(b["rid"] == pair_retry(rid) for b in good.bodies)

    run(scenario)


def test_a_decode_failing_after_its_first_token_continues_on_a_new_pair(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with sglang_pd(migration_limit=1) as (pool, (p,), (d,)):
            d.break_times = 1
            with caplog.at_level(logging.INFO, logger="deepseek_frontend.routing.pd"):
                assert await collect(pool, request()) == [FIRST, *TOKENS[:4]]
                await wait_until(lambda: sum(pool.stats.outcomes.values()) >= 1)
            await all_closed(p, d)
            first, continued = d.bodies
            assert continued["input_ids"] == [*PROMPT, FIRST]  # the prompt plus the token already streamed
            assert continued["sampling_params"]["max_new_tokens"] == 4
            assert continued["bootstrap_room"] != first["bootstrap_room"]  # a new pair, a new room
            assert [b["bootstrap_room"] for b in p.bodies] == [
                first["bootstrap_room"],
                continued["bootstrap_room"],
            ]
            # one request: one outcome and one log line naming both pairs' workers and rooms
            assert dict(pool.stats.outcomes) == {"migrated": 1}
            (line,) = [r.getMessage() for r in caplog.records if r.name == "deepseek_frontend.routing.pd"]
            rooms = f"room={first['bootstrap_room']},{continued['bootstrap_room']}"
            assert "outcome=migrated" in line and rooms in line and "migrations=1" in line
            assert f"prefill={p.url},{p.url}" in line and f"decode={d.url},{d.url}" in line
            assert "stream broke" in line  # what broke the first pair
            assert pool.decode.router is not None and pool.decode.router.migrations == 1

    run(scenario)


def test_a_decode_that_never_gets_its_kv_times_out_with_both_legs_aborted() -> None:
    async def scenario() -> None:
        async with sglang_pd(config=PdConfig(transfer_timeout_s=0.3)) as (pool, (p,), (d,)):
            d.mode = "hang"
            with pytest.raises(EngineTimeoutError) as err:
                await collect(pool, request())
            assert err.value.status_code == 504 and "--pd-transfer-timeout" in err.value.message
            await all_closed(p, d)
            await wait_until(lambda: RID in d.aborts)
            assert len(d.bodies) == 1  # not retried: the client's deadline would not be met either
            assert pool.stats.outcomes["transfer_timeout"] == 1 and pool.stats.transfer_failures == 1

    run(scenario)


def test_a_pair_whose_kv_never_moves_times_out_though_neither_leg_answered() -> None:
    """The prefill never sends the KV: it never answers, and the decode never gets a token. The
    transfer timeout counts from the legs' start (plus the prompt's prefill allowance), not only
    from a prefill answer that never comes."""

    async def scenario() -> None:
        async with sglang_pd(config=PdConfig(transfer_timeout_s=0.3)) as (pool, (p,), (d,)):
            p.mode = d.mode = "hang"
            with pytest.raises(EngineTimeoutError) as err:
                await collect(pool, request())
            assert err.value.status_code == 504 and "--pd-transfer-timeout" in err.value.message
            assert (
                "neither the prefill worker's answer nor the decode worker's first token" in err.value.message
            )
            await all_closed(p, d)
            await wait_until(lambda: RID in p.aborts and RID in d.aborts)
            assert pool.stats.outcomes["transfer_timeout"] == 1 and pool.stats.transfer_failures == 1

    run(scenario)


def test_a_refusal_by_a_leg_is_the_clients_error_and_aborts_the_other_leg() -> None:
    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            d.mode = "reject"
            with pytest.raises(EngineRejectedRequestError) as err:
                await collect(pool, request())
            assert err.value.status_code == 400
            await all_closed(p, d)
            assert len(d.bodies) == 1 and pool.stats.outcomes["rejected"] == 1

    run(scenario)


def test_a_client_leaving_mid_stream_aborts_the_decode_leg() -> None:
    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            d.mode = "slow"
            d.itl_s = 5.0
            stream = pool.generate(request())
            first = await anext(stream)
            assert first.token_ids == [FIRST]
            await stream.aclose()  # type: ignore[attr-defined]
            await all_closed(p, d)
            await wait_until(lambda: RID in d.aborts)
            assert pool.stats.outcomes["client_gone"] == 1

    run(scenario)


def test_a_client_leaving_before_the_first_token_aborts_both_legs() -> None:
    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            p.mode = "hang"  # the prefill never sends the KV: the decode waits for it
            task = asyncio.create_task(collect(pool, request()))
            await wait_until(lambda: p.open == 1 and d.open == 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await all_closed(p, d)
            await wait_until(lambda: RID in p.aborts and RID in d.aborts)
            assert pool.stats.outcomes["client_gone"] == 1

    run(scenario)


@asynccontextmanager
async def routed_pd(
    mode: str,
) -> AsyncIterator[tuple[DisaggregatedPool, list[FakeSGLangPd], list[FakeSGLangPd]]]:
    rv = Rendezvous()
    pre = [FakeSGLangPd("prefill", rv) for _ in range(2)]
    dec = [FakeSGLangPd("decode", rv) for _ in range(2)]
    for f in (*pre, *dec):
        await f.start()
    pool = DisaggregatedPool(sglang_pool([f.url for f in pre], mode), sglang_pool([f.url for f in dec], mode))
    try:
        await pool.start()
        yield pool, pre, dec
    finally:
        await pool.aclose()
        for f in (*pre, *dec):
            await f.close()


def test_kv_routing_sends_a_conversation_back_to_the_prefill_worker_that_caches_it() -> None:
    async def scenario() -> None:
        async with routed_pd("kv-approx") as (pool, pre, dec):
            conversations = {name: [name * 7 + i for i in range(640)] for name in (1, 2, 3)}
            for turn in range(3):
                for name, prompt in conversations.items():
                    prompt.extend(range(5000 + turn * 10, 5000 + turn * 10 + 64))  # the next turn extends it
                    assert await collect(pool, request(f"c{name}-t{turn}", prompt=prompt)) == TOKENS
            for name in conversations:
                served = {f.url for f in pre for b in f.bodies if b["rid"].startswith(f"c{name}-")}
                assert len(served) == 1, f"conversation {name} moved between {served}"
            # a PD decode worker keeps no radix cache (SGLang 0.5.23 pd_disaggregation_hook.py): the
            # decode choice is by load alone, and the conversations were spread over both workers of
            # each role
            assert all(f.bodies for f in (*pre, *dec))

    run(scenario)


def test_session_affinity_keeps_a_session_on_one_worker_per_role() -> None:
    async def scenario() -> None:
        async with routed_pd("session") as (pool, pre, dec):
            for turn in range(3):
                for name in ("a", "b", "c"):
                    use_session(name)  # what the session header middleware does per request
                    assert await collect(pool, request(f"{name}-{turn}")) == TOKENS
            for role in (pre, dec):
                for name in ("a", "b", "c"):
                    served = {f.url for f in role for b in f.bodies if b["rid"].startswith(f"{name}-")}
                    assert len(served) == 1
            assert all(f.bodies for f in (*pre, *dec))

    run(scenario)


def test_dp_rank_hints_name_the_prefill_rank_that_caches_the_prompt() -> None:
    async def scenario() -> None:
        async with sglang_pd(config=PdConfig()) as (pool, (p,), (d,)):
            router = pool.prefill.router
            assert router is not None
            router.mode = "kv"  # the index is filled by hand below, as KV events would
            from deepseek_frontend.generation import WorkerCapabilities
            from deepseek_frontend.routing.hashing import block_hashes

            router.worker_added(p.url, WorkerCapabilities(extra={"attn_dp_size": 2}))  # two DP ranks
            page = router.page_size
            router.index.record((p.url, 1), block_hashes(PROMPT, page)[:1], router._clock())
            pre_req, dec_req = pool.sglang_legs(request(), p.url, d.url, 42)
            assert pre_req.extra_fields is not None and dec_req.extra_fields is not None
            assert pre_req.extra_fields["routed_dp_rank"] == 1
            assert pre_req.extra_fields["disagg_prefill_dp_rank"] == 1
            assert dec_req.extra_fields["disagg_prefill_dp_rank"] == 1
            assert "routed_dp_rank" not in dec_req.extra_fields  # the decode router knows no ranks
            assert dec_req.extra_fields["bootstrap_room"] == 42

    run(scenario)


def test_with_attention_dp_both_legs_carry_the_ranks_sglang_expects() -> None:
    """Prefill: routed_dp_rank and disagg_prefill_dp_rank (the same rank: without the second, SGLang's
    follow_bootstrap_room check fails the room when the rank differs from room % N); decode: the prefill
    rank as disagg_prefill_dp_rank and its own rank, chosen by load, as routed_dp_rank."""

    async def scenario() -> None:
        rv = Rendezvous()
        p, d = FakeSGLangPd("prefill", rv), FakeSGLangPd("decode", rv)
        p.dp_size = d.dp_size = 2
        for f in (p, d):
            await f.start()
        pool = DisaggregatedPool(sglang_pool([p.url], "kv-approx"), sglang_pool([d.url], "kv-approx"))
        try:
            await pool.start()
            d.mode, d.itl_s = "slow", 5.0
            first = asyncio.create_task(collect(pool, request("r1", prompt=list(range(1000, 1400)))))
            await wait_until(lambda: d.open == 1)
            d.mode = "ok"
            assert await collect(pool, request("r2", prompt=list(range(2000, 2400)))) == TOKENS
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first
            pre = {b["rid"]: b for b in p.bodies}
            dec = {b["rid"]: b for b in d.bodies}
            r1, r2 = engine_rid("r1"), engine_rid("r2")
            for rid in (r1, r2):
                assert pre[rid]["routed_dp_rank"] == pre[rid]["disagg_prefill_dp_rank"]
                assert dec[rid]["disagg_prefill_dp_rank"] == pre[rid]["routed_dp_rank"]
                assert pre[rid]["bootstrap_room"] == dec[rid]["bootstrap_room"]
            # r1 was still decoding on its rank when r2 came: the decode router chose the other rank
            assert {dec[r1]["routed_dp_rank"], dec[r2]["routed_dp_rank"]} == {0, 1}
        finally:
            await pool.aclose()
            for f in (p, d):
                await f.close()

    run(scenario)


def test_metrics_and_the_log_line_name_both_workers_and_the_room(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            with caplog.at_level(logging.INFO, logger="deepseek_frontend.routing.pd"):
                assert await collect(pool, request()) == TOKENS
                await wait_until(lambda: pool.stats.outcomes["ok"] == 1)  # logged once the prefill answered
            room = p.bodies[0]["bootstrap_room"]
            (line,) = [r.getMessage() for r in caplog.records if r.name == "deepseek_frontend.routing.pd"]
            assert f"prefill={p.url}" in line and f"decode={d.url}" in line and f"room={room}" in line
            assert "outcome=ok" in line and "first_token=" in line and "prefill_answer=" in line
            registry = CollectorRegistry()
            registry.register(PdCollector(pool))
            text = generate_latest(registry).decode()
            assert 'deepseek_frontend_pd_requests_total{outcome="ok"} 1.0' in text
            assert "deepseek_frontend_pd_first_token_seconds_count 1.0" in text
            assert "deepseek_frontend_pd_prefill_seconds_count 1.0" in text
            assert "pd_transfer_seconds" not in text  # it measured no transfer: gone
            assert 'deepseek_frontend_pd_role_healthy_workers{role="decode"} 1.0' in text

    run(scenario)


# ------------------------------------------------------------------------------------------ vLLM flow


@asynccontextmanager
async def vllm_pd(
    limits: StreamLimits | None = None, fake: dict[str, Any] | None = None, **config: Any
) -> AsyncIterator[tuple[DisaggregatedPool, FakeVllmPd, FakeVllmPd]]:
    """A vLLM pair of fakes (``fake``: their options, tests/disagg/fakes.py) under an orchestrator
    with ``PdConfig(engine="vllm", **config)``."""
    p, d = FakeVllmPd("prefill", "engine-p", **(fake or {})), FakeVllmPd("decode", "engine-d", **(fake or {}))
    d.prefills.append(p)
    await p.start()
    await d.start()

    def pool(url: str) -> WorkerPool:
        return from_urls(
            "vllm",
            [url],
            model="m",
            health_interval_s=0,
            max_attempts=1,
            router=Router(),
            limits=limits,  # type: ignore[arg-type]
        )

    pd = DisaggregatedPool(pool(p.url), pool(d.url), PdConfig(engine="vllm", **config))
    try:
        await pd.start()
        yield pd, p, d
    finally:
        await pd.aclose()
        await p.close()
        await d.close()


def test_vllm_prefill_answer_kv_transfer_params_go_verbatim_into_the_decode_request() -> None:
    async def scenario() -> None:
        async with vllm_pd() as (pool, p, d):
            assert await collect(pool, request()) == TOKENS
            await all_closed(p, d)
            await wait_until(lambda: pool.stats.outcomes["ok"] == 1)
            (pb,), (db,) = p.bodies, d.bodies
            assert pb["stream"] is False and pb["max_tokens"] == 1 and pb["prompt"] == PROMPT
            assert pb["kv_transfer_params"] == {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            }
            assert db["kv_transfer_params"] == p.issued[RID]
            assert db["stream"] is True and db["max_tokens"] == 5 and db["prompt"] == PROMPT

    run(scenario)


def test_vllm_decode_without_its_kv_times_out_and_a_failed_prefill_never_starts_a_decode() -> None:
    async def scenario() -> None:
        async with vllm_pd(transfer_timeout_s=0.3) as (pool, p, d):
            d.mode = "hang"
            with pytest.raises(EngineTimeoutError):
                await collect(pool, request())
            await all_closed(p, d)
            d.mode, p.mode = "ok", "http_500"
            with pytest.raises(NoHealthyWorkerError):
                await collect(pool, request("req-2"))
            assert len(d.bodies) == 1 and len(p.bodies) == 3  # two prefill tries, no decode leg
            assert pool.stats.bootstrap_failures == 2

    run(scenario)


def test_a_vllm_prefill_that_never_answers_ends_at_the_first_token_deadline_with_nothing_running() -> None:
    async def scenario() -> None:
        async with vllm_pd(limits=StreamLimits(first_token_timeout_s=0.3)) as (pool, p, d):
            p.mode = "hang"
            with pytest.raises(EngineTimeoutError) as err:
                await collect(pool, request())
            assert err.value.status_code == 504 and "prefill worker did not answer" in err.value.message
            await all_closed(p, d)
            assert d.bodies == []  # no decode leg was started

    run(scenario)


# ---------------------------------------------------------------------------------------- rids


def test_a_pair_retried_on_the_same_workers_survives_the_abort_of_the_failed_pair() -> None:
    """One worker per role: the retry runs where the failed pair ran, while that pair's decode leg is
    still held by the worker (its scheduler has not processed the closed stream yet) and the aborts of
    it -- the closed stream's and the frontend's ``/abort_request`` -- are applied at the scheduler's
    next step, by prefix. The retry's rid must not start with the failed leg's."""

    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            p.fail_times = 1
            d.step_s, d.linger_s = 0.2, 1.0
            d.mode, d.itl_s = "slow", 0.1  # the retry's decode is still streaming at that step
            assert await collect(pool, request()) == TOKENS
            await all_closed(p, d)
            first, retry = d.bodies
            assert (first["rid"], retry["rid"]) == (RID, pair_retry(RID))
            await wait_until(lambda: RID in d.aborts)
            assert d.aborted == [] and pool.stats.retries == 1

    run(scenario)


def test_a_migration_to_the_same_workers_survives_the_abort_of_the_broken_leg() -> None:
    """The decode leg breaks after its first token; the continuation runs on the same two workers
    while the broken leg's abort, by prefix, is still to be applied there."""

    async def scenario() -> None:
        async with sglang_pd(migration_limit=1) as (pool, (p,), (d,)):
            d.break_times = 1
            d.step_s, d.linger_s = 0.2, 1.0
            d.mode, d.itl_s = "slow", 0.1
            assert await collect(pool, request()) == [FIRST, *TOKENS[:4]]
            await all_closed(p, d)
            first, continued = d.bodies
            assert continued["rid"] == engine_rid(leg_id("req-1", "m1"))
            assert not continued["rid"].startswith(first["rid"])
            await wait_until(lambda: RID in d.aborts)
            assert d.aborted == [] and dict(pool.stats.outcomes) == {"migrated": 1}

    run(scenario)
