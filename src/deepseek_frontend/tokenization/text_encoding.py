"""Plain text to ids, without holding the GIL longer than it must.

Owns how a list of text runs is encoded: by ``tiktoken`` where it gives the reference tokenizer's
ids (:mod:`.tiktoken_encoder`), else by HF ``tokenizers``' ``encode_batch_fast`` (which releases the
GIL and computes no character offsets); short texts holding the GIL; texts over
:data:`LONG_RUN_CHARS` cut at pre-token boundaries (:func:`split_long_run`) so their cost stays
linear; a lone UTF-16 surrogate reported as a ``FormatError`` that names it. Which tokenizer is
the reference (the injection-safe text one) is the caller's choice.
"""

from __future__ import annotations

import logging
import re
from array import array
from collections.abc import Sequence

from tokenizers import Tokenizer

from deepseek_frontend.errors import FormatError
from deepseek_frontend.tokenization.caches import id_array
from deepseek_frontend.tokenization.tiktoken_encoder import TiktokenText

logger = logging.getLogger(__name__)

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")

#: text runs longer than this are encoded in pieces (see :func:`split_long_run`)
LONG_RUN_CHARS = 65_536
#: texts (together) of at most this many characters are encoded holding the GIL (:func:`encode_short`)
SHORT_TEXT_CHARS = 1024
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


def encode_texts(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Encode with ``tokenizer``, all in one call; lone surrogates are a FormatError.

    Every text, whatever its length, goes through ``Tokenizer.encode_batch_fast``: it releases the
    GIL (``Tokenizer.encode`` holds it for the whole encode: a 10 K-character text kept the event
    loop from running for about 4 ms, even with the encode on another thread), and it skips the
    character offsets ``encode`` and ``encode_batch`` compute -- a map from byte to character
    positions filled for every token, which a prompt never needs. The ids are the same (they are
    computed before the offsets); the CPU is 0.96 ms instead of 1.19 (``encode_batch``) and 1.11
    (``encode``) for a 1,000-word prompt, 25 us instead of 31 for 20 characters.
    """
    try:
        if any(len(t) > LONG_RUN_CHARS for t in texts):
            return _encode_long(tokenizer, texts)
        return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    except TypeError:
        # The Rust side only takes valid Unicode; Python strings may hold lone UTF-16 surrogates.
        for text in texts:
            _refuse_lone_surrogate(text)
        raise


def encode_short(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Encode short texts with ``tokenizer`` holding the GIL; lone surrogates are a FormatError.

    A call that releases the GIL (``encode_batch_fast``, ``tiktoken``) must take it back after,
    and while another thread runs Python that waits up to the interpreter's switch interval:
    encoding 200 characters took 2.5 ms that way (``tiktoken``; ``encode_batch_fast`` 5.2 ms) with
    one busy thread beside it, against 0.056 ms with ``Tokenizer.encode``, which keeps the GIL --
    on the event loop, or on the simulated engine's planning thread before a first token, the
    wait is what counts. ``Tokenizer.encode`` gives the same ids (it computes character offsets
    too, which costs little at this length).
    """
    try:
        return [tokenizer.encode(text, add_special_tokens=False).ids for text in texts]
    except TypeError:
        for text in texts:
            _refuse_lone_surrogate(text)
        raise


def _encode_long(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
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
            tokenizer.encode_batch_fast(pieces[first : first + _PIECES_PER_BATCH], add_special_tokens=False)
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


class TextEncoder:
    """Plain text -> ids of ``reference`` (an HF tokenizer recognising no added token), by ``fast``
    where given (a ``tiktoken`` encoding checked to give the same ids), else by ``reference``.

    Thread-safe: ``encode`` keeps no state; :meth:`use_reference` is one attribute store.
    """

    def __init__(self, reference: Tokenizer, fast: TiktokenText | None = None):
        self.reference = reference
        self.fast = fast

    @property
    def kind(self) -> str:
        """Which library encodes: ``"tiktoken"`` or ``"tokenizers"``."""
        return "tokenizers" if self.fast is None else "tiktoken"

    def use_reference(self) -> None:
        """Encode with the reference tokenizer from now on (its ids were found to differ)."""
        self.fast = None

    def encode(self, texts: list[str], *, bulk: bool = False) -> list[list[int]]:
        """Ids of each text; lone surrogates are a FormatError. ``bulk``: the calling thread
        encodes many requests' text (it gets a ``tiktoken`` encoding of its own, see
        :class:`.tiktoken_encoder.TiktokenText`).

        Texts of at most :data:`SHORT_TEXT_CHARS` together are encoded holding the GIL: ASCII
        ones by ``tiktoken``'s pieces (:meth:`.TiktokenText.encode_short_ascii`, once checked),
        others by :func:`encode_short`."""
        return [ids if isinstance(ids, list) else ids.tolist() for ids in self._encode(texts, bulk)]

    def encode_arrays(self, texts: list[str], *, bulk: bool = False) -> list[array]:
        """:meth:`encode`, each text's ids an ``array("i")`` (what the prompt caches hold): from
        ``tiktoken`` they come as arrays, without a Python int made of each id on the way."""
        return [ids if isinstance(ids, array) else id_array(ids) for ids in self._encode(texts, bulk)]

    def _encode(self, texts: list[str], bulk: bool) -> Sequence[list[int] | array]:
        fast = self.fast
        if sum(map(len, texts)) <= SHORT_TEXT_CHARS:
            if fast is not None and fast.short_ascii and all(text.isascii() for text in texts):
                return [fast.encode_short_ascii(text) for text in texts]
            return encode_short(self.reference, texts)
        if fast is None:
            return encode_texts(self.reference, texts)
        if bulk:
            fast.claim_thread()
        for text in texts:
            if not text.isascii():  # O(1) for ASCII text: CPython keeps the flag
                _refuse_lone_surrogate(text)
        try:
            if all(len(text) <= LONG_RUN_CHARS for text in texts):
                return fast.encode_arrays(texts)
            return [
                fast.encode_array(text) if len(text) <= LONG_RUN_CHARS else self._encode_long(fast, text)
                for text in texts
            ]
        except BaseException as exc:
            # A Rust panic (pyo3's PanicException derives from BaseException): the pattern engine's
            # backtracking limit on some text it was not checked against. The reference encodes it.
            if type(exc).__name__ != "PanicException":
                raise
            logger.warning("tiktoken failed on a text (%s); tokenizers encoded the batch", exc)
            return encode_texts(self.reference, texts)

    def _encode_long(self, fast: TiktokenText, text: str) -> array:
        """A text over :data:`LONG_RUN_CHARS`: pieces at pre-token boundaries, each by ``tiktoken``
        (the pattern engine's stack is bounded per match), a piece with no such boundary by the
        reference."""
        ids = array("i")
        for piece in split_long_run(text):
            if len(piece) <= LONG_RUN_CHARS:
                ids.extend(fast.encode_array(piece))
            else:
                ids.extend(encode_texts(self.reference, [piece])[0])
        return ids


def _refuse_lone_surrogate(text: str) -> None:
    bad = _LONE_SURROGATE.search(text)
    if bad is not None:
        raise FormatError(
            f"text contains a lone UTF-16 surrogate U+{ord(bad.group()):04X} at character "
            f"{bad.start()}; it cannot be tokenized"
        )
