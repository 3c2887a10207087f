"""The prefill/decode orchestrator (disagg/pool.py), continued: the load, routing metrics and role
checks each role's pool keeps, and how a request ends when the decode finishes before the prefill's
answer (the client's response ends with the decode; the answer is read in the background, bounded).
Fake PD workers over real HTTP (tests/disagg/fakes.py), as in test_pool.py.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from deepseek_frontend.disagg.metrics import PdCollector
from deepseek_frontend.disagg.parts import quietly_cancel
from deepseek_frontend.disagg.pool import DisaggregatedPool, PdConfig
from deepseek_frontend.engines.pool import StreamLimits, WorkerPool
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.routing.metrics import RoutingCollector
from deepseek_frontend.routing.router import Router
from tests.engines.conftest import wait_until

from .fakes import TOKENS, FakeSGLangPd, Rendezvous
from .test_pool import RID, all_closed, collect, request, run, sglang_pd, sglang_pool, vllm_pd


def test_the_vllm_prefill_leg_counts_in_flight_on_its_worker_while_it_runs() -> None:
    async def scenario() -> None:
        async with vllm_pd(limits=StreamLimits(first_token_timeout_s=30)) as (pool, p, d):
            p.mode = "hang"  # the prefill answers only when the client leaves
            task = asyncio.create_task(collect(pool, request()))
            await wait_until(lambda: p.open == 1)
            # least-outstanding load of the prefill role sees the running leg
            assert pool.prefill.in_flight == 1 and pool.statuses()[0].in_flight == 1
            registry = CollectorRegistry()
            registry.register(PdCollector(pool))
            assert (
                'deepseek_frontend_pd_role_in_flight{role="prefill"} 1.0'
                in generate_latest(registry).decode()
            )
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await all_closed(p, d)
            assert pool.prefill.in_flight == 0 and pool.statuses()[0].extra["requests"] == 1

    run(scenario)


def test_the_response_ends_with_the_decode_and_a_late_prefill_answer_is_checked_in_the_background(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            p.hold, p.late = asyncio.Event(), "fail"
            with caplog.at_level(logging.INFO, logger="deepseek_frontend.routing.pd"):
                # the decode finishes while the prefill's answer is held back: the client is done anyway
                assert await collect(pool, request()) == TOKENS
                assert p.open == 1 and not pool.stats.outcomes  # the line waits for the prefill's answer
                p.hold.set()
                await wait_until(lambda: pool.stats.outcomes["ok"] == 1)
            await all_closed(p, d)
            assert RID not in p.aborts  # the answer was read, not cut off
            assert pool.stats.late_prefill_failures == 1  # and its failure counted
            (line,) = [r.getMessage() for r in caplog.records if r.name == "deepseek_frontend.routing.pd"]
            assert (
                "outcome=ok" in line and "late prefill answer" in line and "failed after the transfer" in line
            )

    run(scenario)


def test_a_prefill_answer_seconds_after_the_decode_ended_is_read_not_counted_as_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SGLang's prefill answers at its scheduler's next poll after the transfer -- after the forward
    in progress, seconds later under long chunked prefills -- so a short decode often ends first. The
    answer is read in the background (the client's response did not wait for it) and timed."""

    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            p.hold = asyncio.Event()
            with caplog.at_level(logging.INFO, logger="deepseek_frontend.routing.pd"):
                assert await collect(pool, request()) == TOKENS  # the client is done
                await asyncio.sleep(1.5)  # the prefill's forward in progress
                p.hold.set()
                await wait_until(lambda: pool.stats.outcomes["ok"] == 1)
            await all_closed(p, d)
            assert RID not in p.aborts and pool.stats.late_prefill_failures == 0
            lag = pool.stats.timings["prefill_lag"]
            assert lag.count == 1 and lag.total >= 1.5
            (line,) = [r for r in caplog.records if r.name == "deepseek_frontend.routing.pd"]
            assert line.levelno == logging.INFO and "outcome=ok" in line.getMessage()

    run(scenario)


def test_a_prefill_answer_missing_past_the_settle_wait_is_aborted_and_counted() -> None:
    async def scenario() -> None:
        async with sglang_pd(config=PdConfig(prefill_settle_s=0.2)) as (pool, (p,), (d,)):
            p.hold = asyncio.Event()  # never set: the prefill never answers
            assert await collect(pool, request()) == TOKENS
            await wait_until(lambda: pool.stats.outcomes["ok"] == 1)
            await all_closed(p, d)
            await wait_until(lambda: RID in p.aborts)
            assert pool.stats.late_prefill_failures == 1

    run(scenario)


def test_closing_the_pool_aborts_a_prefill_leg_whose_answer_is_awaited() -> None:
    async def scenario() -> None:
        rv = Rendezvous()
        p, d = FakeSGLangPd("prefill", rv), FakeSGLangPd("decode", rv)
        await p.start()
        await d.start()
        pool = DisaggregatedPool(sglang_pool([p.url]), sglang_pool([d.url]), PdConfig(prefill_settle_s=60))
        closed = False
        try:
            await pool.start()
            p.hold = asyncio.Event()
            assert await collect(pool, request()) == TOKENS
            assert p.open == 1
            closed = True
            await pool.aclose()  # at once, not after the settle wait
            await all_closed(p, d)
            # the leg was not late, the server was closing: not counted as a failure
            assert pool.stats.outcomes["ok"] == 1 and pool.stats.late_prefill_failures == 0
        finally:
            if not closed:
                await pool.aclose()
            await p.close()
            await d.close()

    run(scenario)


