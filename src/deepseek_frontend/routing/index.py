"""Which worker (and data-parallel rank) holds which KV blocks (pure: the caller passes the time).

A *source* is one independent KV cache: a worker URL plus a data-parallel rank (SGLang
publishes one event stream per DP rank and keeps one radix cache per rank). Each source holds
block hashes computed by :mod:`deepseek_frontend.routing.hashing`, in two layers:

* **stored** (``--router-mode kv``): the engines' own ``BlockStored`` / ``BlockRemoved`` /
  ``AllBlocksCleared`` events. ``BlockStored`` carries the block's token ids, which are hashed
  here with the router's chained hash; the engine's own block hash is kept only as a name so
  that a later ``BlockRemoved`` (which carries no token ids) can find the block.
* **predicted** (``kv-approx``, and ``kv`` until events confirm or remove them): the router's
  own decisions -- a prompt routed to a source is assumed cached there for ``ttl_s`` seconds, at
  most ``max_predicted`` blocks per source (least recently routed beyond that). An event that
  removes a block removes its prediction too, so with events the router knows at least what it
  knows without them (a prompt it just routed is counted before the engine's events for it
  arrive: SGLang flushes them only after the prefill batch, every 40 decode steps or when idle).

Overlap of a prompt with a source is the number of leading blocks the source holds, in either
layer. Engines keep a prefix tree (a block is only cached with its whole prefix, and eviction
takes leaves first), so holding block ``k`` implies holding blocks ``0..k-1`` and the overlap is
found by binary search: ``O(log blocks)`` set lookups per source, whatever the prompt length.

**Memory.** The stored layer keeps, per block, its engine name, its parent and whether it has
children, so that it can be capped the way the engine evicts: when a source passes
``max_stored`` blocks, the least recently stored or used *leaves* go first (a parent becomes a
leaf once its last child is gone, and goes next), which keeps every remaining block's prefix in
the index and the binary search exact. The cap comes from a byte budget per worker
(:data:`STORED_BLOCK_BYTES` per block, measured), so a publisher that floods the index -- or
one whose removals are lost -- costs bounded memory (docs/routing.md, "Memory").
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from deepseek_frontend.routing.hashing import ROOT_HASH

__all__ = ["DEFAULT_MAX_STORED", "STORED_BLOCK_BYTES", "KvIndex", "SourceKey"]

SourceKey = tuple[str, int]
"""``(worker url, data-parallel rank)``."""

#: bytes one stored block costs in the index (its dict entries and hash objects; 279 measured with
#: tracemalloc over 200K blocks in chains of 50, integer engine names)
STORED_BLOCK_BYTES = 280
#: stored blocks per source when no budget is given (about 256 MiB)
DEFAULT_MAX_STORED = 1 << 20


@dataclass(slots=True)
class _Source:
    # --- stored layer (engine events)
    #: our block hash -> the engine's name for it (membership, and the name a removal carries)
    name_of: dict[int, Hashable] = field(default_factory=dict)
    #: engine name -> our block hash
    names: dict[Hashable, int] = field(default_factory=dict)
    #: our block hash -> our hash of its parent (ROOT_HASH for a first block)
    parent: dict[int, int] = field(default_factory=dict)
    #: our block hash -> number of its children held (only blocks that have some)
    children: dict[int, int] = field(default_factory=dict)
    #: blocks without children, least recently stored or used first
    leaves: dict[int, None] = field(default_factory=dict)
    #: leaves exposed by evicting their last child: evicted before any other leaf (their subtree
    #: was the coldest)
    exposed: dict[int, None] = field(default_factory=dict)
    # --- predicted layer (the router's own decisions)
    #: our block hash -> expiry time (``inf`` without a TTL); dict order = recency order
    predicted: dict[int, float] = field(default_factory=dict)
    stored_events: int = 0
    removed_events: int = 0
    clears: int = 0
    evicted: int = 0


class KvIndex:
    """Block ownership per source (see module docstring).

    ``ttl_s``: how long a predicted block counts (None: until capped or removed);
    ``max_predicted``: predicted blocks kept per source (least recently routed dropped first);
    ``max_stored``: stored blocks kept per source (least recently stored or used leaves dropped
    first), unless :meth:`set_max_stored` gives a source its own cap.
    """

    def __init__(
        self,
        *,
        ttl_s: float | None = None,
        max_blocks: int = 1 << 20,
        max_stored: int = DEFAULT_MAX_STORED,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_predicted = max_blocks
        self.max_stored = max_stored
        self._caps: dict[SourceKey, int] = {}
        self._sources: dict[SourceKey, _Source] = {}

    # ------------------------------------------------------------------ queries

    def sources(self) -> list[SourceKey]:
        return list(self._sources)

    def block_count(self, source: SourceKey) -> int:
        """Blocks ``source`` holds in either layer (a block in both counts once)."""
        s = self._sources.get(source)
        if s is None:
            return 0
        extra = sum(1 for h in s.predicted if h not in s.name_of) if s.predicted else 0
        return len(s.name_of) + extra

    def stored_count(self, source: SourceKey) -> int:
        s = self._sources.get(source)
        return len(s.name_of) if s is not None else 0

    def names_count(self, source: SourceKey) -> int:
        """Engine names kept for ``source`` (equal to :meth:`stored_count`: both maps are capped together)."""
        s = self._sources.get(source)
        return len(s.names) if s is not None else 0

    def total_blocks(self) -> int:
        return sum(len(s.name_of) + len(s.predicted) for s in self._sources.values())

    def overlap(self, source: SourceKey, hashes: Sequence[int], now: float = 0.0) -> int:
        """Leading blocks of ``hashes`` that ``source`` holds in either layer (binary search)."""
        s = self._sources.get(source)
        if s is None or not hashes or not (s.name_of or s.predicted):
            return 0
        stored = s.name_of
        predicted = s.predicted

        def held(i: int) -> bool:
            h = hashes[i]
            if h in stored:
                return True
            expiry = predicted.get(h)
            return expiry is not None and expiry >= now

        lo, hi = 0, len(hashes)  # invariant: blocks [0, lo) held; block hi (if any) not held
        if not held(0):
            return 0
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

    def touch(self, source: SourceKey, block: int) -> None:
        """A request hit ``source`` up to ``block``: a leaf there becomes the most recently used."""
        s = self._sources.get(source)
        if s is not None and block in s.leaves:
            del s.leaves[block]
            s.leaves[block] = None

    # ------------------------------------------------------------------ predicted layer

    def record(self, source: SourceKey, hashes: Sequence[int], now: float) -> None:
        """Assume ``source`` now caches ``hashes`` (a prompt routed there), until ``now + ttl_s``."""
        if not hashes:
            return
        s = self._sources.setdefault(source, _Source())
        expiry = now + self.ttl_s if self.ttl_s is not None else float("inf")
        blocks = s.predicted
        # re-insert so dict order is recency order (eviction drops the least recent first), leaves
        # before their parents: a prompt's parents are then more recent and outlive its leaves
        for h in hashes:
            blocks.pop(h, None)
        blocks.update(dict.fromkeys(reversed(hashes), expiry))
        if len(blocks) > self.max_predicted:
            self._trim_predicted(s, now)

    def _trim_predicted(self, s: _Source, now: float) -> None:
        blocks = s.predicted
        if self.ttl_s is not None:
            for h in [h for h, exp in blocks.items() if exp < now]:
                del blocks[h]
        excess = len(blocks) - self.max_predicted
        if excess > 0:
            # evict a little more than needed to amortise the scan
            drop = [h for _, h in zip(range(excess + self.max_predicted // 16), blocks, strict=False)]
            for h in drop:
                del blocks[h]

    # ------------------------------------------------------------------ stored layer

    def set_max_stored(self, source: SourceKey, blocks: int) -> None:
        """Cap ``source``'s stored blocks at ``blocks`` (at least 1)."""
        self._caps[source] = max(1, blocks)
        s = self._sources.get(source)
        if s is not None:
            self._trim_stored(s, self._caps[source])

    def stored(
        self,
        source: SourceKey,
        engine_hashes: Sequence[Hashable],
        parent_engine_hash: Hashable | None,
        token_ids: Sequence[int],
        block_size: int,
    ) -> list[int]:
        """Apply a ``BlockStored``: ``token_ids`` holds ``len(engine_hashes)`` blocks of ``block_size``.

        Returns our hashes of the blocks stored (in order), for the caller's SWA model.
        """
        s = self._sources.setdefault(source, _Source())
        s.stored_events += 1
        if parent_engine_hash is None:
            parent = ROOT_HASH
        else:
            known = s.names.get(parent_engine_hash)
            # an unknown parent (an event we never saw): hash under a name no prompt can produce
            parent = known if known is not None else hash(("unknown-parent", parent_engine_hash))
        name_of, names, parents, children, leaves = s.name_of, s.names, s.parent, s.children, s.leaves
        out: list[int] = []
        for i, name in enumerate(engine_hashes):
            block = token_ids[i * block_size : (i + 1) * block_size]
            if len(block) < block_size:
                break
            h = hash((parent, tuple(block)))
            out.append(h)
            old_name = name_of.get(h)
            if old_name is None:
                # a new block under `parent`: the parent is no leaf any more
                if parent in name_of:
                    count = children.get(parent, 0)
                    if count == 0:
                        leaves.pop(parent, None)
                        s.exposed.pop(parent, None)
                    children[parent] = count + 1
                parents[h] = parent
                leaves[h] = None  # a leaf until a child arrives (removed again below if one does)
            elif old_name != name:
                names.pop(old_name, None)
            name_of[h] = name
            names[name] = h
            parent = h
        if out:
            # the stored path's leaf is the most recently used (a re-stored leaf moves to the end)
            last = out[-1]
            if last in leaves:
                del leaves[last]
                leaves[last] = None
        cap = self._caps.get(source, self.max_stored)
        if len(name_of) > cap:
            self._trim_stored(s, cap)
        return out

    def removed(self, source: SourceKey, engine_hashes: Iterable[Hashable]) -> list[int]:
        """Apply a ``BlockRemoved`` event; returns our hashes of the blocks it removed."""
        s = self._sources.get(source)
        if s is None:
            return []
        s.removed_events += 1
        out: list[int] = []
        for name in engine_hashes:
            ours = s.names.get(name)
            if ours is not None:
                self._drop(s, ours)
                s.predicted.pop(ours, None)  # the engine no longer has it, whatever we predicted
                out.append(ours)
        return out

    def _drop(self, s: _Source, h: int, *, exposed: bool = False) -> None:
        """Forget stored block ``h``; its parent becomes a leaf when ``h`` was its last child."""
        name = s.name_of.pop(h, None)
        if name is not None and s.names.get(name) == h:
            del s.names[name]
        s.leaves.pop(h, None)
        s.exposed.pop(h, None)
        s.children.pop(h, None)  # children left behind (a removed inner block) keep their entries
        parent = s.parent.pop(h, None)
        if parent is not None and parent in s.name_of:
            count = s.children.get(parent, 0) - 1
            if count > 0:
                s.children[parent] = count
            else:
                s.children.pop(parent, None)
                if exposed:
                    s.exposed[parent] = None
                else:
                    s.leaves[parent] = None

    def _trim_stored(self, s: _Source, cap: int) -> None:
        """Evict leaves, coldest first, until ``cap`` minus a sixteenth (amortising the work)."""
        target = max(0, cap - cap // 16) if len(s.name_of) > cap else cap
        while len(s.name_of) > target:
            if s.exposed:
                h = next(iter(s.exposed))
            elif s.leaves:
                h = next(iter(s.leaves))
            else:  # only inner blocks whose leaves were removed as inner blocks: any will do
                h = next(iter(s.name_of))
            self._drop(s, h, exposed=True)
            s.evicted += 1

    def clear(self, source: SourceKey) -> None:
        """Forget everything ``source`` holds (``AllBlocksCleared``, a sequence gap, a restart)."""
        s = self._sources.get(source)
        if s is not None:
            for part in (s.name_of, s.names, s.parent, s.children, s.leaves, s.exposed, s.predicted):
                part.clear()
            s.clears += 1

    def drop_worker(self, url: str) -> None:
        """Forget every source of worker ``url`` (it left the pool or died)."""
        for key in [k for k in self._sources if k[0] == url]:
            del self._sources[key]
        for key in [k for k in self._caps if k[0] == url]:
            del self._caps[key]
