"""Which worker (and data-parallel rank) holds which KV blocks (pure: the caller passes the time).

A *source* is one independent KV cache: a worker URL plus a data-parallel rank (SGLang
publishes one event stream per DP rank). Each source holds a set of block hashes computed by
:mod:`deepseek_frontend.routing.hashing`.

Two ways to fill it:

* **events** (``--router-mode kv``): the engines' own ``BlockStored`` / ``BlockRemoved`` /
  ``AllBlocksCleared`` events. ``BlockStored`` carries the block's token ids, which are hashed
  here with the router's chained hash; the engine's own block hash is kept only as a name so
  that a later ``BlockRemoved`` (which carries no token ids) can find the block.
* **approximate** (``--router-mode kv-approx``): the router's own decisions -- a prompt routed
  to a source is assumed cached there for ``ttl_s`` seconds, at most ``max_blocks`` blocks per
  source (least recently used beyond that).

Overlap of a prompt with a source is the number of leading blocks the source holds. Engines
keep a prefix tree (a block is only cached with its whole prefix, and eviction takes leaves
first), so holding block ``k`` implies holding blocks ``0..k-1`` and the overlap is found by
binary search: ``O(log blocks)`` set lookups per source, whatever the prompt length.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from deepseek_frontend.routing.hashing import ROOT_HASH

__all__ = ["KvIndex", "SourceKey"]

SourceKey = tuple[str, int]
"""``(worker url, data-parallel rank)``."""


@dataclass(slots=True)
class _Source:
    #: our block hash -> expiry time (approximate mode) or 0.0 (events: never expires)
    blocks: dict[int, float] = field(default_factory=dict)
    #: engine block hash -> our block hash (events mode)
    names: dict[Hashable, int] = field(default_factory=dict)
    stored_events: int = 0
    removed_events: int = 0
    clears: int = 0


class KvIndex:
    """Block ownership per source (see module docstring).

    ``ttl_s`` (approximate mode) makes a recorded block expire; ``max_blocks`` caps the blocks
    kept per source (approximate mode: least recently recorded first; events mode: the engine
    tells us what it evicts, so the cap only guards memory against a misbehaving publisher).
    """

    def __init__(self, *, ttl_s: float | None = None, max_blocks: int = 1 << 20) -> None:
        self.ttl_s = ttl_s
        self.max_blocks = max_blocks
        self._sources: dict[SourceKey, _Source] = {}

    # ------------------------------------------------------------------ queries

    def sources(self) -> list[SourceKey]:
        return list(self._sources)

    def block_count(self, source: SourceKey) -> int:
        s = self._sources.get(source)
        return len(s.blocks) if s is not None else 0

    def total_blocks(self) -> int:
        return sum(len(s.blocks) for s in self._sources.values())

    def overlap(self, source: SourceKey, hashes: Sequence[int], now: float = 0.0) -> int:
        """Leading blocks of ``hashes`` that ``source`` holds (binary search, see module docstring)."""
        s = self._sources.get(source)
        if s is None or not hashes or not s.blocks:
            return 0
        blocks = s.blocks
        ttl = self.ttl_s is not None

        def held(i: int) -> bool:
            expiry = blocks.get(hashes[i])
            return expiry is not None and (not ttl or expiry >= now)

        lo, hi = 0, len(hashes)  # invariant: blocks [0, lo) held; block hi (if any) not held
        if held(hi - 1):
            return hi
        hi -= 1
        while lo < hi:
            mid = (lo + hi) // 2
            if held(mid):
                lo = mid + 1
            else:
                hi = mid
        return lo

    # ------------------------------------------------------------------ approximate mode

    def record(self, source: SourceKey, hashes: Sequence[int], now: float) -> None:
        """Assume ``source`` now caches ``hashes`` (approximate mode), until ``now + ttl_s``."""
        s = self._sources.setdefault(source, _Source())
        expiry = now + self.ttl_s if self.ttl_s is not None else 0.0
        blocks = s.blocks
        # re-insert so dict order is recency order (eviction drops the least recent first), leaves
        # before their parents: a prompt's parents are then more recent and outlive its leaves
        for h in hashes:
            blocks.pop(h, None)
        blocks.update(dict.fromkeys(reversed(hashes), expiry))
        if len(blocks) > self.max_blocks:
            self._trim(s, now)

    def _trim(self, s: _Source, now: float) -> None:
        blocks = s.blocks
        if self.ttl_s is not None:
            for h in [h for h, exp in blocks.items() if exp < now]:
                del blocks[h]
        excess = len(blocks) - self.max_blocks
        if excess > 0:
            # evict a little more than needed to amortise the scan
            drop = [h for _, h in zip(range(excess + self.max_blocks // 16), blocks, strict=False)]
            for h in drop:
                del blocks[h]

    # ------------------------------------------------------------------ events mode

    def stored(
        self,
        source: SourceKey,
        engine_hashes: Sequence[Hashable],
        parent_engine_hash: Hashable | None,
        token_ids: Sequence[int],
        block_size: int,
    ) -> None:
        """Apply a ``BlockStored``: ``token_ids`` holds ``len(engine_hashes)`` blocks of ``block_size``."""
        s = self._sources.setdefault(source, _Source())
        s.stored_events += 1
        if parent_engine_hash is None:
            parent = ROOT_HASH
        else:
            known = s.names.get(parent_engine_hash)
            # an unknown parent (an event we never saw): hash under a name no prompt can produce
            parent = known if known is not None else hash(("unknown-parent", parent_engine_hash))
        for i, name in enumerate(engine_hashes):
            block = token_ids[i * block_size : (i + 1) * block_size]
            if len(block) < block_size:
                break
            parent = hash((parent, tuple(block)))
            s.blocks[parent] = 0.0
            s.names[name] = parent
        if len(s.blocks) > self.max_blocks:
            self._trim(s, 0.0)

    def removed(self, source: SourceKey, engine_hashes: Iterable[Hashable]) -> None:
        """Apply a ``BlockRemoved`` event."""
        s = self._sources.get(source)
        if s is None:
            return
        s.removed_events += 1
        for name in engine_hashes:
            ours = s.names.pop(name, None)
            if ours is not None:
                s.blocks.pop(ours, None)

    def clear(self, source: SourceKey) -> None:
        """Forget everything ``source`` holds (``AllBlocksCleared``, a sequence gap, a restart)."""
        s = self._sources.get(source)
        if s is not None:
            s.blocks.clear()
            s.names.clear()
            s.clears += 1

    def drop_worker(self, url: str) -> None:
        """Forget every source of worker ``url`` (it left the pool or died)."""
        for key in [k for k in self._sources if k[0] == url]:
            del self._sources[key]
