"""The vLLM prefill/decode flows (disagg/pool.py, disagg/mooncake.py) against fake vLLM workers over real
HTTP (tests/disagg/fakes.py ``FakeVllmPd``, which checks what vLLM 0.32/0.33 checks):

* the prefill leg carries nothing that conflicts with its one token (``min_tokens``: vLLM's 400) or
  lets that token stop it (EOS, stop ids: a MooncakeConnector prefill that finishes by stop frees its
  KV);
* MooncakeConnector as smg drives it: a minted ``transfer_id``, the decode's params built from the
  prefill worker's bootstrap server, a data-parallel rank pinned with ``X-data-parallel-rank``;
* connectors and KV roles a dev-mode ``/server_info`` reports are checked at start;
* the decode worker's place is held before the prefill runs: a full decode role refuses (429) before
  any prefill is computed for nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from deepseek_frontend.disagg.pool import DisaggregatedPool, PdConfig, RoleMismatchError
from deepseek_frontend.engines.base import DecodingConstraint, GenerateRequest, SamplingParams
from deepseek_frontend.engines.pool import StreamLimits, WorkerPool, from_urls
from deepseek_frontend.errors import NoHealthyWorkerError, OverloadedError
from deepseek_frontend.routing.router import Router
from tests.engines.conftest import wait_until

from .fakes import EOS, TOKENS, FakeVllmPd
from .test_pool import PROMPT, RID, all_closed, collect, request, run, vllm_pd


def vllm_pool(url: str, limits: StreamLimits | None = None) -> WorkerPool:
    return from_urls(
        "vllm",
        [url],
        model="m",
        health_interval_s=0,
        max_attempts=1,
        router=Router(),
        limits=limits,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def mooncake_pd(
    ranks: int = 1, **config: Any
) -> AsyncIterator[tuple[DisaggregatedPool, FakeVllmPd, FakeVllmPd]]:
    """A MooncakeConnector pair whose dev-mode ``/server_info`` reports the connector, the roles and
    the prefill's bootstrap port (``VLLM_MOONCAKE_BOOTSTRAP_PORT``)."""
    p = FakeVllmPd(
        "prefill",
        "engine-p",
        connector="mooncake",
        ranks=ranks,
        report={"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"},
    )
    d = FakeVllmPd(
        "decode",
        "engine-d",
        connector="mooncake",
        report={"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"},
    )
    d.prefills.append(p)
    await p.start()
    await d.start()
    pool = DisaggregatedPool(
        vllm_pool(p.url), vllm_pool(d.url), PdConfig(engine="vllm", kv_connector="mooncake", **config)
    )
    try:
        await pool.start()
        yield pool, p, d
    finally:
        await pool.aclose()
        await p.close()
        await d.close()


def test_the_prefill_leg_carries_nothing_that_conflicts_with_its_one_token() -> None:
    sampling = SamplingParams(
        max_new_tokens=5,
        temperature=0.0,
        seed=7,
        min_new_tokens=3,
        stop_token_ids=(9,),
        logprobs=True,
        top_logprobs=2,
        constraint=DecodingConstraint("regex", "[0-9]+"),
    )

    async def scenario() -> None:
        async with vllm_pd() as (pool, p, d):
            assert await collect(pool, GenerateRequest("req-1", list(PROMPT), sampling)) == TOKENS
            await all_closed(p, d)
            (pb,), (db,) = p.bodies, d.bodies
            # one token, no min_tokens (vLLM: 400 above max_tokens), no stop on EOS or a stop id,
            # nothing the discarded token needs (logprobs, a grammar); the rest as asked
            assert pb["max_tokens"] == 1 and "min_tokens" not in pb and pb["ignore_eos"] is True
            assert pb["stop_token_ids"] == [] and "logprobs" not in pb and "structured_outputs" not in pb
            assert (pb["seed"], pb["temperature"]) == (7, 0.0)
            # the decode leg is the request as the client asked it
            assert db["max_tokens"] == 5 and db["min_tokens"] == 3 and db["stop_token_ids"] == [9]
            assert db["logprobs"] == 2 and db["structured_outputs"] == {"regex": "[0-9]+"}
            assert "ignore_eos" not in db

    run(scenario)


def test_mooncake_legs_carry_a_minted_transfer_id_and_the_decode_params_built_from_the_bootstrap_server() -> (
    None
):
    async def scenario() -> None:
        async with mooncake_pd() as (pool, p, d):
            assert await collect(pool, request()) == TOKENS
            await all_closed(p, d)
            await wait_until(lambda: pool.stats.outcomes["ok"] == 1)
            (pb,), (db,) = p.bodies, d.bodies
            sent = pb["kv_transfer_params"]
            assert set(sent) == {"do_remote_decode", "do_remote_prefill", "transfer_id"}
            assert sent["do_remote_decode"] is True and sent["do_remote_prefill"] is False
            transfer = sent["transfer_id"]
            assert transfer.startswith("xfer-") and len(transfer) > 20
            assert db["kv_transfer_params"] == {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "transfer_id": transfer,
                "remote_engine_id": "engine-p",
                "remote_bootstrap_addr": "http://127.0.0.1:" + p.bootstrap_url.rsplit(":", 1)[1],
            }
            assert pb["request_id"] == db["request_id"] == RID
            assert "x-data-parallel-rank" not in p.headers[0]  # one rank: nothing to pin
            # the next pair gets its own transfer
            assert await collect(pool, request("req-2")) == TOKENS
            assert p.bodies[1]["kv_transfer_params"]["transfer_id"] != transfer

    run(scenario)


