"""The :class:`PromptTokenizer` facade: one DeepSeek ``tokenizer.json`` loaded twice, the ids of
template tokens, prompt encoding through the caches, decoding, and cache upkeep.

Injection safety
----------------
Only segments the renderer marked ``special`` become special ids. Every other
character -- message content, reasoning, tool schemas, results -- is encoded by
a second tokenizer in which *no* added token is recognised, so a user who types
``<｜end▁of▁sentence｜>`` or ``</think>`` gets ordinary text pieces.

The work behind the methods lives beside this module: the caches (:mod:`.caches`), segment encoding
(:mod:`.segment_encoding`), text encoding (:mod:`.text_encoding`) and detokenization
(:mod:`.detokenization`).
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
from array import array
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats.segments import PromptSegment, join_segments
from deepseek_frontend.generation import is_id_array
from deepseek_frontend.tokenization import segment_encoding
from deepseek_frontend.tokenization.bundled import bundled_tokenizer_path
from deepseek_frontend.tokenization.caches import (
    CACHE_IDLE_SECONDS,
    PREFIX_CACHE_BYTES,
    RUN_CACHE_BYTES,
    PrefixCache,
    RunCache,
)
from deepseek_frontend.tokenization.detokenization import IncrementalDetokenizer, byte_level_table
from deepseek_frontend.tokenization.segment_encoding import PendingEncoding
from deepseek_frontend.tokenization.text_encoding import SHORT_TEXT_CHARS, TextEncoder, encode_short
from deepseek_frontend.tokenization.tiktoken_encoder import tiktoken_text_for

logger = logging.getLogger(__name__)

#: fraction of prompts re-encoded whole to check the per-run invariant (the check costs one full encode)
SELF_CHECK_RATE = 1 / 512

BOS_SPELLING = "<｜begin▁of▁sentence｜>"
EOS_SPELLING = "<｜end▁of▁sentence｜>"
#: where the byte holding an ``array("i")`` item's sign is, within the item's four native bytes
_SIGN_BYTE = 3 if sys.byteorder == "little" else 0


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
        fast, why = tiktoken_text_for(tokenizer_json, data, self.text)
        #: plain text -> ids: by tiktoken when it gives ``text``'s ids, else by ``text`` itself
        self.text_encoder = TextEncoder(self.text, fast)
        logger.debug("%s: text encoded by %s (%s)", source, self.text_encoder.kind, why)
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
        self._id_bytes = byte_level_table(self.full, data)
        # The Rust tokenizer's thread pool starts at the first batch of several texts, and its
        # threads keep the priority of the thread that started it: started here, by whoever loads
        # the tokenizer, not by a lower-priority offload thread that happened to encode first.
        self.text.encode_batch_fast(["", ""], add_special_tokens=False)

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

    def _encode_texts(self, texts: list[str], *, bulk: bool = False) -> list[list[int]]:
        """Ids of each text as the text tokenizer gives them; lone surrogates are a FormatError.
        ``bulk``: see :meth:`.text_encoding.TextEncoder.encode`."""
        return self.text_encoder.encode(texts, bulk=bulk)

    def _encode_arrays(self, texts: list[str], *, bulk: bool = False) -> list[array]:
        """:meth:`_encode_texts`, each text's ids an ``array("i")`` (what the prompt caches hold)."""
        return self.text_encoder.encode_arrays(texts, bulk=bulk)

    def encode_raw(self, text: str) -> list[int]:
        """Ids as ``tokenizer.encode(text)`` gives them: spellings ARE recognised (raw prompts only)."""
        if len(text) <= SHORT_TEXT_CHARS:
            return encode_short(self.full, [text])[0]  # holding the GIL (text_encoding.py)
        try:
            # the same ids as ``encode``, without its character offsets and with the GIL released
            # (text_encoding.py)
            return self.full.encode_batch_fast([text], add_special_tokens=False)[0].ids
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
        What is left is encoded in one text-encoder call (:class:`.text_encoding.TextEncoder`).

        The same in three steps, for a caller that runs the costly middle one elsewhere:
        :meth:`start_encoding`, :meth:`PendingEncoding.encode`, :meth:`finish_encoding`.
        """
        pending = self.start_encoding(segments, cache_limit=cache_limit)
        pending.encode()
        return self.finish_encoding(pending).tolist()

    def start_encoding(
        self, segments: Sequence[PromptSegment], *, cache_limit: int | None = None
    ) -> PendingEncoding:
        """Resolve what the caches know of ``segments``' ids (cheap: lookups, no tokenizing).

        The returned :class:`PendingEncoding` says how much text is left to tokenize
        (``uncached_chars``); its :meth:`~PendingEncoding.encode` does that and may run on
        another thread (the text encoder releases the GIL for text of any length worth a
        thread); :meth:`finish_encoding` then gives the ids. Raises ``FormatError`` for a special
        segment that is not one token.
        """
        return segment_encoding.start_encoding(self, segments, cache_limit)

    def finish_encoding(self, pending: PendingEncoding, *, defer_self_check: bool = False) -> array:
        """The prompt ids of an encoded :class:`PendingEncoding`, as an ``array("i")`` the caller
        owns (a 29K-token prompt's ids as a list of ints would cost 0.3 ms more, and a list that
        long is walked by every collection of the cycle collector it meets); fills both caches
        (unless the prompt is over its ``cache_limit``).

        One prompt in ``1 / self_check_rate`` is checked against a whole-prompt encode
        (:meth:`self_check`), here or -- ``defer_self_check`` -- by the caller, which then finds
        ``pending.self_check_due`` set (an event loop must not run it: 36 ms for 12K tokens).
        """
        return segment_encoding.finish_encoding(self, pending, defer_self_check)

    def self_check(self, segments: list[PromptSegment], ids: Sequence[int]) -> None:
        """Compare with a whole-prompt encode; on mismatch, log and stop caching. Thread-safe."""
        if any(not seg.special and self.contains_token_spelling(seg.text) for seg in segments):
            return  # request text spells a token: the safe ids differ from a naive encode by design
        if self.encode_raw(join_segments(segments)) != list(ids):
            logger.error(
                "prompt id caches disagree with a whole-prompt encode; disabling them and encoding "
                "text with tokenizers"
            )
            self.text_encoder.use_reference()
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
        simulated engine reads every prompt it serves this way). ``ids`` may be the pipeline's
        ``array("i")`` as it is: no list is made of it.
        """
        table = self._id_bytes
        if table is not None and not skip_special_tokens and _no_negative(ids):
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


def _no_negative(ids: Sequence[int]) -> bool:
    """Whether no id of ``ids`` is negative (a negative index would read the byte table from its end).

    An ``array("i")`` is checked on its bytes: an id is negative when the high bit of its sign
    byte is set, and ``isascii`` tests every such byte in one C pass (12 us for 17K ids, where
    ``min`` boxed each id: 370 us, more than the decode's join).
    """
    if is_id_array(ids):
        return ids.tobytes()[_SIGN_BYTE::4].isascii()
    return not ids or min(ids) >= 0
