"""The router's targets are (worker, data-parallel rank): per-rank index and load, the rank it sends,
its own decisions counted until events arrive, DeepSeek-V4's sliding window capping hits, and the
workers' per-rank load (routing/router.py, swa.py, load.py)."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
import zmq

from deepseek_frontend.engines.dispatch import with_rank
from deepseek_frontend.generation import WorkerCapabilities
from deepseek_frontend.routing.events import decode_batch
from deepseek_frontend.routing.hashing import block_hashes
from deepseek_frontend.routing.load import decode_load_stat
from deepseek_frontend.routing.router import Router, RouterConfig
from tests.routing.common import PAGE, W, ids, req
from tests.support.servers import free_port


def dp_router(mode: str = "kv-approx", ranks: int = 4, **info: object) -> Router:
    r = Router(RouterConfig(mode=mode, page_size=PAGE), clock=lambda: 0.0)  # type: ignore[arg-type]
    for url in ("a", "b"):
        r.worker_added(url, WorkerCapabilities(extra={"attn_dp_size": ranks, "dp_size": 1, **info}))
    return r


def test_a_follow_up_goes_to_the_rank_that_holds_its_prefix_and_names_it() -> None:
    r = dp_router()
    workers = [W("a"), W("b")]
    firsts = {}
    for n in range(8):  # eight conversations spread over 2 workers x 4 ranks by load
        prompt = ids(PAGE * 20, n)
        chosen = r.choose(workers, req(prompt, f"c{n}"))
        ticket = r.begin(chosen.url, req(prompt, f"c{n}"))
        firsts[n] = (chosen.url, ticket.rank, prompt)
    assert len({(url, rank) for url, rank, _ in firsts.values()}) == 8, "one per target"
    for n, (url, rank, prompt) in firsts.items():
        follow = [*prompt, *ids(PAGE * 3, 100 + n)]
        chosen = r.choose(workers, req(follow, f"f{n}"))
        ticket = r.begin(chosen.url, req(follow, f"f{n}"))
        assert (chosen.url, ticket.rank) == (url, rank)
        assert ticket.predicted_cached_tokens == PAGE * 20
        sent = with_rank(req(follow, f"f{n}"), ticket.rank)
        assert sent.extra_fields == {"routed_dp_rank": rank}


def test_modes_without_kv_leave_the_rank_to_the_worker() -> None:
    r = dp_router("least-outstanding")
    chosen = r.choose([W("a"), W("b")], req(ids(64, 1)))
    assert r.begin(chosen.url, req(ids(64, 1))).rank is None
    single = Router(RouterConfig(mode="kv", page_size=PAGE))
    single.worker_added("a")
    assert single.begin("a", req(ids(64, 1))).rank is None, "one rank: nothing to name"


def test_kv_mode_counts_its_own_decisions_before_the_events_arrive() -> None:
    """Events lag the engine (SGLang flushes after a prefill batch, every 40 decode steps, when idle;
    the subscriber may be behind): a request for the same prefix that comes meanwhile must still find
    it (what kv-approx knows, kv knows too)."""
    r = Router(RouterConfig(mode="kv", page_size=PAGE), clock=lambda: 0.0)
    for url in ("a", "b", "c"):
        r.worker_added(url)
    shared = ids(PAGE * 30, 1)
    first = r.choose([W("a"), W("b"), W("c")], req(shared, "p1"))
    r.begin(first.url, req(shared, "p1")).first_token(0)  # prefilled, decoding; no event arrived yet
    busy = [W(w, 1 if w == first.url else 0) for w in ("a", "b", "c")]
    second = r.choose(busy, req([*shared, *ids(PAGE, 2)], "p2"))
    assert second.url == first.url


def test_deepseek_v4_hits_are_capped_where_the_sliding_window_is_not_live() -> None:
    """Events report a whole sequence (prompt + output); after the request the output's window is
    tombstoned but its tail. A prompt that leaves the output early hits only at the prompt's end."""
    info = {"attention_backend": "dsv4", "swa_full_tokens_ratio": 0.5, "max_total_num_tokens": 100_000}
    r = dp_router("kv", ranks=1, **info)
    prompt, output = ids(PAGE * 10, 1), ids(PAGE * 10, 2)
    chosen = r.choose([W("a"), W("b")], req(prompt, "t1"))
    r.begin(chosen.url, req(prompt, "t1")).end()
    names = [f"n{k}" for k in range(20)]
    sink = r._sink  # what the subscriber applies events to
    sink.stored((chosen.url, 0), names[:10], None, prompt, PAGE)  # after the prefill
    sink.stored((chosen.url, 0), names[10:], names[9], output, PAGE)  # the finished sequence
    extends = [*prompt, *output, *ids(PAGE, 3)]
    assert r.begin(chosen.url, req(extends, "t2")).predicted_cached_tokens == PAGE * 20, "the live tail"
    diverges = [*prompt, *output[: PAGE * 5], *ids(PAGE * 6, 4)]
    assert r.begin(chosen.url, req(diverges, "t3")).predicted_cached_tokens == PAGE * 10, "the prompt's end"
    plain = dp_router("kv", ranks=1)
    plain._sink.stored(("a", 0), names[:10], None, prompt, PAGE)
    plain._sink.stored(("a", 0), names[10:], names[9], output, PAGE)
    assert plain.begin("a", req(diverges, "t4")).predicted_cached_tokens == PAGE * 15, "not gated"