def test_a_mooncake_prefill_whose_one_token_is_eos_still_keeps_its_kv() -> None:
    """vLLM checks EOS and stop ids before the length: a prefill that samples EOS as its one token
    finishes by stop, and MooncakeConnector frees the KV of any prefill that did not finish by
    length. The prefill leg ignores EOS and sends no stop ids, so it always finishes by length."""

    async def scenario() -> None:
        async with mooncake_pd() as (pool, p, _):
            p.first = EOS
            eos_stopped = SamplingParams(max_new_tokens=5, temperature=0.0, stop_token_ids=(EOS,))
            assert await collect(pool, GenerateRequest("req-1", list(PROMPT), eos_stopped)) == TOKENS
            assert pool.stats.bootstrap_failures == 0 and len(p.bodies) == 1

    run(scenario)


def test_a_mooncake_prefill_with_several_dp_ranks_is_pinned_to_the_rank_whose_engine_the_decode_names() -> (
    None
):
    async def scenario() -> None:
        async with mooncake_pd(ranks=2) as (pool, p, d):
            for i in range(4):
                assert await collect(pool, request(f"r{i}")) == TOKENS
            ranks = [h["x-data-parallel-rank"] for h in p.headers]
            assert sorted(set(ranks)) == ["0", "1"]  # spread over the ranks
            for rank, body in zip(ranks, d.bodies, strict=True):
                assert body["kv_transfer_params"]["remote_engine_id"] == f"engine-p_dp{rank}"

    run(scenario)


def test_a_mooncake_bootstrap_server_that_cannot_be_read_fails_the_pair_without_a_decode_leg() -> None:
    async def scenario() -> None:
        async with mooncake_pd(bootstrap_port=9) as (pool, p, d):  # nothing listens on port 9
            with pytest.raises(NoHealthyWorkerError) as err:
                await collect(pool, request())
            assert (
                "Mooncake bootstrap server" in err.value.message and "127.0.0.1:9/query" in err.value.message
            )
            assert p.bodies == [] and d.bodies == []
            assert pool.stats.outcomes["prefill_failed"] == 1

    run(scenario)


@pytest.mark.parametrize(
    ("role", "report", "config", "message"),
    [
        (
            "prefill",
            {"kv_connector": "P2pNcclConnector", "kv_role": "kv_producer"},
            {},
            "uses vLLM's P2pNcclConnector, which serve cannot drive",
        ),
        (
            "prefill",
            {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"},
            {},
            "start serve with --vllm-kv-connector mooncake",
        ),
        (
            "decode",
            {"kv_connector": "NixlConnector", "kv_role": "kv_producer"},
            {},
            'was given as --decode-worker but its kv_transfer_config says kv_role "kv_producer"',
        ),
    ],
)
def test_a_vllm_worker_reporting_a_connector_or_role_that_cannot_serve_stops_the_start(
    role: str, report: dict[str, str], config: dict[str, Any], message: str
) -> None:
    async def scenario() -> None:
        odd = FakeVllmPd(role, "engine-x", report=report)
        other = FakeVllmPd("decode" if role == "prefill" else "prefill", "engine-y")
        await odd.start()
        await other.start()
        urls = (odd.url, other.url) if role == "prefill" else (other.url, odd.url)
        pool = DisaggregatedPool(vllm_pool(urls[0]), vllm_pool(urls[1]), PdConfig(engine="vllm", **config))
        try:
            with pytest.raises(RoleMismatchError) as err:
                await pool.start()
            assert odd.url in str(err.value) and message in str(err.value)
            assert "\n" not in str(err.value)
        finally:
            await pool.aclose()
            await odd.close()
            await other.close()

    run(scenario)


def test_a_full_decode_role_refuses_before_a_prefill_is_computed_for_nothing() -> None:
    limits = StreamLimits(max_in_flight_per_worker=1, capacity_wait_s=0.5)

    async def scenario() -> None:
        async with vllm_pd(limits=limits) as (pool, p, d):
            d.mode = "hang"  # the first request's decode holds the decode worker's one place
            first = asyncio.create_task(collect(pool, request()))
            await wait_until(lambda: d.open == 1)
            with pytest.raises(OverloadedError) as err:
                await collect(pool, request("req-2"))
            assert err.value.status_code == 429
            assert len(p.bodies) == 1, "no prefill ran for a request no decode worker could take"
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            await all_closed(p, d)
            d.mode = "ok"
            assert await collect(pool, request("req-3")) == TOKENS  # the place is free again
            assert pool.prefill.in_flight == pool.decode.in_flight == 0

    run(scenario)


def test_a_request_waits_for_the_decode_place_and_then_runs() -> None:
    limits = StreamLimits(max_in_flight_per_worker=1, capacity_wait_s=10)

    async def scenario() -> None:
        async with vllm_pd(limits=limits) as (pool, p, d):
            d.mode = "hang"
            first = asyncio.create_task(collect(pool, request()))
            await wait_until(lambda: d.open == 1)
            second = asyncio.create_task(collect(pool, request("req-2")))
            await asyncio.sleep(0.3)
            assert len(p.bodies) == 1 and not second.done()  # waiting for the place, its prefill not sent
            d.mode = "ok"
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert await second == TOKENS
            assert len(p.bodies) == 2

    run(scenario)
