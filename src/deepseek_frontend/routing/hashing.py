"""Chained block hashes of prompt token ids (pure: no I/O, no clocks).

A prompt is cut into blocks of ``page_size`` token ids (the engine's KV page size: SGLang
runs DeepSeek-V4 with 256-token pages). Block ``k``'s hash is computed from block ``k-1``'s
hash and block ``k``'s ids, so one hash identifies the whole prefix up to and including the
block: two prompts share block ``k``'s hash exactly when they share their first ``k+1``
blocks. Only full blocks are hashed; an engine cannot reuse a partial page.

The hash function is Python's tuple hash: fast, 64-bit, and stable within one process --
which is all the router needs, because it hashes both the prompts it routes and the token
ids that engines report in their KV events with the same function (engines' own hash
values are only used as names, see :mod:`deepseek_frontend.routing.index`).

:class:`PrefixHashCache` makes hashing incremental: an agent's turn resends the previous
turn's prompt plus a few thousand new tokens, so the hashes of the shared prefix are
reused and only the new blocks are hashed. Reuse is verified on a sample of positions (every
``SAMPLE_STRIDE``-th id plus the whole last shared block), not on every id; a prefix that
differs only between sampled positions would be mistaken for the cached one. That can only
mislead a routing estimate (the engine computes its cache hit itself), never an answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ROOT_HASH", "PrefixHashCache", "block_hashes", "chain_hash"]

#: the parent hash of a prompt's first block
ROOT_HASH = 0
#: every SAMPLE_STRIDE-th id of a cached prefix is kept to verify that a new prompt extends it
SAMPLE_STRIDE = 256
#: prompts remembered by a PrefixHashCache
DEFAULT_MAX_ENTRIES = 4096
#: total prompt tokens a PrefixHashCache describes (it keeps 1/SAMPLE_STRIDE of them plus one hash per block)
DEFAULT_MAX_TOKENS = 64 * 1024 * 1024


def chain_hash(parent: int, block: Sequence[int]) -> int:
    """The hash of a block whose prefix hashes to ``parent``."""
    return hash((parent, tuple(block)))


def block_hashes(ids: Sequence[int], page_size: int, parent: int = ROOT_HASH, start: int = 0) -> list[int]:
    """Chained hashes of the full blocks of ``ids[start:]`` (``start`` must be block-aligned).

    ``parent`` is the hash of the block before ``start`` (``ROOT_HASH`` at the beginning).
    """
    out: list[int] = []
    h = parent
    for end in range(start + page_size, len(ids) + 1, page_size):
        h = hash((h, tuple(ids[end - page_size : end])))
        out.append(h)
    return out


@dataclass(slots=True)
class _Entry:
    n_tokens: int  # block-aligned length this entry describes
    samples: list[int]  # ids[0:n_tokens:SAMPLE_STRIDE]
    last_block: list[int]  # ids[n_tokens - page_size : n_tokens]
    hashes: list[int]  # one per block
    key: int


class PrefixHashCache:
    """Block hashes of recent prompts, reused when a new prompt extends one (see module docstring).

    Entries are grouped by the hash of their first block and looked up most recent first;
    the longest verified match wins. Memory per entry: ``n_tokens / SAMPLE_STRIDE`` sampled
    ids plus one hash per block (about 0.2 MB for a 1M-token prompt with 256-token pages). An entry that a
    newer prompt extends is replaced by it, so an agent session holds one entry, not one per turn.
    """

    def __init__(
        self, page_size: int, *, max_entries: int = DEFAULT_MAX_ENTRIES, max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> None:
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # id(entry) -> entry, LRU order
        self._by_first: dict[int, list[_Entry]] = {}
        self._tokens = 0
        #: tokens whose hashes were reused / computed (for benchmarks and tests)
        self.reused_tokens = 0
        self.hashed_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def hashes(self, ids: Sequence[int]) -> list[int]:
        """Chained hashes of every full block of ``ids`` (equal to :func:`block_hashes`, modulo sampling)."""
        size = self.page_size
        n_full = len(ids) - len(ids) % size
        if n_full == 0:
            return []
        key = hash(tuple(ids[:size]))
        best: _Entry | None = None
        for entry in reversed(self._by_first.get(key, ())):
            if entry.n_tokens > n_full or (best is not None and entry.n_tokens <= best.n_tokens):
                continue
            if self._extends(ids, entry):
                best = entry
        if best is not None and best.n_tokens == n_full:
            self._entries.move_to_end(id(best))
            self.reused_tokens += n_full
            return best.hashes
        if best is None:
            hashes = block_hashes(ids, size)
        else:
            tail = block_hashes(ids, size, best.hashes[-1], best.n_tokens)
            hashes = best.hashes + tail
            self.reused_tokens += best.n_tokens
        self.hashed_tokens += n_full - (best.n_tokens if best is not None else 0)
        samples = None
        if best is not None:
            if best.n_tokens % SAMPLE_STRIDE == 0:  # extend the verified samples instead of re-slicing
                samples = best.samples + list(ids[best.n_tokens : n_full : SAMPLE_STRIDE])
            self._forget(best)  # superseded: the new entry covers every prompt that extends both
        self._remember(ids, n_full, hashes, key, samples)
        return hashes

    def _extends(self, ids: Sequence[int], entry: _Entry) -> bool:
        n = entry.n_tokens
        if ids[n - self.page_size : n] != entry.last_block:
            return False
        return ids[0:n:SAMPLE_STRIDE] == entry.samples

    def _remember(
        self, ids: Sequence[int], n_full: int, hashes: list[int], key: int, samples: list[int] | None = None
    ) -> None:
        entry = _Entry(
            n_full,
            samples if samples is not None else list(ids[0:n_full:SAMPLE_STRIDE]),
            list(ids[n_full - self.page_size : n_full]),
            hashes,
            key,
        )
        self._entries[id(entry)] = entry
        self._by_first.setdefault(key, []).append(entry)
        self._tokens += n_full
        while self._entries and (len(self._entries) > self.max_entries or self._tokens > self.max_tokens):
            self._forget(next(iter(self._entries.values())))

    def _forget(self, entry: _Entry) -> None:
        del self._entries[id(entry)]
        self._tokens -= entry.n_tokens
        group = self._by_first[entry.key]
        group.remove(entry)
        if not group:
            del self._by_first[entry.key]
