"""DeepSeek's text tokenizer run by ``tiktoken``: the ids of HF ``tokenizers``, at a fifth of the CPU.

Cold tokenization is the largest part of a unique prompt's cost in the frontend (half of it at
1,024 streams of 1K-token prompts). DeepSeek's ``tokenizer.json`` is a byte-level BPE behind three
regular-expression pre-tokenizers and no normalizer; ``tiktoken`` runs exactly that kind of
tokenizer -- one regular expression, then merges by rank -- in 0.23 ms CPU per 1,000-word prompt
against 1.1 ms for ``tokenizers``' ``encode_batch_fast``, with the GIL released.

Why the ids are the same:

* **Pre-tokens.** The three ``Split`` steps (``Isolated``) cut the text in turn: runs of up to three
  digits, then runs of CJK ideographs and kana, then the word pattern within each remaining piece,
  keeping unmatched gaps as pieces of their own. :data:`PRE_TOKEN_PATTERN` is one expression with
  the same pieces: the digit and CJK alternatives first (so they win where they start), the word
  pattern with digits and the CJK ranges taken out of its classes (so no match runs into a later
  digit or CJK piece), its ``\\s+(?!\\S)`` looking for the end of the *piece* (a digit, a CJK
  character or the end of the text), and a last alternative for a gap: a run of characters where
  no other alternative matches.
* **Merges.** ``tiktoken`` merges the adjacent pair whose concatenation has the lowest rank, and
  takes a whole pre-token that is in the vocabulary as one id; HF merges the pair with the earliest
  merge rule. The two agree when every multi-byte token is made by exactly one merge, a token's id
  grows with its merge's position, and BPE reaches every token from its bytes;
  :func:`tiktoken_text_for` checks all three on the vocabulary and uses the ids as ranks.
* **Checked, not assumed.** Before a tokenizer is used this way its ids are compared with HF's on
  :func:`check_texts` (characters of every kind next to spaces, digits, CJK and line ends, and random
  text from every plane); at run time the prompt caches' sampled self-check compares prompt ids
  with a whole-prompt HF encode and goes back to HF on any difference
  (:meth:`~.tokenizer.PromptTokenizer.self_check`).

A ``tokenizer.json`` of another shape (a normalizer, another pre-tokenizer, a non-byte-level
vocabulary) keeps HF ``tokenizers``: :func:`tiktoken_text_for` says why.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import unicodedata
from array import array
from typing import Any

import regex
import tiktoken
from tokenizers import Tokenizer

from deepseek_frontend.tokenization.detokenization import byte_level_inverse

logger = logging.getLogger(__name__)

#: DeepSeek's pre-tokenizer as its ``tokenizer.json`` spells it (V3, V3.1, V3.2, V4 and V4.1 share it)
DEEPSEEK_PRE_TOKENIZER: dict[str, Any] = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[一-龥぀-ゟ゠-ヿ]+"}, "behavior": "Isolated", "invert": False},
        {
            "type": "Split",
            "pattern": {
                "Regex": "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
            },
            "behavior": "Isolated",
            "invert": False,
        },
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
    ],
}

_CJK = "一-龥぀-ゟ゠-ヿ"
_PIECES = "|".join(
    (
        r"\p{N}{1,3}",
        f"[{_CJK}]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+""",
        rf"[^\r\n\p{{L}}\p{{P}}\p{{S}}\p{{N}}{_CJK}]?[\p{{L}}\p{{M}}--[{_CJK}]]+",
        rf" ?[\p{{P}}\p{{S}}--[{_CJK}]]+[\r\n]*",
        r"\s*[\r\n]+",
        rf"\s+(?![^\s\p{{N}}{_CJK}])",
        r"\s+",
    )
)
#: :data:`DEEPSEEK_PRE_TOKENIZER`'s pieces from one expression (``tiktoken``'s ``pat_str``)
PRE_TOKEN_PATTERN = _PIECES + rf"|(?:(?!{_PIECES})[\s\S])+"

_built: dict[str, tuple[TiktokenText | None, str]] = {}
_built_lock = threading.Lock()


