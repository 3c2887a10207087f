"""Plain text through ``tiktoken`` gives exactly the ids of HF ``tokenizers`` (the reference), or is
not used: every code point in the contexts the pre-token pattern rewrites, long runs, text that is
not valid Unicode, tokenizers of another shape, and the run-time self-check's way back."""

from __future__ import annotations

import json
import random
import threading
from array import array

import pytest

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats.segments import PromptSegment
from deepseek_frontend.tokenization import PromptTokenizer, bundled_tokenizer_path, load_v41_stand_in
from deepseek_frontend.tokenization.text_encoding import LONG_RUN_CHARS, TextEncoder, encode_texts
from deepseek_frontend.tokenization.tiktoken_encoder import TiktokenText, tiktoken_text_for


@pytest.fixture(scope="module")
def tok() -> PromptTokenizer:
    return PromptTokenizer.load(None)


def _reference(tok: PromptTokenizer, texts: list[str]) -> list[list[int]]:
    return encode_texts(tok.text, texts)


def test_the_bundled_tokenizer_and_the_v41_stand_in_encode_text_with_tiktoken(tok):
    assert tok.text_encoder.kind == "tiktoken"
    assert load_v41_stand_in().text_encoder.kind == "tiktoken"


def test_every_code_point_next_to_what_ends_a_pre_token_gives_the_reference_ids(tok):
    # Each character alone, doubled, after a space and a letter, before digits, CJK, spaces and a
    # line end: where the one-expression pattern differs from three Split steps, ids would differ.
    # Every other text starts and ends with ASCII punctuation, so those are encoded joined in one call.
    code_points = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    texts = []
    for first in range(0, len(code_points), 48):
        text = "".join(
            f"{c}{c} a{c}b  {c}1{c}  中{c}\n{c}  " for c in map(chr, code_points[first : first + 48])
        )
        texts.append(f"<{text}>" if first % 96 else text)
    fast = tok.text_encoder.encode(texts)
    reference = _reference(tok, texts)
    mismatched = [t[:40] for t, a, b in zip(texts, fast, reference, strict=True) if a != b]
    assert not mismatched, mismatched[:3]


def test_texts_encoded_together_give_each_text_its_own_ids(tok):
    texts = [
        "Hello there.",
        "  spaces both ends  ",
        "x",
        "a\n\n",
        "mid 123 digits!",
        "中文 in the middle ok",
        "ends with a space ",
        "\tstarts with a tab",
        "`code` here;",
        "9 starts with a digit",
        "ends 9",
        "é starts non-ASCII",
        "",
        "x  \x00 y",
        "-",
        "a" * 5000 + " b",
    ]
    assert tok.text_encoder.encode(texts) == _reference(tok, texts)
    joinable = [
        t
        for t in texts
        if t and t[0].isascii() and t[-1].isascii() and not t[0].isdigit() and not t[-1].isdigit()
    ]
    fast = tok.text_encoder.fast
    calls: list[str] = []
    encode_array = fast.encode_array

    def counting(text: str) -> array:
        calls.append(text)
        return encode_array(text)

    fast.encode_array = counting  # type: ignore[method-assign]
    try:
        arrays = fast.encode_arrays(joinable)
    finally:
        del fast.encode_array
    assert len(calls) == 1  # one call, cut right
    assert [ids.tolist() for ids in arrays] == _reference(tok, joinable)
    assert all(isinstance(ids, array) and ids.typecode == "i" for ids in arrays)
    assert tok.text_encoder.encode(texts[:1]) == _reference(tok, texts[:1])


def test_texts_with_digits_and_the_join_character_are_cut_right(tok):
    """The join is a digit no ordinary text holds (ARABIC-INDIC DIGIT ZERO): ASCII digits inside the
    texts are theirs, and a text that holds the join character itself is encoded alone."""
    texts = [
        "order 1000 items, then 0 more",
        "a 0 b 00 c 000 d 0000 e",
        "the value \u0660 in Arabic-Indic digits, \u0660\u0661\u0662",
        "x",
        "ends with text (0)",
    ]
    assert tok.text_encoder.encode(texts) == _reference(tok, texts)
    assert [ids.tolist() for ids in tok.text_encoder.encode_arrays(texts)] == _reference(tok, texts)


