"""The prompt-id caches: text runs seen before (:class:`RunCache`) and recent prompts found by the head
of their conversation (:class:`PrefixCache`), both bounded in bytes and expiring idle entries.

Why cached ids can be reused at a special-token boundary is explained in :mod:`.segment_encoding`, which
fills and reads these caches.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

from deepseek_frontend.formats.segments import PromptSegment

#: default memory budget of the run cache: run text plus its ids (4 bytes each)
RUN_CACHE_BYTES = 256 * 1024 * 1024
#: runs shorter than this are cheap to re-encode and not worth an LRU slot
RUN_CACHE_MIN_CHARS = 16
#: default memory budget of the prefix cache: each entry's segment texts plus its ids (4 bytes each)
PREFIX_CACHE_BYTES = 512 * 1024 * 1024
#: recent prompts kept for prefix reuse, one per conversation head
PREFIX_CACHE_MAX_ENTRIES = 4096
#: entries unused this long are dropped (on the next cache use, or by :meth:`.PromptTokenizer.expire_idle`)
CACHE_IDLE_SECONDS = 600.0
#: bookkeeping bytes per cache entry (dict slot, key, array header, timestamps), beyond text and ids
_ENTRY_OVERHEAD = 200
#: bookkeeping bytes per cached prompt segment (the segment tuple and its list slot)
_SEGMENT_OVERHEAD = 72
#: segments identifying a conversation: BOS, system prompt (with tools), role token, first user turn
PREFIX_KEY_SEGMENTS = 4
#: block size of the C-level comparisons that locate where two prompts diverge
_COMPARE_BLOCK = 2048


def id_array(ids: Sequence[int]) -> array:
    """Ids as a compact C array: 4 bytes an id instead of ~36 for a list of Python ints."""
    return array("i", ids)


_K = TypeVar("_K")
_E = TypeVar("_E")


class _TimedCache(Generic[_K, _E]):
    """What the tokenizer's caches share: an LRU ``OrderedDict`` (oldest use first) bounded in
    bytes, with idle expiry, a lock and hit/miss counters. Thread-safe.

    A subclass says what an entry is and how eviction reads its cost and last use
    (:meth:`_evict`, called with the lock held).
    """

    def __init__(self, max_bytes: int, idle_s: float) -> None:
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self._entries: OrderedDict[_K, _E] = OrderedDict()
        self.bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def _insert(self, key: _K, entry: _E, cost: int, old_cost: int | None, now: float) -> None:
        """Store ``entry`` (``cost`` bytes) as the most recent one and evict (lock held);
        ``old_cost`` is the cost of the entry it replaces, already popped, if any."""
        if old_cost is not None:
            self.bytes -= old_cost
        self._entries[key] = entry
        self.bytes += cost
        self._evict(now)

    def _evict(self, now: float) -> None:
        raise NotImplementedError

    def expire_idle(self) -> None:
        """Drop the entries unused for ``idle_s`` seconds (and any over the bounds)."""
        with self._lock:
            self._evict(time.monotonic())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(entries={len(self._entries)}, bytes={self.bytes}, "
            f"hits={self.hits}, misses={self.misses})"
        )


class RunCache(_TimedCache[str, tuple[array, int, float]]):
    """Bounded LRU of ``run text -> token ids``, sized in bytes and expiring idle entries. Thread-safe.

    An entry costs the run's string, its ids at 4 bytes each, and a fixed overhead; the
    total never exceeds ``max_bytes``. ``get`` returns the ids as a compact array (a
    ``list.extend`` argument). Entries unused for ``idle_s`` seconds are dropped when the
    cache is next used or by :meth:`expire_idle`.
    """

    def __init__(self, max_bytes: int = RUN_CACHE_BYTES, idle_s: float = CACHE_IDLE_SECONDS) -> None:
        #: entries: text -> (ids, cost in bytes, last use on the monotonic clock)
        super().__init__(max_bytes, idle_s)

    def get(self, text: str) -> array | None:
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(text)
            if entry is None:
                self.misses += 1
                return None
            self._entries[text] = (entry[0], entry[1], now)
            self._entries.move_to_end(text)
            self.hits += 1
            return entry[0]

    def put(self, text: str, ids: Sequence[int]) -> None:
        """Store ``text``'s ids. An ``array("i")`` is kept as it is (never mutate it afterwards)."""
        cost = sys.getsizeof(text) + 4 * len(ids) + _ENTRY_OVERHEAD
        if cost > self.max_bytes:
            return
        entry = ids if isinstance(ids, array) and ids.typecode == "i" else id_array(ids)
        now = time.monotonic()
        with self._lock:
            old = self._entries.pop(text, None)
            self._insert(text, (entry, cost, now), cost, None if old is None else old[1], now)

    def _evict(self, now: float) -> None:
        """Drop idle entries, then least recently used ones down to the budget (lock held)."""
        entries = self._entries
        horizon = now - self.idle_s
        while entries:
            text, (_, cost, used) = next(iter(entries.items()))
            if self.bytes <= self.max_bytes and used >= horizon:
                break
            del entries[text]
            self.bytes -= cost


