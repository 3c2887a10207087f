"""Prompt ids from renderer segments, through the prompt-id caches: :class:`PendingEncoding` and the two
steps around its tokenizing (:func:`start_encoding`, :func:`finish_encoding`); the tokenizing of many
prompts' text in one call (:func:`encode_together`).

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
token both share (:class:`~.caches.PrefixCache`), and any other run seen before comes from
the :class:`~.caches.RunCache`; only new text is tokenized. A sampled self-check re-encodes
whole prompts at a low rate and switches both caches off (with an error log) if
the invariant ever fails (:meth:`.PromptTokenizer.self_check`).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from random import Random
from typing import Protocol

from deepseek_frontend.formats.segments import PromptSegment
from deepseek_frontend.tokenization.caches import RUN_CACHE_MIN_CHARS, PrefixCache, RunCache


class SegmentTokenizer(Protocol):
    """What encoding segments reads of its tokenizer (a ``PromptTokenizer``): the prompt-id caches,
    the added-token spellings and their ids, the text encoder, and the sampled self-check."""

    cache: RunCache
    prefix_cache: PrefixCache
    _added: dict[str, int]
    self_check_rate: float
    _rng: Random

    def token_id(self, spelling: str) -> int: ...

    def _encode_arrays(self, texts: list[str], *, bulk: bool = False) -> list[array]: ...

    def self_check(self, segments: list[PromptSegment], ids: Sequence[int]) -> None: ...


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
        "seconds",
        "segments",
        "self_check_due",
        "special_end",
        "special_pos",
        "tokenizer",
        "uncached_chars",
    )

    def __init__(
        self,
        tokenizer: SegmentTokenizer,
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
        #: seconds spent tokenizing them (in a batch, this prompt's share of it by characters)
        self.seconds = 0.0
        self.finished = False
        #: the prompt was sampled for :meth:`PromptTokenizer.self_check` and the caller runs it
        self.self_check_due = False

    def encode(self) -> None:
        """Tokenize the missing runs (``FormatError`` for a lone surrogate); idempotent.

        Each run's ids are an ``array("i")``, made once: it is then both the run cache's entry and
        the source of the prompt array's ``extend`` (a memory copy), where extending from a list
        converted every id again (0.16 ms of 0.37 for a 1,600-token prompt).
        """
        if self.encoded is None:
            started = time.perf_counter()
            self.encoded = self.tokenizer._encode_arrays(self.missing)
            self.seconds += time.perf_counter() - started


def encode_together(pendings: list[PendingEncoding]) -> list[BaseException | None]:
    """:meth:`PendingEncoding.encode` of every one of ``pendings``, in one text-encoder call per
    tokenizer among them: the texts are encoded with the GIL released throughout (``tiktoken`` on
    texts joined into one, or the Rust tokenizer's own threads), so many requests' cold text costs
    one call's GIL hand-offs, not one each.

    Returns, per pending encoding, the exception its own ``encode`` raises (a ``FormatError`` for a
    lone surrogate in its text), or None. A text that cannot be tokenized fails only its own
    prompt: when a batch raises, its prompts are encoded one by one.
    """
    groups: dict[int, list[PendingEncoding]] = {}
    for pending in pendings:
        if pending.encoded is None:
            groups.setdefault(id(pending.tokenizer), []).append(pending)
    failed: dict[int, BaseException] = {}
    for group in groups.values():
        texts = [text for pending in group for text in pending.missing]
        started = time.perf_counter()
        try:
            encoded = group[0].tokenizer._encode_arrays(texts, bulk=True)  # on the batch thread
        except Exception:
            for pending in group:
                try:
                    pending.encode()
                except Exception as exc:
                    failed[id(pending)] = exc
            continue
        share = (time.perf_counter() - started) / max(1, sum(pending.uncached_chars for pending in group))
        at = 0
        for pending in group:
            count = len(pending.missing)
            pending.encoded = encoded[at : at + count]
            pending.seconds += share * pending.uncached_chars
            at += count
    return [failed.get(id(pending)) for pending in pendings]


def start_encoding(
    tokenizer: SegmentTokenizer, segments: Sequence[PromptSegment], cache_limit: int | None
) -> PendingEncoding:
    """:meth:`.PromptTokenizer.start_encoding`: split ``segments`` into special ids and maximal text
    runs after the prefix cache's hit, and look each run up in the run cache."""
    if not isinstance(segments, list):
        segments = list(segments)
    hit = tokenizer.prefix_cache.lookup(segments)
    if hit is None:
        start, ids, special_pos, special_end = 0, array("i"), [], []
    else:
        start, ids, special_pos, special_end = hit
    added = tokenizer._added
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
                tokenizer.token_id(text)  # raises the FormatError naming the spelling
            runs.append(token)  # type: ignore[arg-type]
            special_pos.append(index)
        elif text:
            pending.append(text)
    if pending:
        runs.append(pending[0] if len(pending) == 1 else "".join(pending))

    cache = tokenizer.cache
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
        tokenizer, segments, ids, special_pos, special_end, runs, resolved, missing, cache_limit
    )


def finish_encoding(tokenizer: SegmentTokenizer, pending: PendingEncoding, defer_self_check: bool) -> array:
    """:meth:`.PromptTokenizer.finish_encoding`: join the runs' ids with the special ids, fill both caches
    (unless over ``cache_limit``) and sample the prompt for the self-check. The ids come as an
    ``array("i")`` of their own (a memory copy of the prefix cache's entry)."""
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
            cache = tokenizer.cache
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
    # a copy: ``out`` may become the prefix cache's entry, and a caller owns what it is given
    ids = out[:]
    if not cacheable:
        return ids
    # the array itself becomes the cache entry: a follow-up's prefix is never copied into a
    # list of Python ints and back (0.3 ms of a 12K-token follow-up's 0.8)
    tokenizer.prefix_cache.store(pending.segments, out, pending.special_pos, pending.special_end)
    if tokenizer.self_check_rate and tokenizer._rng.random() < tokenizer.self_check_rate:
        if defer_self_check:
            pending.self_check_due = True
        else:
            tokenizer.self_check(pending.segments, ids)
    return ids
