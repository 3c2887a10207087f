"""Mid-stream migration through the pool over real HTTP (sim workers speaking SGLang's protocol).

The continued output must equal an uninterrupted greedy run; grammar-constrained requests, client
cancellations and exhausted limits are never migrated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from deepseek_frontend.engines.base import DecodingConstraint
from deepseek_frontend.engines.pool import from_urls
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import SimFaults, build_sim_app
from deepseek_frontend.errors import EngineStreamError
from deepseek_frontend.routing import Router, RouterConfig
from tests.engines.conftest import collect, prompt_ids, request_for, serve_app, wait_until
from tests.support.tokenizers import bundled_tokenizer


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


def reference(ids: list[int], **sampling: object) -> list[int]:
    """What one healthy worker writes for the request, uninterrupted."""
    out, _ = asyncio.run(collect(SimulatedEngine(bundled_tokenizer()), request_for(ids, **sampling)))
    return out


@pytest.mark.parametrize("fail_mode", ["disconnect", "error-event"])
def test_a_stream_broken_mid_response_continues_on_another_worker_unchanged(fail_mode: str) -> None:
    ids = prompt_ids("write 40 words about the sea")
    expected = reference(ids, temperature=0.0)
    assert len(expected) > 20

    async def scenario() -> None:
        tok = bundled_tokenizer()
        flaky_engine, steady_engine = SimulatedEngine(tok), SimulatedEngine(tok)
        flaky = build_sim_app(flaky_engine, faults=SimFaults(fail_after=7, fail_mode=fail_mode))  # type: ignore[arg-type]
        async with serve_app(flaky) as bad, serve_app(build_sim_app(steady_engine)) as good:
            router = Router(RouterConfig(mode="round-robin"))
            pool = from_urls("sglang", [bad, good], router=router, migration_limit=2, health_interval_s=0)
            try:
                outputs = []
                for n in range(2):  # round robin: one of the two requests starts on the flaky worker
                    out, chunks = await collect(pool, request_for(ids, rid=f"m{n}", temperature=0.0))
                    outputs.append(out)
                    last = chunks[-1]
                    assert last.finish_reason == "stop"
                    assert last.prompt_tokens == len(ids), "usage counts the client's prompt only"
                    assert last.completion_tokens == len(expected)
                assert outputs == [expected, expected]
                assert router.migrations == 1
                assert flaky_engine.stats.failed + flaky_engine.stats.aborted >= 1
            finally:
                await pool.aclose()

    run(scenario)


async def _with_one_flaky_worker(
    test: Callable[..., Awaitable[None]], *, limit: int = 2, fail_after: int = 7
) -> None:
    tok = bundled_tokenizer()
    flaky_engine, steady_engine = SimulatedEngine(tok), SimulatedEngine(tok)
    flaky = build_sim_app(flaky_engine, faults=SimFaults(fail_after=fail_after, fail_mode="disconnect"))
    async with serve_app(flaky) as bad, serve_app(build_sim_app(steady_engine)) as good:
        # session affinity pins the test's session to the flaky worker
        router = Router(RouterConfig(mode="session"))
        pool = from_urls("sglang", [bad, good], router=router, migration_limit=limit, health_interval_s=0)
        pool.router._sessions["pinned"] = (bad, None)  # type: ignore[union-attr]
        from deepseek_frontend.routing.session import use_session

        use_session("pinned")
        try:
            await test(pool, router, steady_engine, flaky_engine)
        finally:
            use_session(None)
            await pool.aclose()


def test_grammar_constrained_requests_are_never_migrated() -> None:
    ids = prompt_ids("give me a JSON object")

    async def check(pool, router, steady, flaky) -> None:  # type: ignore[no-untyped-def]
        constraint = DecodingConstraint("json_schema", '{"type": "object"}')
        with pytest.raises(EngineStreamError):
            await collect(pool, request_for(ids, rid="g", temperature=0.0, constraint=constraint))
        assert router.migrations == 0 and steady.stats.started == 0

    run(lambda: _with_one_flaky_worker(check, fail_after=1))


def test_the_migration_limit_bounds_retries() -> None:
    ids = prompt_ids("write 40 words about the sea")

    async def check(pool, router, steady, flaky) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(EngineStreamError):
            await collect(pool, request_for(ids, rid="l", temperature=0.0))
        assert router.migrations == 0 and steady.stats.started == 0

    run(lambda: _with_one_flaky_worker(check, limit=0))


def test_a_client_cancel_is_not_migrated() -> None:
    ids = prompt_ids("write 40 words about the sea")

    async def check(pool, router, steady, flaky) -> None:  # type: ignore[no-untyped-def]
        stream = pool.generate(request_for(ids, rid="c", temperature=0.0))
        await anext(stream)
        await stream.aclose()  # the client went away before the fault point
        assert router.migrations == 0 and steady.stats.started == 0
        # closing the stream aborts the engine request at once (not when the generator is collected)
        await wait_until(lambda: flaky.stats.aborted == 1)
        assert pool.in_flight == 0

    run(lambda: _with_one_flaky_worker(check, fail_after=50))