def tiktoken_text_for(
    tokenizer_json: str, data: dict[str, Any], reference: Tokenizer
) -> tuple[TiktokenText | None, str]:
    """A ``tiktoken`` encoder giving ``reference``'s ids for plain text, or ``None`` and why not.

    ``data`` is ``tokenizer_json`` parsed; ``reference`` is built from it and recognises no added
    token in text (the prompt tokenizer's text tokenizer). Built and checked once per process for
    each ``tokenizer.json`` (about 0.7 s), then shared: an encoding is immutable.
    """
    key = hashlib.sha256(tokenizer_json.encode()).hexdigest()
    with _built_lock:
        if key not in _built:
            _built[key] = _build(data, reference)
        return _built[key]


#: what may join texts encoded in one call (:meth:`TiktokenText.encode_arrays`), the first that is
#: one id of the vocabulary: ARABIC-INDIC DIGIT ZERO, two other rare zeros, then the ASCII one. Each
#: is a digit (``\p{N}``), which the pattern treats as the end of a piece -- every lookahead, word
#: class and gap stops at it -- and isolates as its own pre-token; so between texts that neither
#: start nor end with a digit, and do not contain it, it is one id of its own, the only place that
#: id occurs, and the texts' ids are exactly their ids alone
_JOINS = ("\u0660", "\u06f0", "\u0966", "0")
#: at most this many characters encoded in one joined call (its ids come back as one buffer, cut with
#: a few slices: the GIL is held for a memory copy of them, not per id)
_JOINED_CHARS = 262_144
#: a special token no text is allowed to match: ``tiktoken``'s array-returning encode scans text for
#: special tokens, and with none declared its scan pattern is empty and matches at every position
#: (one regex call per character); with this one declared the scan is one literal search
_NEVER_SPECIAL = "<|deepseek-frontend: never a special token|>"
_NO_SPECIAL_ALLOWED: frozenset[str] = frozenset()


def _encoding(name: str, ranks: dict[bytes, int]) -> tiktoken.Encoding:
    """A ``tiktoken`` encoding of DeepSeek's text: :data:`PRE_TOKEN_PATTERN`, merges by ``ranks``, and
    :data:`_NEVER_SPECIAL` as its one special token (never allowed: text is always ordinary text)."""
    return tiktoken.Encoding(
        name,
        pat_str=PRE_TOKEN_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={_NEVER_SPECIAL: max(ranks.values()) + 1},
    )