class PrefixCache(_TimedCache[tuple[PromptSegment, ...], "_PrefixEntry"]):
    """Recent prompts' segments and ids, found by the head of their conversation.

    An agent resends its whole conversation every turn. The entry for a prompt
    keeps its segment list, its ids, and for every special segment its index and
    the id count after it. A new prompt with the same head (its first
    :data:`PREFIX_KEY_SEGMENTS` segments) reuses the ids up to the last special
    segment inside the common prefix: text runs between special tokens are
    tokenized independently (see :mod:`.segment_encoding`), so those ids are exactly
    what a fresh encode would give. A conversation's newest prompt replaces its
    previous one.

    Bounded in bytes (each entry: its segment texts, its ids at 4 bytes each, its reuse
    points and a fixed overhead) and in entries; least recently used entries go first,
    and entries unused for ``idle_s`` seconds are dropped when the cache is next used or
    by :meth:`expire_idle`. Thread-safe.
    """

    def __init__(
        self,
        max_entries: int = PREFIX_CACHE_MAX_ENTRIES,
        max_bytes: int = PREFIX_CACHE_BYTES,
        idle_s: float = CACHE_IDLE_SECONDS,
    ) -> None:
        super().__init__(max_bytes, idle_s)
        self.max_entries = max_entries
        #: ids served from the cache in all (a hit's reused prefix)
        self.reused_ids = 0

    def lookup(self, segments: list[PromptSegment]) -> tuple[int, array, list[int], list[int]] | None:
        """``(start, ids, special_pos, special_end)`` to continue from, or ``None``.

        ``ids`` are the ids of ``segments[:start]`` (a compact array: copied in one memcpy, and
        stored again as it is once the prompt's other ids are appended); all are fresh copies.
        """
        key = tuple(segments[:PREFIX_KEY_SEGMENTS])
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.used = time.monotonic()
                self._entries.move_to_end(key)
        if entry is None:
            self.misses += 1
            return None
        common = _common_prefix_length(entry.segments, segments)
        last = bisect_left(entry.special_pos, common) - 1  # the last special segment inside the common part
        if last < 0:
            self.misses += 1
            return None
        self.hits += 1
        n_ids = entry.special_end[last]
        self.reused_ids += n_ids
        return (
            entry.special_pos[last] + 1,
            entry.ids[:n_ids],
            entry.special_pos[: last + 1],
            entry.special_end[: last + 1],
        )

    def store(
        self,
        segments: list[PromptSegment],
        ids: Sequence[int],
        special_pos: list[int],
        special_end: list[int],
    ) -> None:
        """Remember a prompt; ``ids`` given as an ``array("i")`` are kept as they are (not copied)."""
        if self.max_entries <= 0 or not special_pos:
            return
        cost = (
            _ENTRY_OVERHEAD
            + 4 * len(ids)
            + 16 * len(special_pos)
            + _SEGMENT_OVERHEAD * len(segments)
            + sum(map(sys.getsizeof, [seg.text for seg in segments]))
        )
        if cost > self.max_bytes:
            return
        key = tuple(segments[:PREFIX_KEY_SEGMENTS])
        now = time.monotonic()
        kept = ids if isinstance(ids, array) and ids.typecode == "i" else id_array(ids)
        entry = _PrefixEntry(segments, kept, special_pos, special_end, cost, now)
        with self._lock:
            old = self._entries.pop(key, None)
            self._insert(key, entry, cost, None if old is None else old.cost, now)

    def _evict(self, now: float) -> None:
        """Drop idle entries, then least recently used ones down to both bounds (lock held)."""
        entries = self._entries
        horizon = now - self.idle_s
        while entries:
            key, oldest = next(iter(entries.items()))
            if self.bytes <= self.max_bytes and len(entries) <= self.max_entries and oldest.used >= horizon:
                break
            del entries[key]
            self.bytes -= oldest.cost


class _PrefixEntry:
    __slots__ = ("cost", "ids", "segments", "special_end", "special_pos", "used")

    def __init__(
        self,
        segments: list[PromptSegment],
        ids: array,
        special_pos: list[int],
        special_end: list[int],
        cost: int,
        used: float,
    ) -> None:
        self.segments = segments
        self.ids = ids
        self.special_pos = special_pos
        self.special_end = special_end
        self.cost = cost
        self.used = used


def _common_prefix_length(a: list[PromptSegment], b: list[PromptSegment]) -> int:
    """Length of the common prefix of two segment lists, compared in C block by block."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n  # the usual case: the new prompt extends the old one
    i = 0
    while i + _COMPARE_BLOCK <= n and a[i : i + _COMPARE_BLOCK] == b[i : i + _COMPARE_BLOCK]:
        i += _COMPARE_BLOCK
    while a[i] == b[i]:  # stops inside this block: a difference exists before n
        i += 1
    return i
