"""Block hashing, the prefix hash cache and the KV index (pure parts of routing/)."""

from __future__ import annotations

import random

import pytest

from deepseek_frontend.routing.hashing import PrefixHashCache, block_hashes
from deepseek_frontend.routing.index import KvIndex

PAGE = 16


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100_000) for _ in range(n)]


def test_chained_hashes_identify_the_whole_prefix() -> None:
    a = ids(64, 1)
    b = [*a[:32], *ids(32, 2)]
    ha, hb = block_hashes(a, PAGE), block_hashes(b, PAGE)
    assert len(ha) == 4, "only full blocks are hashed"
    assert ha[:2] == hb[:2] and ha[2] != hb[2]
    # the same block content after a different prefix is a different block
    c = [*ids(16, 3), *a[16:32]]
    assert block_hashes(c, PAGE)[1] != ha[1]
    assert block_hashes(a[:15], PAGE) == []


def test_the_prefix_cache_returns_the_same_hashes_and_reuses_the_shared_prefix() -> None:
    cache = PrefixHashCache(PAGE)
    system = ids(200, 1)
    turn1 = [*system, *ids(100, 2)]
    turn2 = [*turn1, *ids(300, 3)]
    other = [*system, *ids(500, 4)]
    for prompt in (turn1, turn2, other, turn2):
        assert cache.hashes(prompt) == block_hashes(prompt, PAGE)
    assert cache.reused_tokens >= len(turn1) - PAGE, "turn 2 reused turn 1's hashes"
    # a change in the last block a cached entry covers, or at a sampled position, is never
    # mistaken for the cached prefix (docs/routing.md: other single-token edits can be)
    for position in (len(turn2) // PAGE * PAGE - 3, 256):
        edited = [*turn2, *ids(40, 5)]
        edited[position] += 1
        assert cache.hashes(edited) == block_hashes(edited, PAGE)


def test_the_prefix_cache_is_bounded() -> None:
    cache = PrefixHashCache(PAGE, max_entries=3)
    for seed in range(10):
        cache.hashes(ids(64, seed))
    assert len(cache) == 3


def test_overlap_is_the_run_of_leading_blocks_held() -> None:
    index = KvIndex()
    prompt = ids(160, 1)
    hashes = block_hashes(prompt, PAGE)  # 10 blocks
    index.record(("w", 0), hashes[:6], now=0.0)
    assert index.overlap(("w", 0), hashes) == 6
    assert index.overlap(("w", 0), hashes[:4]) == 4
    assert index.overlap(("other", 0), hashes) == 0
    assert index.overlap(("w", 0), block_hashes(ids(160, 2), PAGE)) == 0


def test_approximate_entries_expire_and_are_capped_least_recent_first() -> None:
    index = KvIndex(ttl_s=10.0, max_blocks=8)
    old = block_hashes(ids(96, 1), PAGE)  # 6 blocks
    new = block_hashes(ids(96, 2), PAGE)
    index.record(("w", 0), old, now=0.0)
    assert index.overlap(("w", 0), old, now=5.0) == 6
    assert index.overlap(("w", 0), old, now=11.0) == 0, "expired after the TTL"
    index.record(("w", 0), new, now=12.0)
    assert index.block_count(("w", 0)) <= 8
    assert index.overlap(("w", 0), new, now=12.0) == 6, "the newest prompt survives the cap"


def test_events_are_applied_by_the_engines_block_names() -> None:
    index = KvIndex()
    prompt = ids(64, 1)
    hashes = block_hashes(prompt, PAGE)
    src = ("w", 0)
    index.stored(src, ["e0", "e1"], None, prompt[:32], PAGE)
    index.stored(src, ["e2", "e3"], "e1", prompt[32:64], PAGE)
    assert index.overlap(src, hashes) == 4
    index.removed(src, ["e3"])
    assert index.overlap(src, hashes) == 3
    # a block stored under a parent we never heard of cannot match any prompt
    index.stored(("v", 0), ["x2"], "never-seen", prompt[32:48], PAGE)
    assert index.block_count(("v", 0)) == 1 and index.overlap(("v", 0), hashes) == 0
    index.clear(src)
    assert index.overlap(src, hashes) == 0
    index.stored(src, ["e0"], None, prompt[:16], PAGE)
    index.drop_worker("w")
    assert index.sources() == [("v", 0)]


@pytest.mark.parametrize("n_blocks", [1, 2, 7, 100])
def test_overlap_binary_search_agrees_with_a_linear_scan(n_blocks: int) -> None:
    index = KvIndex()
    hashes = block_hashes(ids(PAGE * n_blocks, n_blocks), PAGE)
    for held in range(n_blocks + 1):
        index.clear(("w", 0))
        index.record(("w", 0), hashes[:held], now=0.0)
        assert index.overlap(("w", 0), hashes) == held


def test_the_stored_layer_is_capped_with_its_names_and_evicts_leaves_first() -> None:
    """Both maps (our hashes and the engine's names) are capped together; eviction takes the least
    recently stored leaves, so every block left still has its prefix (the binary search stays exact)."""
    index = KvIndex(max_stored=64)
    src = ("w", 0)
    chains = [ids(PAGE * 12, seed) for seed in range(20)]
    for n, prompt in enumerate(chains):
        names = [f"c{n}-{k}" for k in range(12)]
        index.stored(src, names, None, prompt, PAGE)
    assert index.stored_count(src) <= 64 and index.names_count(src) == index.stored_count(src)
    newest = chains[-1]
    assert index.overlap(src, block_hashes(newest, PAGE)) == 12, "the newest chain is whole"
    for prompt in chains:
        hashes = block_hashes(prompt, PAGE)
        present = [index.overlap(src, [h]) == 1 for h in hashes]  # block by block
        # what is left of an older chain is a prefix of it: no block survives without its parent
        assert present == sorted(present, reverse=True)
        assert index.overlap(src, hashes) == sum(present)


def test_predictions_count_until_events_remove_them() -> None:
    index = KvIndex(ttl_s=60.0)
    src = ("w", 0)
    prompt = ids(PAGE * 4, 1)
    hashes = block_hashes(prompt, PAGE)
    index.record(src, hashes, now=0.0)
    assert index.overlap(src, hashes, now=1.0) == 4, "a routed prompt counts before its events"
    index.stored(src, ["a", "b", "c", "d"], None, prompt, PAGE)
    index.removed(src, ["d"])
    assert index.overlap(src, hashes, now=1.0) == 3, "the engine evicted the leaf: the prediction goes too"
    assert index.overlap(src, hashes, now=100.0) == 3, "stored blocks do not expire"