def test_load_stats_are_sglangs_tagged_arrays() -> None:
    payload = msgpack.packb(["LoadStat", 3, 5, 9000, 100_000, 2, 4096, 12_000, 256, 1, 2])
    stat = decode_load_stat(payload)
    counts = (stat.running, stat.waiting, stat.tokens, stat.max_tokens, stat.dp_rank)
    assert counts == (3, 5, 9000, 100_000, 2)
    assert stat.waiting_uncached_tokens == 4096
    short = decode_load_stat(msgpack.packb(["LoadStat", 1, 0, 10, 100, None]))  # an older worker
    assert short.waiting_uncached_tokens == 0
    with pytest.raises(ValueError):
        decode_load_stat(msgpack.packb({"running": 1}))


def test_a_ranks_published_load_steers_the_choice() -> None:
    """Another frontend's requests fill rank 0: its load stat says so, and this router avoids it."""

    async def scenario() -> None:
        port = free_port()
        pub = zmq.Context.instance().socket(zmq.PUB)
        pub.bind(f"tcp://127.0.0.1:{port}")
        descriptor = {
            "publisher": "zmq", "endpoint_host": "127.0.0.1", "endpoint_port_base": free_port(),
            "topic": "", "block_size": PAGE, "dp_size": 2, "load_endpoint_port_base": port,
            "load_topic": "load",
        }  # fmt: skip
        r = Router(RouterConfig(mode="kv-approx", page_size=PAGE))
        r.worker_added("http://127.0.0.1:1", WorkerCapabilities(extra={"kv_events": descriptor}))
        try:
            stat = msgpack.packb(["LoadStat", 40, 10, 50_000, 100_000, 0, 20_000, 0, 256, 0, 0])
            for _ in range(200):
                pub.send_multipart([b"load", (0).to_bytes(8, "big"), stat])
                await asyncio.sleep(0.02)
                if r._workers["http://127.0.0.1:1"].load_subscribers[0].current() is not None:
                    break
            request = req(ids(PAGE * 4, 1), "x")
            r.choose([W("http://127.0.0.1:1")], request)
            assert r.begin("http://127.0.0.1:1", request).rank == 1
        finally:
            await r.aclose()
            pub.close(linger=0)

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_eagle_bigram_token_ids_hash_like_plain_pages() -> None:
    prompt = ids(PAGE * 2 + 1, 1)
    pairs = [[prompt[j], prompt[j + 1]] for j in range(PAGE * 2)]
    payload = msgpack.packb(
        [0.0, [{"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": pairs,
                "block_size": PAGE, "lora_id": None}], 0]
    )  # fmt: skip
    (event,) = decode_batch(payload).events
    assert list(event.token_ids) == prompt[: PAGE * 2]  # type: ignore[union-attr]
    r = Router(RouterConfig(mode="kv", page_size=PAGE))
    r.worker_added("a")
    r._sink.stored(("a", 0), event.block_hashes, None, event.token_ids, PAGE)  # type: ignore[union-attr]
    assert r.index.overlap(("a", 0), block_hashes(prompt, PAGE)) == 2


def test_new_prompts_on_one_worker_rotate_over_its_idle_ranks() -> None:
    """A prefill leg is pinned to its worker: new conversations still spread over the worker's ranks."""
    r = Router(RouterConfig(mode="kv", page_size=PAGE), clock=lambda: 0.0)
    r.worker_added("p", WorkerCapabilities(extra={"attn_dp_size": 4}))
    ranks = []
    for n in range(4):
        request = req(ids(PAGE * 4, n), f"n{n}")
        r.choose([W("p")], request)
        ticket = r.begin("p", request)
        ranks.append(ticket.rank)
        ticket.end()  # each finished before the next: every rank idle each time
    assert sorted(ranks) == [0, 1, 2, 3]
