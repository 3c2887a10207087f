"""Ids back to text: :class:`IncrementalDetokenizer` for streamed engine output, and the ``id -> bytes``
table of a byte-level vocabulary that makes both it and :meth:`.PromptTokenizer.decode` a byte join.
"""

from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Sequence
from typing import Protocol

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from deepseek_frontend.errors import FormatError


class DecodingVocabulary(Protocol):
    """What a detokenizer reads of its tokenizer (a ``PromptTokenizer``): the ``id -> bytes`` table
    of a byte-level vocabulary (None for another kind), and the HF tokenizer that decodes the rest."""

    _id_bytes: list[bytes] | None
    full: Tokenizer


class IncrementalDetokenizer:
    """Turns a stream of token ids into text, one call per engine chunk.

    ``push`` returns the text completed by the new ids and never splits a UTF-8
    character: bytes of a character spread over several tokens are held until
    it completes. ``flush`` releases what is left (an incomplete character
    becomes U+FFFD). Special tokens decode to their spelling (the output parser
    needs ``</think>`` and EOS as text).
    """

    __slots__ = ("_pending", "_stream", "_table", "_tokenizer")

    def __init__(self, tokenizer: DecodingVocabulary) -> None:
        self._table = tokenizer._id_bytes
        self._tokenizer = tokenizer
        #: the bytes of a character whose last bytes have not come yet
        self._pending = b""
        self._stream: DecodeStream | None = None if self._table is not None else DecodeStream(False)

    def push(self, token_ids: Sequence[int]) -> str:
        table = self._table
        if table is not None:
            # One engine chunk, once per token of every stream: the bytes joined and decoded in C
            # (``codecs.utf_8_decode`` is what the incremental decoder's Python method calls).
            try:
                if len(token_ids) == 1:
                    data = table[token_ids[0]]
                else:
                    data = b"".join(map(table.__getitem__, token_ids))
            except IndexError:
                raise FormatError(f"token id out of range in engine output: {max(token_ids)}") from None
            if self._pending:
                data = self._pending + data
            text, used = utf_8_decode(data, "replace", False)
            self._pending = data[used:] if used != len(data) else b""
            return text
        assert self._stream is not None
        full = self._tokenizer.full
        parts = [self._stream.step(full, i) for i in token_ids]
        return "".join(p for p in parts if p)

    def flush(self) -> str:
        if self._table is not None:
            pending, self._pending = self._pending, b""
            return utf_8_decode(pending, "replace", True)[0]
        return ""


def byte_level_table(tokenizer: Tokenizer, data: dict) -> list[bytes] | None:
    """``id -> bytes`` for a pure byte-level BPE (DeepSeek's), else ``None`` (use DecodeStream).

    Byte-level decoding is byte concatenation, so a table plus an incremental
    UTF-8 decoder is exact and costs one list index per token.
    """
    decoder = data.get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        return None
    # Map each printable stand-in character back to its byte, then bytes come from latin-1.
    to_latin1 = {ord(ch): b for ch, b in byte_level_inverse().items()}
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


def byte_level_inverse() -> dict[str, int]:
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
