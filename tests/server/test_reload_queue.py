"""The reloader's queue, in process: SIGHUPs during a reload make exactly one more reload, which
reads the file as it is then; a reload that adds a concurrency limit counts the key's requests in
flight; a removed key's limits record is freed."""

from __future__ import annotations

import asyncio
import hashlib
import threading

from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.fleet.config_file import Fleet
from deepseek_frontend.keys.rate_limits import Admission, Refusal
from deepseek_frontend.keys.tenants import Tenant, TenantLimits, TenantTable
from deepseek_frontend.server.app import create_app
from deepseek_frontend.server.reload import FleetReloader
from deepseek_frontend.tokenization import PromptTokenizer

#: seconds any wait of these tests may take before it fails
DEADLINE_S = 30.0


def table(**limits: TenantLimits) -> TenantTable:
    return TenantTable(
        [Tenant(name, hashlib.sha256(name.encode()).digest(), None, lim) for name, lim in limits.items()]
    )


def test_sighups_during_a_reload_make_one_more_reload_reading_the_last_file(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    config = ServerConfig(ModelConfig(served_model_name="m1", context_length=8192), server=ServerOptions())
    files = {"now": table(alice=TenantLimits())}
    reads: list[TenantTable] = []
    entered = threading.Event()
    release = threading.Event()

    def load() -> Fleet:
        read = files["now"]  # the file as it is when the reload starts reading it
        reads.append(read)
        entered.set()
        if len(reads) == 1 and not release.wait(DEADLINE_S):
            raise AssertionError("the first reload was never released")
        return Fleet((config,), read)

    app = create_app(config, tokenizer=prompt_tokenizer, fleet=Fleet((config,), files["now"]))
    state = app.frontend

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            reloader = FleetReloader(state, load)
            files["now"] = table(alice=TenantLimits(), bob=TenantLimits())
            reloader.request()
            assert await asyncio.to_thread(entered.wait, DEADLINE_S)
            # while the first reload reads, the file changes five times, each followed by a SIGHUP
            for generation in range(5):
                files["now"] = table(carol=TenantLimits(requests_per_minute=generation + 1))
                reloader.request()
            assert reloader.pending and reloader.requested == 6
            release.set()
            async with asyncio.timeout(DEADLINE_S):
                while reloader.pending:
                    await asyncio.sleep(0.01)
            assert len(reads) == 2  # one more reload for the five SIGHUPs, not five and not none
            assert (reloader.applied, reloader.failed) == (2, 0)
            assert state.tenants is not None and state.tenants.names == ("carol",)
            carol = state.tenants.by_name("carol")
            assert carol is not None and carol.limits.requests_per_minute == 5
            await reloader.aclose()

    asyncio.run(scenario())


def test_a_reload_counts_requests_in_flight_against_a_new_limit_and_frees_removed_keys(
    prompt_tokenizer: PromptTokenizer,
) -> None:
    config = ServerConfig(ModelConfig(served_model_name="m1", context_length=8192), server=ServerOptions())
    first = table(dave=TenantLimits(), erin=TenantLimits(requests_per_minute=6))
    second = table(dave=TenantLimits(concurrent_requests=2))
    app = create_app(config, tokenizer=prompt_tokenizer, fleet=Fleet((config,), first))
    state = app.frontend
    limiter = state.limiter
    assert limiter is not None

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            dave, erin = first.by_name("dave"), first.by_name("erin")
            assert dave is not None and erin is not None
            running = [limiter.admit(dave) for _ in range(3)]
            assert all(isinstance(r, Admission) for r in running)
            done = limiter.admit(erin)
            assert isinstance(done, Admission)
            done.release()
            assert limiter.stats().used == 1  # erin's record; dave has no limits yet
            await FleetReloader(state, lambda: Fleet((config,), second)).apply(Fleet((config,), second))
            capped = second.by_name("dave")
            assert capped is not None
            refusal = limiter.admit(capped)
            assert isinstance(refusal, Refusal) and "in flight 3" in refusal.message
            assert limiter.stats().used == 1  # erin's record freed, dave's made for his limit
            for admission in running:
                assert isinstance(admission, Admission)
                admission.release()
            assert isinstance(limiter.admit(capped), Admission)

    asyncio.run(scenario())
