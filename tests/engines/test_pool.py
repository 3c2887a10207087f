"""WorkerPool: least-outstanding routing, retry before the first token only, ejection and re-admission."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from deepseek_frontend.engines.base import (
    DecodingConstraint,
    EngineChunk,
    EngineClient,
    GenerateRequest,
    WorkerCapabilities,
)
from deepseek_frontend.engines.pool import WorkerPool, from_urls
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import SimFaults, build_sim_app
from deepseek_frontend.errors import (
    EngineRejectedRequestError,
    EngineStreamError,
    EngineUnavailableError,
    NoHealthyWorkerError,
)

from .conftest import collect, prompt_ids, request_for, serve_app


class ScriptedWorker(EngineClient):
    """A worker whose behaviour tests set: ``mode`` ok | down | mid-stream; ``gate`` holds streams open."""

    def __init__(self, name: str, mode: str = "ok") -> None:
        self.name = name
        self.mode = mode
        self.healthy = True
        self.calls: list[str] = []
        self.closed: list[str] = []
        self.gate: asyncio.Event | None = None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        self.calls.append(request.request_id)
        if self.mode == "down":
            raise EngineUnavailableError(f"{self.name} is down")
        try:
            yield EngineChunk([7])
            if self.gate is not None:
                await self.gate.wait()
            if self.mode == "mid-stream":
                raise EngineStreamError(f"{self.name} died")
            yield EngineChunk([1], "stop", 1)
        finally:
            self.closed.append(request.request_id)

    async def abort(self, request_id: str) -> None:
        return None

    async def check_health(self) -> bool:
        return self.healthy


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_requests_go_to_the_worker_with_fewest_in_flight() -> None:
    a, b, c = ScriptedWorker("a"), ScriptedWorker("b"), ScriptedWorker("c")
    gate = asyncio.Event
    pool = WorkerPool([a, b, c], health_interval_s=0)

    async def scenario() -> None:
        a.gate = b.gate = c.gate = held = gate()
        streams = []
        for i in range(3):
            stream = pool.generate(request_for([1], rid=f"held-{i}"))
            await anext(stream)
            streams.append(stream)
        # one held stream per worker: round-robin among equals
        assert sorted(s.in_flight for s in pool.statuses()) == [1, 1, 1]
        held.set()
        for stream in streams[:2]:
            async for _ in stream:
                pass
        # the worker still holding a stream is not chosen while others are idle
        busy = next(s.url for s in pool.statuses() if s.in_flight == 1)
        a.gate = b.gate = c.gate = None
        for i in range(4):
            await collect(pool, request_for([1], rid=f"free-{i}"))
        worker = {"a": a, "b": b, "c": c}[busy]
        assert not any(call.startswith("free-") for call in worker.calls)
        async for _ in streams[2]:
            pass

    run(scenario())
    assert all(s.in_flight == 0 for s in pool.statuses())


def test_a_worker_down_before_the_first_token_is_retried_elsewhere() -> None:
    down, up = ScriptedWorker("down", "down"), ScriptedWorker("up")
    pool = WorkerPool([down, up], health_interval_s=0, eject_after_failures=5)
    results = [run(collect(pool, request_for([1], rid=f"r{i}"))) for i in range(4)]
    assert all(ids == [7, 1] for ids, _ in results)
    assert len(up.calls) == 4
    status = {s.url: s for s in pool.statuses()}
    assert status["down"].consecutive_failures == len(down.calls) >= 1


def test_a_failure_after_the_first_token_is_not_retried() -> None:
    dying, spare = ScriptedWorker("dying", "mid-stream"), ScriptedWorker("spare")
    pool = WorkerPool([dying, spare], health_interval_s=0)

    async def scenario() -> list[int]:
        got: list[int] = []
        with pytest.raises(EngineStreamError):
            # the tie between idle workers is broken by rotation; force the first pick
            pool._rr = -1
            async for chunk in pool.generate(request_for([1], rid="once")):
                got.extend(chunk.token_ids)
        return got

    assert run(scenario()) == [7]
    assert dying.calls == ["once"] and spare.calls == []


def test_consecutive_failures_eject_and_a_passing_health_check_readmits() -> None:
    flaky, steady = ScriptedWorker("flaky", "down"), ScriptedWorker("steady")
    pool = WorkerPool([flaky, steady], health_interval_s=0, eject_after_failures=2, readmit_after_s=3600)
    changes: list[tuple[str, bool]] = []
    pool.on_change = lambda status: changes.append((status.url, status.healthy))
    for i in range(6):
        run(collect(pool, request_for([1], rid=f"r{i}")))
    assert len(flaky.calls) == 2  # ejected after two failures, then skipped
    assert not next(s for s in pool.statuses() if s.url == "flaky").healthy
    flaky.healthy = False
    run(pool.check_all())
    assert not next(s for s in pool.statuses() if s.url == "flaky").healthy
    flaky.healthy, flaky.mode = True, "ok"
    run(pool.check_all())
    assert next(s for s in pool.statuses() if s.url == "flaky").healthy
    assert changes == [("flaky", False), ("flaky", True)]


def test_failed_health_checks_eject_a_worker() -> None:
    sick = ScriptedWorker("sick")
    pool = WorkerPool([sick, ScriptedWorker("well")], health_interval_s=0, eject_after_failures=2)
    sick.healthy = False
    run(pool.check_all())
    assert pool.healthy_count == 2
    run(pool.check_all())
    assert pool.healthy_count == 1


def test_no_admitted_worker_raises_no_healthy_worker() -> None:
    pool = WorkerPool([ScriptedWorker("a", "down"), ScriptedWorker("b", "down")], health_interval_s=0)
    with pytest.raises(NoHealthyWorkerError, match="a is down"):
        run(collect(pool, request_for([1])))
    empty = WorkerPool([], health_interval_s=0)
    with pytest.raises(NoHealthyWorkerError):
        run(collect(empty, request_for([1])))


def test_an_ejected_worker_gets_a_trial_request_after_the_readmit_wait() -> None:
    now = [0.0]
    worker = ScriptedWorker("only", "down")
    pool = WorkerPool(
        [worker], health_interval_s=0, eject_after_failures=1, readmit_after_s=10, clock=lambda: now[0]
    )
    with pytest.raises(NoHealthyWorkerError):
        run(collect(pool, request_for([1])))
    with pytest.raises(NoHealthyWorkerError):
        run(collect(pool, request_for([1])))
    assert len(worker.calls) == 1  # ejected: not tried again yet
    worker.mode = "ok"
    now[0] = 11.0
    ids, _ = run(collect(pool, request_for([1])))
    assert ids == [7, 1] and pool.healthy_count == 1


def test_closing_a_pool_stream_early_closes_the_worker_stream() -> None:
    worker = ScriptedWorker("w")
    worker.gate = asyncio.Event()
    pool = WorkerPool([worker], health_interval_s=0)

    async def scenario() -> None:
        stream = pool.generate(request_for([1], rid="early"))
        await anext(stream)
        await stream.aclose()

    run(scenario())
    assert worker.closed == ["early"] and pool.in_flight == 0


def test_pool_over_sim_servers_retries_a_failing_worker(prompt_tokenizer: Any) -> None:
    """Real HTTP: one sim worker fails every request before the first token, the other serves."""
    ids = prompt_ids("Reply with exactly: pooled")

    async def scenario() -> list[list[int]]:
        broken = build_sim_app(
            SimulatedEngine(prompt_tokenizer), faults=SimFaults(fail_after=0, fail_mode="http-500")
        )
        good = build_sim_app(SimulatedEngine(prompt_tokenizer))
        async with serve_app(broken) as bad_url, serve_app(good) as good_url:
            # no health probes: the broken worker answers them, and a probe landing after the
            # ejection would re-admit it while the three requests run
            pool = from_urls("sglang", [bad_url, good_url], health_interval_s=0, eject_after_failures=1)
            await pool.start()
            try:
                outs = [(await collect(pool, request_for(ids, rid=f"p{i}")))[0] for i in range(3)]
                assert [s.healthy for s in pool.statuses()] == [False, True]
                return outs
            finally:
                await pool.aclose()

    outs = run(scenario())
    assert all(prompt_tokenizer.decode(out) == "pooled<｜end▁of▁sentence｜>" for out in outs)


def test_dns_source_adds_one_worker_per_address() -> None:
    async def scenario() -> list[str]:
        pool = from_urls("sglang", ["dns+http://localhost:30000"], health_interval_s=0)
        await pool.start()
        try:
            return sorted(s.url for s in pool.statuses())
        finally:
            await pool.aclose()

    urls = run(scenario())
    assert urls and all(u.endswith(":30000") and u.startswith("http://") for u in urls)
    assert "http://127.0.0.1:30000" in urls


def test_from_urls_builds_clients_of_the_requested_engine() -> None:
    pool = from_urls("sglang", ["http://a:1", "http://b:2/"], health_interval_s=0)
    assert [s.url for s in pool.statuses()] == ["http://a:1", "http://b:2"]
    assert all(isinstance(w.client, SGLangClient) for w in pool._workers)
    with pytest.raises(ValueError, match="model"):
        from_urls("vllm", ["http://a:1"])
    run(pool.aclose())


def test_dns_refresh_adds_new_addresses_and_drops_vanished_ones() -> None:
    pool = WorkerPool([], health_interval_s=0)
    made: dict[str, ScriptedWorker] = {}

    def factory(url: str) -> EngineClient:
        made[url] = ScriptedWorker(url)
        return made[url]

    answers = iter([["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.3"], ["fd00::1"]])
    asked: list[tuple[str, int]] = []

    async def fake_resolver(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return next(answers)

    pool.add_dns_source("dns+http://workers.ns.svc:30000", factory, resolver=fake_resolver)

    async def scenario() -> list[list[str]]:
        seen = []
        await pool.refresh_dns()
        seen.append([s.url for s in pool.statuses()])
        await pool.refresh_dns()
        seen.append([s.url for s in pool.statuses()])
        await pool.refresh_dns()
        seen.append([s.url for s in pool.statuses()])
        return seen

    assert run(scenario()) == [
        ["http://10.0.0.1:30000", "http://10.0.0.2:30000"],
        ["http://10.0.0.2:30000", "http://10.0.0.3:30000"],
        ["http://[fd00::1]:30000"],
    ]
    assert asked[0] == ("workers.ns.svc", 30000)


# ---------------------------------------------------------------- client errors, capabilities


class RefusingWorker(ScriptedWorker):
    """Refuses every request the way an engine refuses an invalid one (the client's error)."""

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        self.calls.append(request.request_id)
        raise EngineRejectedRequestError("the engine rejected the request: too long", status_code=400)
        yield EngineChunk([])  # pragma: no cover - makes this an async generator


class DiscoveringWorker(ScriptedWorker):
    """A worker that reports ``caps`` through discover()."""

    def __init__(self, name: str, caps: WorkerCapabilities | None) -> None:
        super().__init__(name)
        self.caps = caps
        self.discovered = 0

    async def discover(self) -> WorkerCapabilities | None:
        self.discovered += 1
        return self.caps


def test_a_rejected_request_is_not_retried_and_never_counts_against_the_worker() -> None:
    picky, other = RefusingWorker("picky"), ScriptedWorker("other")
    pool = WorkerPool([picky], health_interval_s=0, eject_after_failures=1)
    for i in range(5):
        with pytest.raises(EngineRejectedRequestError, match="too long"):
            run(collect(pool, request_for([1], rid=f"r{i}")))
    (status,) = pool.statuses()
    assert status.healthy and status.consecutive_failures == 0 and status.extra["failures"] == 0
    assert len(picky.calls) == 5
    pool = WorkerPool([picky, other], health_interval_s=0, max_attempts=2)
    picky.calls.clear()
    outcomes = []
    for i in range(4):
        try:
            run(collect(pool, request_for([1], rid=f"s{i}")))
            outcomes.append("ok")
        except EngineRejectedRequestError:
            outcomes.append("rejected")
    # whichever worker refused answered the client: nothing moved to the other worker
    assert outcomes.count("rejected") == len(picky.calls) and len(other.calls) == outcomes.count("ok")


def test_constrained_requests_go_only_to_workers_with_a_grammar_backend() -> None:
    bare = DiscoveringWorker(
        "bare", WorkerCapabilities(constraint_kinds=frozenset(), reserved_output_tokens=4)
    )
    full = DiscoveringWorker(
        "full", WorkerCapabilities(constraint_kinds=frozenset({"ebnf", "json_schema"}), context_length=8192)
    )
    pool = WorkerPool([bare, full], health_interval_s=0)
    assert pool.capabilities() is None and pool.supports_constraint("ebnf")  # nothing learned yet
    run(pool.start())
    assert bare.discovered == 1 and full.discovered == 1
    caps = pool.capabilities()
    assert caps is not None
    assert caps.constraint_kinds == {"ebnf", "json_schema"}
    assert caps.reserved_output_tokens == 4 and caps.context_length == 8192
    assert pool.supports_constraint("ebnf") and not pool.supports_constraint("regex")
    constrained = request_for([1], constraint=DecodingConstraint("ebnf", 'root ::= "x"'))
    for i in range(4):
        run(collect(pool, constrained))
        run(collect(pool, request_for([1], rid=f"plain{i}")))
    assert bare.calls and all(rid.startswith("plain") for rid in bare.calls)  # plain ones spread over both
    assert full.calls.count("req-1") == 4  # every constrained one went to the worker with a backend
    run(pool.aclose())


def test_a_readmitted_worker_is_asked_its_capabilities_again() -> None:
    worker = DiscoveringWorker("w", WorkerCapabilities(constraint_kinds=frozenset()))
    pool = WorkerPool([worker], health_interval_s=0, eject_after_failures=1)
    run(pool.discover())
    worker.healthy = False
    run(pool.check_all())
    assert pool.healthy_count == 0
    worker.caps = WorkerCapabilities(constraint_kinds=frozenset({"ebnf"}))  # restarted with a backend
    worker.healthy = True

    async def readmit() -> None:
        await pool.check_all()
        await asyncio.gather(*pool._discoveries)  # the re-admission's discovery runs in the background

    run(readmit())
    assert worker.discovered == 2 and pool.supports_constraint("ebnf")


def test_an_unreachable_worker_is_not_reported_healthy_after_its_discovery_failed() -> None:
    """Its discovery did not answer and its probe fails: out at once, not after three failed probes
    of the health loop; a probe that passes later re-admits it."""
    unreachable = SGLangClient("http://127.0.0.1:9")  # nothing listens on port 9
    pool = WorkerPool([unreachable], health_interval_s=0)

    async def scenario() -> None:
        await pool.start()
        [status] = pool.statuses()
        assert status.healthy is False and "unreachable at start" in (status.last_error or "")
        assert pool.healthy_count == 0
        await pool.aclose()

    asyncio.run(scenario())


def test_a_worker_that_answers_its_probe_but_not_discovery_stays_admitted() -> None:
    worker = ScriptedWorker("w")  # discover() says nothing; its probe passes
    pool = WorkerPool([worker], health_interval_s=0)

    async def scenario() -> None:
        await pool.start()
        [status] = pool.statuses()
        assert status.healthy is True
        ids, _ = await collect(pool, request_for([1]))
        assert ids == [7, 1]
        await pool.aclose()

    asyncio.run(scenario())


def test_a_worker_the_vet_refuses_at_start_stops_a_pool_that_refuses_at_start(prompt_tokenizer: Any) -> None:
    from deepseek_frontend.engines.upkeep import WorkerRoleError, aggregated_role_refusal

    engine = SimulatedEngine(prompt_tokenizer)

    async def scenario() -> None:
        async with serve_app(build_sim_app(engine)) as plain:
            pool = from_urls("sglang", [plain], health_interval_s=0, discover_in_background=True)
            pool.vet, pool.refuse_at_start = aggregated_role_refusal, True
            await pool.start()  # an aggregated worker: accepted
            assert pool.healthy_count == 1
            await pool.aclose()

    asyncio.run(scenario())
    refused = WorkerCapabilities(extra={"disaggregation_mode": "decode"})
    message = aggregated_role_refusal("http://w", refused)
    assert message is not None and message.startswith('http://w reports disaggregation_mode "decode"')
    assert issubclass(WorkerRoleError, ValueError)