class TiktokenText:
    """Plain text -> ids by a checked ``tiktoken`` encoding (see :func:`tiktoken_text_for`).

    Thread-safe; ``tiktoken`` releases the GIL while it encodes. The compiled pattern's match
    caches belong to the first thread that used them (the one that built the encoding and ran the
    checks), and every other thread takes them from a locked pool: 0.29 ms per 1,000-word prompt
    there against 0.19 on a thread's own. An encoding costs about 20 MB and 70 ms to build, so
    only a thread that encodes in bulk (the batch thread of cold prompts) claims one
    (:meth:`claim_thread`); the others share.

    Short ASCII text has a way of its own that keeps the GIL (:meth:`encode_short_ascii`), used
    once :func:`tiktoken_text_for` has checked it (:attr:`short_ascii`).
    """

    def __init__(self, encoding: tiktoken.Encoding, ranks: dict[bytes, int]):
        self.encoding = encoding
        self._ranks = ranks
        #: the pattern's pieces found by the ``regex`` module (version 1 syntax: the pattern's
        #: classes subtract sets), for :meth:`encode_short_ascii`
        self._pieces = regex.compile(PRE_TOKEN_PATTERN, regex.V1).findall
        # ``tiktoken``'s BPE of one piece, which keeps the GIL (``encode_ordinary`` releases it)
        self._merge_piece = getattr(getattr(encoding, "_core_bpe", None), "encode_single_piece", None)
        #: :meth:`encode_short_ascii` gave the reference's ids on every ASCII check text
        #: (:func:`tiktoken_text_for` sets it)
        self.short_ascii = False
        #: the character that joins texts encoded together, and its id as an ``array("i")``'s bytes
        self._join = next((join for join in _JOINS if join.encode() in ranks), "")
        self._join_bytes = array("i", [ranks[self._join.encode()]]).tobytes() if self._join else b""
        self._thread = threading.local()
        # the thread that builds an encoding checks it at once (_build): its caches are that thread's
        self._thread.encoding = encoding

    def encode(self, text: str) -> list[int]:
        """The ids of one text (valid Unicode, at most ``LONG_RUN_CHARS`` characters)."""
        return getattr(self._thread, "encoding", self.encoding).encode_ordinary(text)

    def encode_short_ascii(self, text: str) -> list[int]:
        """The ids of an ASCII ``text``, with the GIL held throughout (for short text on the event
        loop or the simulated engine's planning thread).

        ``encode`` releases the GIL, and a thread that takes it back while another runs Python may
        wait up to the interpreter's switch interval (5 ms), where ``tokenizers``' ``encode``, which
        keeps it, costs 46 us for a 139-character answer. Here the pattern's pieces come from the
        ``regex`` module, a piece the vocabulary holds whole is its id, and any other is merged by
        ``tiktoken``'s ``encode_single_piece``: 17 us (``benchmarks/bench_render.py --short-text``).
        ``regex``'s Unicode tables are not the Rust engine's (they disagreed on 12 of 9,140 check
        texts, none of them ASCII), so only ASCII text is taken, and only once :attr:`short_ascii`
        is set.
        """
        merge_piece = self._merge_piece
        assert merge_piece is not None, "encode_short_ascii needs tiktoken's encode_single_piece"
        whole = self._ranks.get
        ids: list[int] = []
        for piece in self._pieces(text):
            data = piece.encode("ascii")
            token = whole(data)
            if token is None:
                ids.extend(merge_piece(data))
            else:
                ids.append(token)
        return ids

    def claim_thread(self) -> None:
        """Give the calling thread an encoding of its own, once (for a thread that encodes in bulk)."""
        if getattr(self._thread, "encoding", None) is None:
            self._thread.encoding = _encoding(self.encoding.name, self._ranks)

    def encode_array(self, text: str) -> array:
        """The ids of one text (valid Unicode, at most ``LONG_RUN_CHARS`` characters) as an
        ``array("i")``: ``tiktoken`` hands them over as one buffer, copied whole, where
        :meth:`encode`'s list makes a Python int of every id with the GIL held."""
        encoding = getattr(self._thread, "encoding", self.encoding)
        to_buffer = getattr(encoding._core_bpe, "encode_to_tiktoken_buffer", None)
        if to_buffer is None or _NEVER_SPECIAL not in encoding.special_tokens_set:
            return array("i", encoding.encode_ordinary(text))
        ids = array("i")
        ids.frombytes(memoryview(to_buffer(text, _NO_SPECIAL_ALLOWED)).cast("B"))
        return ids

    def encode_arrays(self, texts: list[str]) -> list[array]:
        """The ids of each text (each valid Unicode, at most ``LONG_RUN_CHARS`` characters), each an
        ``array("i")``, in as few ``tiktoken`` calls as can be.

        One call per text would take the GIL back after every text, and a thread that wants the
        GIL from a busy event loop waits up to the interpreter's switch interval (5 ms) for it: at
        1,024 arrivals one process tokenized 200 prompts a second that way. So texts that start and
        end with a character that is not a digit (:func:`_joinable`) and do not contain the join
        (the first of :data:`_JOINS` the vocabulary has whole) are joined by it, up to
        :data:`_JOINED_CHARS` at a time, encoded in one call, and cut at the join's ids
        (:meth:`_cut`); the others are encoded alone. What the GIL is held for after the call is a
        copy of the ids' memory and one slice per text, not work per id.
        """
        out: list[array | None] = [None] * len(texts)
        group: list[int] = []
        size = 0
        join = self._join
        for index, text in enumerate(texts):
            if not join or not _joinable(text) or join in text:
                continue
            group.append(index)
            size += len(text)
            if size >= _JOINED_CHARS:
                self._encode_joined(texts, group, out)
                group, size = [], 0
        self._encode_joined(texts, group, out)
        return [self.encode_array(text) if ids is None else ids for text, ids in zip(texts, out, strict=True)]

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode_arrays` as lists."""
        return [ids.tolist() for ids in self.encode_arrays(texts)]

    def _encode_joined(self, texts: list[str], group: list[int], out: list[array | None]) -> None:
        if len(group) < 2:
            return
        parts = self._cut(self.encode_array(self._join.join(texts[i] for i in group)), len(group))
        if parts is None:
            logger.warning("tiktoken: texts encoded together gave another count of joins; encoded one by one")
            return
        for index, ids in zip(group, parts, strict=True):
            out[index] = ids

    def _cut(self, ids: array, count: int) -> list[array] | None:
        """``ids`` of ``count`` texts joined by the join cut at its ids (found by a byte
        search; a match that straddles two ids is not one), or None unless there are ``count - 1``."""
        data, join = ids.tobytes(), self._join_bytes
        width = len(join)
        parts: list[array] = []
        start = at = 0
        while (found := data.find(join, at)) >= 0:
            if found % width:
                at = found + 1
                continue
            parts.append(ids[start : found // width])
            start, at = found // width + 1, found + width
        parts.append(ids[start:])
        return parts if len(parts) == count else None


def _joinable(text: str) -> bool:
    """Non-empty, and its first and last characters are not digits (``\\p{N}``) -- nor unassigned in
    this Python's Unicode data, which may be older than the pattern engine's."""
    if not text:
        return False
    return _not_a_digit(text[0]) and _not_a_digit(text[-1])


def _not_a_digit(char: str) -> bool:
    if char < "\x80":
        return not char.isdigit()
    category = unicodedata.category(char)
    return category[0] != "N" and category != "Cn"


def _build(data: dict[str, Any], reference: Tokenizer) -> tuple[TiktokenText | None, str]:
    normalizer = data.get("normalizer")
    if normalizer not in (None, {"type": "Sequence", "normalizers": []}):
        return None, "the tokenizer has a normalizer"
    if data.get("pre_tokenizer") != DEEPSEEK_PRE_TOKENIZER:
        return None, "the pre-tokenizer is not DeepSeek's"
    model = data.get("model") or {}
    options = ("dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback")
    if model.get("type") != "BPE" or any(model.get(option) for option in options):
        return None, "the model is not a plain BPE"
    ranks = _ranks(model)
    if ranks is None:
        return None, "the vocabulary's ids do not follow its merges"
    if not _every_token_reachable(reference, model["vocab"], ranks):
        return None, "some tokens cannot be reached by merging their bytes"
    fast = TiktokenText(_encoding("deepseek-text", ranks), ranks)
    texts = check_texts()
    expected = [e.ids for e in reference.encode_batch_fast(texts, add_special_tokens=False)]
    for text, ids in zip(texts, expected, strict=True):
        if fast.encode(text) != ids:
            return None, f"ids differ from tokenizers' for {text[:40]!r}"
    if fast.encode_many(texts) != expected:
        return None, "ids of texts encoded together differ from tokenizers'"
    if fast._merge_piece is None:
        return fast, "ids checked against tokenizers (short text by tokenizers: no encode_single_piece)"
    checked = zip(texts, expected, strict=True)
    fast.short_ascii = all(fast.encode_short_ascii(text) == ids for text, ids in checked if text.isascii())
    if not fast.short_ascii:
        return fast, "ids checked against tokenizers (short text by tokenizers: its split differs)"
    return fast, "ids checked against tokenizers"


def _ranks(model: dict[str, Any]) -> dict[bytes, int] | None:
    """Token bytes -> id, when ids can serve as merge ranks (see the module docstring), else ``None``.

    Vocabulary entries outside the byte-level alphabet (the three added tokens the vocabulary also
    lists) cannot come out of byte-level BPE and are left out.
    """
    to_byte = {ord(ch): b for ch, b in byte_level_inverse().items()}
    vocab: dict[str, int] = model.get("vocab") or {}
    ranks: dict[bytes, int] = {}
    for token, token_id in vocab.items():
        try:
            ranks[token.translate(to_byte).encode("latin-1")] = token_id
        except UnicodeEncodeError:
            continue
    if len(ranks) != len(set(ranks.values())) or sum(len(token) == 1 for token in ranks) != 256:
        return None
    made: set[bytes] = set()
    previous_id = -1
    for merge in model.get("merges") or []:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        token = (left + right).translate(to_byte).encode("latin-1")
        token_id = ranks.get(token)
        if token_id is None or token in made or token_id <= previous_id:
            return None
        made.add(token)
        previous_id = token_id
    if any(len(token) > 1 and token not in made for token in ranks):
        return None
    return ranks


def _every_token_reachable(reference: Tokenizer, vocab: dict[str, int], ranks: dict[bytes, int]) -> bool:
    """Whether HF's BPE turns each token's own bytes into that one token (``tiktoken`` takes a whole
    pre-token found in the vocabulary as one id without merging)."""
    wanted = set(ranks.values())
    model = reference.model
    return all(
        [t.id for t in model.tokenize(token)] == [token_id]
        for token, token_id in vocab.items()
        if token_id in wanted
    )


def check_texts(seed: int = 0x7E57, random_texts: int = 1_500) -> list[str]:
    """Texts whose ids must agree before ``tiktoken`` stands in for ``tokenizers`` (pure, seeded).

    Each boundary the pre-token pattern rewrites, next to every kind of character: prose, code,
    numbers, CJK and kana (with the kana block's punctuation, marks and unassigned code points),
    combining marks, controls, format characters, whitespace runs before digits, CJK, letters,
    punctuation and the end of the text, line ends; then random text drawn from every plane.
    """
    # fmt: off
    kinds = [
        "word", "Word", "WORD", "é", "ü", "ß", "ñ", "a\u0301", "\u0301", "\u0301x", "中", "文字", "ひらがな",
        "カタカナ", "゠", "・", "゛", "ー", "\u3040", "\u3099", "〇", "한국어", "Ελλάδα", "русский",
        "עברית", "العربية", "हिन्दी", "ไทย", "1", "12", "1234567", "٣", "²", "Ⅷ", "½", "!", "?!", "...",
        "->", "'s", "'S", "\"", "(", ")", "[]", "{}", "#", "$5", "@x", "`code`", "_x", "-x", "€", "©",
        "😀", "👍🏽", "\U0001F9D1\u200D\U0001F4BB", "\x00", "\x07", "\x1b", "\x7f", "\x85", "\u200b",
        "\u200d", "\ufeff", "\ue000", "\U000F0000", "\U0010FFFF", "\ufffd", "\u00a0", "\u2028",
        "\u3000", "\t", " ", "  ", "   ", "\n", "\r\n", "\n\n", " \n", "\t\n", "\r", "",
    ]
    planes = [
        (0x20, 0x7F), (0x80, 0x2FFF), (0x3000, 0x9FFF), (0xA000, 0xD7FF), (0xE000, 0xFFFF),
        (0x10000, 0x10FFFF),
    ]
    # fmt: on
    texts = [
        "The quick brown fox jumps over the lazy dog. It's 2026; ~1,024 streams!",
        "def f(x):\n    return x + 1  # add one\n\n\nclass A:\n\tpass\r\n",
        '{"key": [1, 2.5, -3e10], "s": "a\\nb"}  </think> <｜end▁of▁sentence｜>',
        "中文和English混合，数字123和ｶﾀｶﾅ。日本語のテキスト、漢字かなカナ！",
    ]
    for first in kinds:
        for second in kinds:
            texts.append(first + second)
        for context in ("a{}b", " {} ", "{}  1", "1  {}", "x  {}中", "{}\n\n", "  {}", "{}   ", "\t{}\u3000"):
            texts.append(context.format(first))
    rng = random.Random(seed)
    for _ in range(random_texts):
        chars = []
        for _ in range(rng.randint(1, 40)):
            low, high = planes[rng.randrange(len(planes))] if rng.random() < 0.6 else (0x20, 0x7F)
            chars.append(" " if rng.random() < 0.15 else chr(rng.randint(low, high)))
        texts.append("".join(chars))
    return texts