def test_a_worker_found_later_by_dns_in_another_role_gets_no_legs(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        rv = Rendezvous()
        p, good = FakeSGLangPd("prefill", rv), FakeSGLangPd("decode", rv)
        await p.start()
        await good.start()
        port = int(good.url.rsplit(":", 1)[1])
        # a prefill-mode worker behind the decode workers' DNS name (one port, another address)
        wrong = FakeSGLangPd("decode", rv, report="prefill")
        await wrong.start(host="127.0.0.2", port=port)
        addresses = ["127.0.0.1"]

        async def resolver(host: str, port: int) -> list[str]:
            return list(addresses)

        decode = WorkerPool(health_interval_s=0, max_attempts=1, router=Router())
        decode.add_dns_source(f"dns+http://decode.svc:{port}", SGLangClient, resolver=resolver)
        pool = DisaggregatedPool(sglang_pool([p.url]), decode)
        try:
            await pool.start()
            assert {s.url for s in decode.statuses()} == {good.url}
            addresses.append("127.0.0.2")
            with caplog.at_level(logging.WARNING):
                await decode.refresh_dns()  # as the DNS loop does
            assert {s.url for s in decode.statuses()} == {good.url, wrong.url}
            for i in range(6):
                assert await collect(pool, request(f"r{i}")) == TOKENS
            assert wrong.bodies == [] and len(good.bodies) == 6
            assert any(wrong.url in r.getMessage() and "prefill" in r.getMessage() for r in caplog.records)
            registry = CollectorRegistry()
            registry.register(PdCollector(pool))
            text = generate_latest(registry).decode()
            assert 'deepseek_frontend_pd_role_mismatches_total{role="decode"} 1.0' in text
            assert 'deepseek_frontend_pd_role_healthy_workers{role="decode"} 1.0' in text
            assert next(s for s in pool.statuses() if s.url == wrong.url).extra["refused"]
        finally:
            await pool.aclose()
            for f in (p, good, wrong):
                await f.close()

    run(scenario)


def test_both_routers_are_exported_with_a_role_label_and_an_aggregated_one_without() -> None:
    async def scenario() -> None:
        async with sglang_pd() as (pool, (p,), (d,)):
            assert await collect(pool, request()) == TOKENS
            registry = CollectorRegistry()
            registry.register(RoutingCollector(pool.role_routers))
            text = generate_latest(registry).decode()
            for role, url in (("prefill", p.url), ("decode", d.url)):
                decisions = f'{{reason="single-candidate",role="{role}"}} 1.0'
                assert f"deepseek_frontend_routing_decisions_total{decisions}" in text
                assert f'deepseek_frontend_routing_choose_total{{role="{role}"}} 1.0' in text
                assert (
                    f'deepseek_frontend_worker_prompt_tokens_total{{role="{role}",worker="{url}"}} 200.0'
                    in text
                )
            single = CollectorRegistry()
            single.register(RoutingCollector(pool.decode.router))  # type: ignore[arg-type]
            text = generate_latest(single).decode()
            assert 'deepseek_frontend_routing_decisions_total{reason="single-candidate"} 1.0' in text
            assert "deepseek_frontend_routing_choose_total 1.0" in text and "role=" not in text

    run(scenario)


def test_stopping_a_pair_keeps_the_callers_own_cancellation() -> None:
    """A client that leaves while a failed pair's legs are being stopped ends the request: the
    orchestrator must not swallow that cancellation and go on to start another pair."""

    async def scenario() -> None:
        closing, release = asyncio.Event(), asyncio.Event()

        async def leg() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                closing.set()
                await release.wait()  # a leg takes a moment to close its stream
                raise

        leg_task = asyncio.create_task(leg())
        went_on: list[str] = []

        async def orchestrator() -> None:
            await quietly_cancel(leg_task)
            went_on.append("the next pair")

        task = asyncio.create_task(orchestrator())
        await closing.wait()
        task.cancel()  # the client leaves now
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert went_on == [] and leg_task.cancelled()

    run(scenario)


def test_a_client_leaving_a_migrating_request_counts_once_and_leaves_no_leg(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with sglang_pd(migration_limit=2) as (pool, (p,), (d,)):
            d.mode, d.itl_s = "slow", 5.0
            with caplog.at_level(logging.INFO, logger="deepseek_frontend.routing.pd"):
                stream = pool.generate(request())
                assert (await anext(stream)).token_ids == [TOKENS[0]]
                await stream.aclose()  # type: ignore[attr-defined]
                await all_closed(p, d)
                await wait_until(lambda: RID in d.aborts)
            assert dict(pool.stats.outcomes) == {"client_gone": 1}
            lines = [r.getMessage() for r in caplog.records if r.name == "deepseek_frontend.routing.pd"]
            assert len(lines) == 1 and "outcome=client_gone" in lines[0]

    run(scenario)
