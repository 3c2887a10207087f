"""KV events over real ZMQ sockets: the simulated engine's SGLang-format publisher feeding the router.

Sequence gaps (with and without a replay socket), a late subscriber catching up by replay, a
publisher restart (a worker back with an empty cache), AllBlocksCleared and a worker leaving.
Every wait is on a condition, bounded in time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import zmq

from deepseek_frontend.engines.sim.kv import KvEventPublisher, SimKvCache
from deepseek_frontend.routing.events import BlockRemoved
from deepseek_frontend.routing.hashing import block_hashes
from deepseek_frontend.routing.index import KvIndex
from deepseek_frontend.routing.router import Router, RouterConfig
from deepseek_frontend.routing.subscriber import KvEventSource, KvEventSubscriber, sources_from_config
from tests.routing.common import PAGE, ids
from tests.support.servers import free_port

SRC = ("http://worker", 0)


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} (not within {timeout:g} s)")
        await asyncio.sleep(0.01)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


def endpoints(replay: bool = True) -> tuple[str, str | None]:
    return f"tcp://127.0.0.1:{free_port()}", (f"tcp://127.0.0.1:{free_port()}" if replay else None)


async def connected(index: KvIndex, publisher: KvEventPublisher, **kw: float) -> KvEventSubscriber:
    """A subscriber that is receiving live batches.

    A ZMQ SUB socket joins asynchronously: batches published before it has joined are lost, and only a
    later batch would reveal the gap. So probe (removing a block nobody stored: a no-op) until one arrives.
    """
    sub = KvEventSubscriber(
        index, KvEventSource(SRC[0], 0, publisher.endpoint, publisher.replay_endpoint), **kw
    )
    sub.start()
    await joined(sub, publisher)
    return sub


async def joined(sub: KvEventSubscriber, publisher: KvEventPublisher) -> None:
    """Wait until ``sub`` receives live batches, probing with no-op batches (see :func:`connected`)."""
    await asyncio.wait_for(sub.ready.wait(), 10)
    for _ in range(200):
        if sub.stats.batches:
            break
        publisher.publish([BlockRemoved((-1,))])
        await asyncio.sleep(0.05)
    assert sub.stats.batches, "the subscriber never received a batch"


async def rebind(endpoint: str, replay: str | None) -> KvEventPublisher:
    """A new publisher on the port the old one just released (ZMQ closes sockets asynchronously)."""
    for _ in range(200):
        try:
            return KvEventPublisher(endpoint, replay)
        except zmq.ZMQError:
            await asyncio.sleep(0.05)
    raise AssertionError(f"{endpoint} was not released")


def held(index: KvIndex, prompt: list[int]) -> int:
    return index.overlap(SRC, block_hashes(prompt, PAGE))


def test_stored_and_evicted_blocks_reach_the_index() -> None:
    async def scenario() -> None:
        pub = KvEventPublisher(*endpoints())
        pub.start()
        cache = SimKvCache(PAGE * 10, page_size=PAGE, publisher=pub)
        index = KvIndex()
        sub = await connected(index, pub)
        # A gap while the SUB socket was still joining is the slow-joiner case, filled by replay;
        # what matters here is that none opens once it receives live batches.
        gaps_when_joined = sub.stats.gaps
        try:
            first = ids(PAGE * 6, 1)
            cache.insert(first)
            await until(lambda: held(index, first) == 6, "the stored blocks are indexed")
            second = ids(PAGE * 6, 2)
            cache.insert(second)  # capacity 10 pages: two of the first prompt's leaves are evicted
            await until(lambda: held(index, second) == 6, "the second prompt is indexed")
            await until(lambda: held(index, first) == 4, "the evicted leaves are gone, the prefix stays")
            assert sub.stats.gaps == gaps_when_joined
        finally:
            await sub.aclose()
            await pub.aclose()

    run(scenario)


@pytest.mark.parametrize("with_replay", [True, False])
def test_a_sequence_gap_is_replayed_or_else_the_workers_blocks_are_dropped(with_replay: bool) -> None:
    async def scenario() -> None:
        pub = KvEventPublisher(*endpoints(with_replay))
        pub.start()
        cache = SimKvCache(PAGE * 100, page_size=PAGE, publisher=pub)
        index = KvIndex()
        sub = await connected(index, pub, replay_timeout_s=2.0)
        gaps_when_joined = sub.stats.gaps  # a slow-joiner gap while joining is not this test's gap
        try:
            a, lost, c = ids(PAGE * 4, 1), ids(PAGE * 4, 2), ids(PAGE * 4, 3)
            cache.insert(a)
            await until(lambda: held(index, a) == 4, "first batch applied")
            pub.drop_live.add(pub.next_sequence)  # this batch never reaches live subscribers
            cache.insert(lost)
            cache.insert(c)
            await until(lambda: sub.next_sequence == pub.next_sequence, "the subscriber caught up")
            assert sub.stats.gaps == gaps_when_joined + 1
            assert held(index, c) == 4
            if with_replay:
                assert held(index, lost) == 4 and held(index, a) == 4, "the replay filled the gap"
                assert sub.stats.clears == 0
            else:
                assert held(index, a) == 0 and held(index, lost) == 0, "unrecoverable: blocks dropped"
                assert sub.stats.clears == 1
        finally:
            await sub.aclose()
            await pub.aclose()

    run(scenario)


def test_a_late_subscriber_learns_the_history_by_replay() -> None:
    async def scenario() -> None:
        pub = KvEventPublisher(*endpoints())
        pub.start()
        cache = SimKvCache(PAGE * 100, page_size=PAGE, publisher=pub)
        early = ids(PAGE * 5, 1)
        cache.insert(early)  # before anyone listens
        index = KvIndex()
        sub = await connected(index, pub)
        try:
            assert held(index, early) == 5, "replayed from sequence 0 at start"
            later = ids(PAGE * 3, 2)
            cache.insert(later)
            # a batch sent before the SUB socket joined is recovered when the next one shows the gap
            for n in range(100):
                if held(index, later) == 3:
                    break
                cache.insert(ids(PAGE, 500 + n))
                await asyncio.sleep(0.05)
            assert held(index, later) == 3, "live batches continue after the replay"
            assert held(index, early) == 5 and sub.stats.restarts == 0 and sub.stats.clears == 0
        finally:
            await sub.aclose()
            await pub.aclose()

    run(scenario)


def test_a_restarted_worker_starts_with_an_empty_cache() -> None:
    async def scenario() -> None:
        endpoint, replay = endpoints(False)
        pub = KvEventPublisher(endpoint, replay)
        cache = SimKvCache(PAGE * 100, page_size=PAGE, publisher=pub)
        index = KvIndex()
        sub = await connected(index, pub)
        try:
            n = 0
            while sub.stats.batches == 0:  # no replay socket: wait until the SUB socket has joined
                n += 1
                cache.insert(ids(PAGE, 1000 + n))
                await asyncio.sleep(0.05)
            before = [ids(PAGE * 3, n) for n in range(5)]
            for prompt in before:
                cache.insert(prompt)
            await until(lambda: all(held(index, p) == 3 for p in before), "blocks indexed")
            await pub.aclose()
            # the worker comes back on the same port: new process, sequence from 0, empty cache
            pub = await rebind(endpoint, replay)
            cache = SimKvCache(PAGE * 100, page_size=PAGE, publisher=pub)
            while sub.stats.restarts == 0:  # the SUB socket reconnects by itself: publish until heard
                n += 1
                cache.insert(ids(PAGE, 1000 + n))
                await asyncio.sleep(0.05)
            after = ids(PAGE * 2, 99)
            cache.insert(after)
            await until(lambda: held(index, after) == 2, "the new cache is indexed")
            assert all(held(index, p) == 0 for p in before), "the old cache was forgotten"
        finally:
            await sub.aclose()
            await pub.aclose()

    run(scenario)


def test_all_blocks_cleared_and_a_worker_leaving_drop_its_blocks() -> None:
    async def scenario() -> None:
        pub = KvEventPublisher(*endpoints())
        pub.start()
        cache = SimKvCache(PAGE * 100, page_size=PAGE, publisher=pub)
        router = Router(
            RouterConfig(
                mode="kv",
                page_size=PAGE,
                kv_event_endpoints={SRC[0]: f"{pub.endpoint};{pub.replay_endpoint}"},
            )
        )
        router.worker_added(SRC[0])
        await joined(router.subscribers()[SRC[0]][0], pub)
        try:
            prompt = ids(PAGE * 4, 1)
            cache.insert(prompt)
            await until(lambda: held(router.index, prompt) == 4, "indexed")
            cache.clear()
            await until(lambda: held(router.index, prompt) == 0, "AllBlocksCleared applied")
            cache.insert(prompt)
            await until(lambda: held(router.index, prompt) == 4, "indexed again")
            await router.worker_removed(SRC[0])
            assert router.index.sources() == [] and router.subscribers() == {}
        finally:
            await router.aclose()
            await pub.aclose()

    run(scenario)


def test_sources_come_from_sglangs_kv_events_config() -> None:
    config = (
        '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5600", "topic": "kv"}'
    )
    sources = sources_from_config("http://10.0.0.5:30000", config, dp_size=2)
    assert [(s.endpoint, s.replay_endpoint, s.topic, s.dp_rank) for s in sources] == [
        ("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5600", "kv", 0),
        ("tcp://10.0.0.5:5558", "tcp://10.0.0.5:5601", "kv", 1),
    ]
    assert sources_from_config("http://h:1", '{"publisher": "null"}') == []
    with pytest.raises(ValueError):
        sources_from_config("http://h:1", "[1, 2]")


def test_a_flood_of_events_is_applied_in_bounded_slices_between_other_work() -> None:
    """A worker storing blocks faster than the frontend applies them must not hold the event loop:
    at most BLOCKS_PER_TURN blocks per turn, other tasks run between slices, memory stays capped."""
    from deepseek_frontend.routing.events import BlockStored, EventBatch
    from deepseek_frontend.routing.subscriber import BLOCKS_PER_TURN

    async def scenario() -> None:
        index = KvIndex(max_stored=3000)
        sub = KvEventSubscriber(index, KvEventSource(SRC[0], 0, "tcp://127.0.0.1:9"))
        ticks = 0
        stop = False

        async def ticker() -> None:  # another task on the loop: counts the turns it gets
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        prompt = ids(PAGE * 5000, 1)
        giant = BlockStored(tuple(range(5000)), None, tuple(prompt), PAGE)  # one 5,000-block event
        small = [
            EventBatch(0.0, tuple(BlockStored((10_000 + 8 * n + k,), None, tuple(ids(PAGE, n * 8 + k)), PAGE)
                                  for k in range(8)))
            for n in range(500)
        ]  # fmt: skip
        await sub.handle(0, EventBatch(0.0, (giant,)))
        for seq, batch in enumerate(small, start=1):
            await sub.handle(seq, batch)
        stop = True
        await task
        total = 5000 + 500 * 8
        assert sub.stats.max_turn_blocks <= BLOCKS_PER_TURN
        assert ticks >= total // BLOCKS_PER_TURN, f"the loop turned {ticks} times for {total} blocks"
        assert index.stored_count(SRC) <= 3000 and index.names_count(SRC) == index.stored_count(SRC)

    run(scenario)


def test_a_first_batch_lost_while_the_subscriber_joined_is_replayed() -> None:
    """The replay at start found nothing: the publisher's first batch is sequence 0, so a first live
    batch numbered later means some were lost on the way in (a PUB drops what it sends before a SUB
    has joined), and they are replayed -- else a shared prefix's root would never reach the index."""

    async def scenario() -> None:
        pub = KvEventPublisher(*endpoints())
        pub.start()
        cache = SimKvCache(PAGE * 100, page_size=PAGE, publisher=pub)
        index = KvIndex()
        sub = KvEventSubscriber(index, KvEventSource(SRC[0], 0, pub.endpoint, pub.replay_endpoint))
        sub.start()
        try:
            await asyncio.wait_for(sub.ready.wait(), 10)
            pub.drop_live.add(0)  # the first batch never reaches the subscriber live
            root = ids(PAGE * 3, 1)
            cache.insert(root)
            for n in range(200):
                cache.insert([*root, *ids(PAGE, 100 + n)])  # later batches, until one arrives
                if sub.stats.batches:
                    break
                await asyncio.sleep(0.02)
            await until(lambda: held(index, root) == 3, "the lost root batch was replayed")
            assert sub.stats.gaps >= 1 and sub.stats.replays >= 2
        finally:
            await sub.aclose()
            await pub.aclose()

    run(scenario)
