"""Router policies: which worker each mode picks, and why (routing/router.py)."""

from __future__ import annotations

import pytest

from deepseek_frontend.routing.hashing import block_hashes
from deepseek_frontend.routing.router import Router, RouterConfig
from deepseek_frontend.routing.session import session_from_headers, use_session
from tests.routing.common import PAGE, W, ids, req


def router(mode: str, **kw: object) -> Router:
    # a fixed clock: the index entries the tests record at time 0 stay within the prediction TTL
    r = Router(RouterConfig(mode=mode, page_size=PAGE, **kw), clock=lambda: 0.0)  # type: ignore[arg-type]
    for url in ("a", "b", "c"):
        r.worker_added(url)
    return r


def test_kv_mode_sends_a_prompt_to_the_worker_holding_its_prefix() -> None:
    r = router("kv")
    prompt = ids(320, 1)
    r.index.record(("b", 0), block_hashes(prompt, PAGE)[:15], now=0.0)
    workers = [W("a"), W("b"), W("c")]
    assert r.choose(workers, req(prompt)).url == "b"
    ticket = r.begin("b", req(prompt))
    assert ticket.predicted_cached_tokens == 15 * PAGE
    assert r.decisions["kv-overlap"] == 1


def test_kv_mode_yields_to_load_when_the_cache_saves_less_than_the_queue_costs() -> None:
    r = router("kv")
    prompt = ids(320, 1)  # 20 blocks
    r.index.record(("b", 0), block_hashes(prompt, PAGE)[:2], now=0.0)  # a 2-block overlap
    for n in range(3):  # b has three long prefills queued
        r.begin("b", req(ids(320, 10 + n), f"q{n}"))
    chosen = r.choose([W("a"), W("b", 3), W("c")], req(prompt))
    assert chosen.url in ("a", "c")
    assert r.decisions["kv-load"] == 1


def test_kv_ties_go_to_the_sessions_worker_then_the_least_loaded() -> None:
    r = router("kv")
    token = use_session("s1")
    try:
        first = r.choose([W("a"), W("b"), W("c")], req(ids(64, 1), "r1")).url
        # nothing cached anywhere: the session's previous worker wins the tie
        assert r.choose([W("a"), W("b"), W("c")], req(ids(64, 2), "r2")).url == first
    finally:
        use_session(None)
        del token
    busy = [W("a", 2), W("b", 0), W("c", 2)]
    assert r.choose(busy, req(ids(64, 3), "r3")).url == "b"


def test_ticket_accounting_returns_to_zero() -> None:
    r = router("kv")
    t = r.begin("a", req(ids(64, 1)))
    t.first_token(cached_tokens=32)
    t.end()
    t.end()  # idempotent
    stats = r.worker_stats()["a"]
    assert stats["in_flight"] == 0 and stats["cached_tokens"] == 32 and stats["prompt_tokens"] == 64
    assert t.load is not None and t.load.queued_prefill_blocks == 0 and t.load.active_blocks == 0


def test_kv_approx_learns_from_its_own_decisions_and_forgets_after_the_ttl() -> None:
    now = [0.0]
    r = Router(RouterConfig(mode="kv-approx", page_size=PAGE, approx_ttl_s=60.0), clock=lambda: now[0])
    for url in ("a", "b"):
        r.worker_added(url)
    conversation = ids(320, 1)
    first = r.choose([W("a"), W("b")], req(conversation, "t1"))
    r.begin(first.url, req(conversation, "t1")).end()
    longer = [*conversation, *ids(64, 2)]
    loaded = [W(w.url, 1 if w.url == first.url else 0) for w in (W("a"), W("b"))]
    assert r.choose(loaded, req(longer, "t2")).url == first.url, (
        "the predicted cache beats one request of load"
    )
    now[0] = 120.0
    assert r.choose(loaded, req(longer, "t3")).url != first.url, "expired: load decides"


def test_session_mode_sticks_and_yields_to_load() -> None:
    r = router("session", session_slack=1)
    use_session("agent-7")
    try:
        home = r.choose([W("a"), W("b"), W("c")], req(ids(16, 1))).url
        light = [W(u, 1 if u == home else 0) for u in ("a", "b", "c")]
        assert r.choose(light, req(ids(16, 2))).url == home, "within the slack: stay"
        heavy = [W(u, 5 if u == home else 0) for u in ("a", "b", "c")]
        moved = r.choose(heavy, req(ids(16, 3))).url
        assert moved != home
        assert r.choose([W("a"), W("b"), W("c")], req(ids(16, 4))).url == moved, "sticks to the new worker"
    finally:
        use_session(None)
    assert r.decisions["session-moved"] == 1 and r.decisions["session"] >= 2


def test_round_robin_and_least_outstanding() -> None:
    rr = router("round-robin")
    seen = {rr.choose([W("a"), W("b"), W("c")], req(ids(16, n))).url for n in range(3)}
    assert seen == {"a", "b", "c"}
    lo = router("least-outstanding")
    assert lo.choose([W("a", 3), W("b", 1), W("c", 2)], req(ids(16, 1))).url == "b"


def test_a_failed_worker_loses_its_predicted_cache() -> None:
    r = router("kv")
    prompt = ids(320, 1)
    r.index.record(("b", 0), block_hashes(prompt, PAGE), now=0.0)
    r.worker_failed("b")
    assert r.index.overlap(("b", 0), block_hashes(prompt, PAGE)) == 0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"x-claude-code-session-id", b"cc-1"), (b"x-session-id", b"generic")], "cc-1"),
        ([(b"session_id", b"codex-conv")], "codex-conv"),
        ([(b"x-session-id", b"  g-2 ")], "g-2"),
        ([(b"x-session-id", b"")], None),
        ([(b"x-session-id", b"x" * 500)], "x" * 128),
        ([], None),
    ],
)
def test_session_headers(headers: list[tuple[bytes, bytes]], expected: str | None) -> None:
    assert session_from_headers(headers) == expected


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown router mode"):
        Router(RouterConfig(mode="random"))  # type: ignore[arg-type]


def test_kv_keeps_a_session_in_place_unless_moving_saves_enough() -> None:
    r = router("kv", session_tolerance=0.25)
    prompt = ids(PAGE * 20, 1)
    hashes = block_hashes(prompt, PAGE)
    r.index.record(("a", 0), hashes[:10], now=0.0)  # the session's worker
    r.index.record(("b", 0), hashes[:13], now=0.0)  # 3 blocks better: within 0.25 x 20
    use_session("s")
    try:
        r._stick("s", ("a", 0))
        assert r.choose([W("a"), W("b")], req(prompt, "k1")).url == "a"
        r.index.record(("b", 0), hashes[:18], now=0.0)  # 8 blocks better: worth moving
        assert r.choose([W("a"), W("b")], req(prompt, "k2")).url == "b"
    finally:
        use_session(None)
    # without a session only the cost counts
    r.index.record(("a", 0), hashes, now=0.0)
    assert r.choose([W("a"), W("b")], req(prompt, "k3")).url == "a"


def test_a_worker_is_subscribed_once_however_often_it_is_announced() -> None:
    import asyncio

    r = Router(
        RouterConfig(
            mode="kv", page_size=PAGE, kv_event_endpoints={"w": "tcp://127.0.0.1:9;tcp://127.0.0.1:9"}
        )
    )
    r.worker_added("w")  # before the event loop runs (pool constructor)

    async def scenario() -> int:
        r.worker_added("w")  # discovery
        await r.start()
        count = len(r.subscribers()["w"])
        await r.aclose()
        return count

    assert asyncio.run(scenario()) == 1