def test_a_vocabulary_without_the_first_join_joins_with_the_next(tok):
    fast = tok.text_encoder.fast
    ranks = {token: rank for token, rank in fast._ranks.items() if token != "\u0660".encode()}
    other = TiktokenText(fast.encoding, ranks)
    assert other._join == "\u06f0"
    texts = ["first text, with a 0 in it", "second \u0660 holds the usual join", "third"]
    assert [ids.tolist() for ids in other.encode_arrays(texts)] == _reference(tok, texts)


def test_the_cut_takes_only_whole_ids_of_the_join(tok):
    fast = tok.text_encoder.fast
    join = array("i", fast._join_bytes)  # the join's id
    (join_id,) = join
    # the join id's four bytes straddling two ids (the high half of one, the low half of the next)
    low, high = join_id & 0xFFFF, join_id >> 16
    straddling = [low << 16, high]
    ids = array("i", [5, *straddling, 9, join_id, 7])
    assert [part.tolist() for part in fast._cut(ids, 2)] == [[5, *straddling, 9], [7]]
    assert fast._cut(ids, 3) is None  # another count of joins than texts: not cut


@pytest.mark.parametrize(
    "text",
    [
        " " * 200_000 + "x",
        "\x00" * (LONG_RUN_CHARS + 10),
        "a" * 300_000,
        "中" * 100_000,
        ("lorem ipsum dolor " * 20_000) + "1234567" + "\n\n\n",
        "\x00 " * 40_000,
        "！" * 70_000,
    ],
    ids=["spaces", "controls", "one-word", "cjk", "prose", "control-space", "punctuation"],
)
def test_long_runs_give_the_reference_ids_without_a_panic(tok, text):
    assert tok.text_encoder.encode([text]) == _reference(tok, [text])


@pytest.mark.parametrize("filler", [0, 5000], ids=["short", "long"])
def test_a_lone_surrogate_is_a_format_error_that_names_it(tok, filler):
    with pytest.raises(FormatError, match=rf"U\+D800 at character {filler + 3}"):
        tok.text_encoder.encode(["fine", "x" * filler + "abc\ud800"])


def test_short_ascii_text_is_encoded_holding_the_gil_with_the_reference_ids(tok):
    """Short ASCII text (the engine's answers, a follow-up's few new words) goes through the Python
    split and ``tiktoken``'s one-piece merges, and gets exactly the reference's ids: every ASCII
    character in the contexts the pattern rewrites, and random ASCII text of every mix."""
    fast = tok.text_encoder.fast
    assert fast is not None and fast.short_ascii
    texts = [f"{c}{c} a{c}b  {c}1{c}  {c}\n{c}  x{c}" for c in map(chr, range(128))]
    rng = random.Random(11)
    every = [chr(cp) for cp in range(128)]
    texts += ["".join(rng.choice(every) for _ in range(rng.randrange(1, 300))) for _ in range(3000)]
    boundaries = " \t\n\r1aZ.,'!-_"
    texts += ["".join(rng.choice(boundaries) for _ in range(rng.randrange(1, 80))) for _ in range(3000)]
    texts += ["Based on the tool result: def admit(self, key: str) -> bool: return self.tokens[key] > 0."]
    reference = _reference(tok, texts)
    mismatched = [t for t, ids in zip(texts, reference, strict=True) if tok.text_encoder.encode([t]) != [ids]]
    assert not mismatched, mismatched[:3]
    assert [fast.encode_short_ascii(t) for t in texts[:200]] == reference[:200]


