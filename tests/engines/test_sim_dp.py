"""``sim-engine --attn-dp-size N`` behaves as SGLang 0.5.23 with attention data parallelism: a cache,
scheduler and KV event publisher per rank; ``routed_dp_rank`` honoured, an out-of-range rank refused
the way the tokenizer manager refuses it, round robin without one; ``/server_info`` reporting
``attn_dp_size N``, ``dp_size 1`` and the ``kv_events`` descriptor (its ``dp_size`` counting ranks,
its ``kv_events_config`` a JSON string). Over real HTTP and ZMQ."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httpx
import pytest

from deepseek_frontend.routing.events import BlockStored, decode_batch
from tests.support.servers import Server, start_sim_engine

pytestmark = pytest.mark.slow

PAGE = 16
RANKS = 4


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 100_000) for _ in range(n)]


def generate(server: Server, prompt: list[int], **fields: Any) -> tuple[int, dict[str, Any]]:
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4}, "stream": False, **fields}
    r = httpx.post(server.url + "/generate", json=body, timeout=30)
    return r.status_code, r.json()


@pytest.fixture(scope="module")
def dp_sim() -> Any:
    config = {"publisher": "zmq", "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"}
    with start_sim_engine(
        "--attn-dp-size",
        str(RANKS),
        "--kv-cache-tokens",
        "100000",
        "--kv-page-size",
        str(PAGE),
        "--kv-events-config",
        json.dumps(config),
    ) as server:
        yield server


def test_server_info_reports_the_ranks_and_describes_every_ranks_publisher(dp_sim: Server) -> None:
    info = httpx.get(dp_sim.url + "/server_info").json()
    assert info["attn_dp_size"] == RANKS and info["dp_size"] == 1
    descriptor = info["kv_events"]
    assert descriptor["dp_size"] == RANKS and descriptor["block_size"] == PAGE
    assert descriptor["publisher"] == "zmq" and descriptor["topic"] == ""
    # a wildcard endpoint binds loopback unless --kv-events-host says otherwise, and says so
    assert descriptor["endpoint_host"] == "127.0.0.1"
    assert isinstance(info["kv_events_config"], str)
    assert json.loads(info["kv_events_config"])["publisher"] == "zmq"
    log = dp_sim.log()
    base = descriptor["endpoint_port_base"]
    for rank in range(RANKS):
        assert f"KV events of rank {rank} on tcp://127.0.0.1:{base + rank}" in log


def test_a_routed_rank_is_honoured_and_keeps_its_own_cache(dp_sim: Server) -> None:
    prompt = ids(PAGE * 8, 1)
    assert generate(dp_sim, prompt, routed_dp_rank=2)[0] == 200
    status, again = generate(dp_sim, [*prompt, 7], routed_dp_rank=2)
    assert status == 200 and again["meta_info"]["cached_tokens"] == PAGE * 8
    status, elsewhere = generate(dp_sim, [*prompt, 7], routed_dp_rank=1)
    assert elsewhere["meta_info"]["cached_tokens"] == 0, "rank 1 has its own, empty cache"
    # the deprecated alias works too
    status, alias = generate(dp_sim, [*prompt, 8], data_parallel_rank=2)
    assert alias["meta_info"]["cached_tokens"] == PAGE * 8


def test_an_out_of_range_rank_is_refused_as_sglang_refuses_it(dp_sim: Server) -> None:
    for rank in (RANKS, -1):
        status, body = generate(dp_sim, ids(40, 2), routed_dp_rank=rank)
        assert status == 400
        assert body["error"]["message"] == f"routed_dp_rank={rank} out of range [0, {RANKS})"


def test_without_a_rank_requests_go_round_robin(dp_sim: Server) -> None:
    prompt = ids(PAGE * 4, 3)
    cached = [generate(dp_sim, [*prompt, n])[1]["meta_info"]["cached_tokens"] for n in range(2 * RANKS)]
    # each rank sees the prompt once before it caches it: RANKS misses, then RANKS hits
    assert cached == [0] * RANKS + [PAGE * 4] * RANKS


def test_each_rank_publishes_on_its_own_port() -> None:
    async def scenario() -> None:
        info = httpx.get(server.url + "/server_info").json()["kv_events"]
        ctx = zmq.asyncio.Context.instance()
        socks = []
        for rank in range(2):
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(f"tcp://127.0.0.1:{info['endpoint_port_base'] + rank}")
            socks.append(sub)
        try:
            prompt = ids(PAGE * 3, 4)
            got: dict[int, Any] = {}
            for _ in range(100):  # a SUB joins asynchronously: send until each rank's batch arrives
                for rank in range(2):
                    if rank not in got:
                        await asyncio.to_thread(generate, server, [*prompt, _], routed_dp_rank=rank)
                for rank, sub in enumerate(socks):
                    if rank not in got and await sub.poll(50):
                        got[rank] = decode_batch((await sub.recv_multipart())[2])
                if len(got) == 2:
                    break
            assert set(got) == {0, 1}
            for rank, batch in got.items():
                assert batch.dp_rank == rank
                assert any(isinstance(e, BlockStored) for e in batch.events)
        finally:
            for sub in socks:
                sub.close(linger=0)

    import zmq.asyncio

    config = {"publisher": "zmq", "endpoint": "tcp://*:0"}
    with start_sim_engine(
        "--attn-dp-size", "2", "--kv-cache-tokens", "10000", "--kv-page-size", str(PAGE),
        "--kv-events-config", json.dumps(config),
    ) as server:  # fmt: skip
        asyncio.run(asyncio.wait_for(scenario(), 60))