def test_short_text_stays_on_tokenizers_until_the_split_is_checked(tok):
    """An encoding whose Python split was not checked (or failed the check) never encodes short text."""
    fast = tok.text_encoder.fast
    unchecked = TiktokenText(fast.encoding, fast._ranks)
    assert not unchecked.short_ascii

    def refuse(text: str) -> list[int]:
        raise AssertionError("the unchecked split was used")

    unchecked.encode_short_ascii = refuse  # type: ignore[method-assign]
    texts = ["hello there", "a b c 123"]
    assert TextEncoder(tok.text, unchecked).encode(texts) == _reference(tok, texts)


def _with(data: dict, **model_changes) -> str:
    changed = json.loads(json.dumps(data))
    changed["model"].update(model_changes)
    return json.dumps(changed)


def test_a_tokenizer_of_another_shape_keeps_tokenizers(tok):
    data = json.loads(bundled_tokenizer_path().read_text(encoding="utf-8"))
    other_split = json.loads(json.dumps(data))
    other_split["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{N}"
    swapped = data["model"]["merges"][:]
    swapped[100], swapped[200] = swapped[200], swapped[100]
    with_normalizer = json.loads(json.dumps(data))
    with_normalizer["normalizer"] = {"type": "NFKC"}
    for text, why in [
        (json.dumps(other_split), "pre-tokenizer is not DeepSeek's"),
        (_with(data, merges=swapped), "ids do not follow its merges"),
        (json.dumps(with_normalizer), "normalizer"),
    ]:
        loaded = PromptTokenizer(text)
        assert loaded.text_encoder.kind == "tokenizers"
        encoding, reason = tiktoken_text_for(text, json.loads(text), loaded.text)
        assert encoding is None and why in reason
        # and that tokenizer's own ids are what its prompts get
        sample = "12345 中文 abc"
        assert loaded.encode_text(sample) == loaded.text.encode(sample, add_special_tokens=False).ids


def test_a_self_check_that_disagrees_goes_back_to_tokenizers():
    fresh = PromptTokenizer.load(None)
    segments = [PromptSegment("hello world", special=False)]
    fresh.self_check(segments, [1, 2, 3])  # not what the whole-prompt encode gives
    assert fresh.text_encoder.kind == "tokenizers"
    assert fresh.encode_text("hello world") == fresh.text.encode("hello world", add_special_tokens=False).ids
    assert PromptTokenizer.load(None).text_encoder.kind == "tiktoken"  # the shared encoding is untouched


def test_a_panic_in_tiktoken_falls_back_to_the_reference(tok):
    class PanicException(BaseException):  # pyo3's panic type, by name
        pass

    class Panicking:
        def encode_arrays(self, texts: list[str]) -> list[array]:
            raise PanicException("StackOverflow")

    encoder = TextEncoder(tok.text, Panicking())  # type: ignore[arg-type]
    texts = ["some text " * 100, "more " * 100]  # over SHORT_TEXT_CHARS: not the short path
    assert encoder.encode(texts) == _reference(tok, texts)

    class Interrupting:
        def encode_arrays(self, texts: list[str]) -> list[array]:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        TextEncoder(tok.text, Interrupting()).encode(["x" * 2000])  # type: ignore[arg-type]


def test_a_thread_that_encodes_in_bulk_gets_an_encoding_of_its_own(tok):
    fast = tok.text_encoder.fast
    texts = ["word " * 2000, "other words " * 1000]
    expected = _reference(tok, texts)
    seen: dict[str, object] = {}

    def encode(bulk: bool) -> None:
        assert tok.text_encoder.encode(texts, bulk=bulk) == expected
        seen[f"bulk={bulk}"] = getattr(fast._thread, "encoding", None)

    for bulk in (False, True):
        worker = threading.Thread(target=encode, args=(bulk,))
        worker.start()
        worker.join()
    assert seen["bulk=False"] is None  # shares the encoding
    assert seen["bulk=True"] not in (None, fast.encoding)
    assert fast._thread.encoding is fast.encoding  # this thread built it: it uses the shared one
