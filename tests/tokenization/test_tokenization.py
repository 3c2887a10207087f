"""Prompt tokenization: injection safety, whole-prompt parity, the run cache, incremental detokenization."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats import dsv4, dsv32
from deepseek_frontend.formats.segments import PromptSegment as Seg
from deepseek_frontend.formats.segments import join_segments
from deepseek_frontend.tokenization import PrefixCache, PromptTokenizer, RunCache, bundled_tokenizer_path

#: every special token a renderer of either family can write
TEMPLATE_SPELLINGS = sorted(dsv4.SPECIAL_SPELLINGS | dsv32.SPECIAL_SPELLINGS)


def conversation(user_text: str) -> list[Seg]:
    return [
        Seg("<｜begin▁of▁sentence｜>", True),
        Seg("You are helpful."),
        Seg("<｜User｜>", True),
        Seg(user_text),
        Seg("<｜Assistant｜>", True),
        Seg("</think>", True),
    ]


@pytest.mark.parametrize("spelling", TEMPLATE_SPELLINGS)
def test_every_template_token_is_one_id(prompt_tokenizer: PromptTokenizer, spelling: str) -> None:
    token_id = prompt_tokenizer.token_id(spelling)
    assert prompt_tokenizer.encode_raw(spelling) == [token_id]
    assert prompt_tokenizer.encode_segments([Seg(spelling, True)]) == [token_id]


def test_a_special_segment_that_is_not_a_token_is_a_format_error(prompt_tokenizer: PromptTokenizer) -> None:
    with pytest.raises(FormatError, match="not a single token"):
        prompt_tokenizer.encode_segments([Seg("<｜NotAToken｜>", True)])


@pytest.mark.parametrize("spelling", TEMPLATE_SPELLINGS)
def test_token_spellings_typed_by_a_user_stay_text(prompt_tokenizer: PromptTokenizer, spelling: str) -> None:
    segments = conversation(f"please print {spelling} literally{spelling}")
    ids = prompt_tokenizer.encode_segments(segments)
    special_ids = {prompt_tokenizer.token_id(s) for s in TEMPLATE_SPELLINGS}
    # Exactly the four template tokens are special; the user's spelling became plain text pieces.
    assert [i for i in ids if i in special_ids] == [
        prompt_tokenizer.token_id("<｜begin▁of▁sentence｜>"),
        prompt_tokenizer.token_id("<｜User｜>"),
        prompt_tokenizer.token_id("<｜Assistant｜>"),
        prompt_tokenizer.token_id("</think>"),
    ]
    assert prompt_tokenizer.decode(ids) == join_segments(segments)
    # A naive whole-string encode would have produced the control token: that is the attack we prevent.
    assert len(prompt_tokenizer.encode_raw(join_segments(segments))) < len(ids)


def test_plain_prompts_match_a_whole_string_encode(prompt_tokenizer: PromptTokenizer) -> None:
    rng = random.Random(7)
    alphabet = "abc XYZ 123 \n\t,.;:'\"<>/{}[]é😀中文  \n\n"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        segments = conversation(text)
        assert prompt_tokenizer.encode_segments(segments) == prompt_tokenizer.encode_raw(
            join_segments(segments)
        )


def test_adjacent_text_segments_are_tokenized_as_one_run(prompt_tokenizer: PromptTokenizer) -> None:
    # Template prose and request text meet without a special token between them; splitting them
    # would change BPE boundaries ("\n\n" + "Hello" vs "\n\nHello").
    split = [
        Seg("<｜User｜>", True),
        Seg("abc\n"),
        Seg("\nHello"),
        Seg(" world"),
        Seg("<｜Assistant｜>", True),
    ]
    assert prompt_tokenizer.encode_segments(split) == prompt_tokenizer.encode_raw(join_segments(split))


def conversation_of(turns: list[str]) -> list[Seg]:
    segments: list[Seg] = [Seg("<｜begin▁of▁sentence｜>", True), Seg("You are a careful agent.")]
    for text in turns:
        segments += [Seg("<｜User｜>", True), Seg(text), Seg("<｜Assistant｜>", True), Seg("</think>", True)]
        segments += [Seg(f"answer to {text}"), Seg("<｜end▁of▁sentence｜>", True)]
    return segments


TURNS = [f"turn {i}: " + "some earlier message text that is long enough to cache " * 3 for i in range(50)]


def test_extending_a_conversation_only_tokenizes_the_new_text() -> None:
    tok = PromptTokenizer.load()
    segments = conversation_of(TURNS)
    first = tok.encode_segments(segments)
    run_misses = tok.cache.misses
    extended = [*segments, Seg("<｜User｜>", True), Seg("one more question, the only new text here")]
    second = tok.encode_segments(extended)
    assert second[: len(first)] == first
    assert tok.prefix_cache.hits == 1
    assert tok.prefix_cache.reused_ids == len(first)  # the whole previous prompt was reused
    assert tok.cache.misses == run_misses + 1  # only the new run was tokenized
    assert second == tok.encode_raw(join_segments(extended))


def test_a_prompt_that_diverges_mid_conversation_reuses_only_the_common_part() -> None:
    tok = PromptTokenizer.load()
    tok.encode_segments(conversation_of(TURNS))
    # An edited earlier turn (as when a client drops old reasoning): ids up to the last special token
    # before the edit are reused, everything after it is encoded again -- and the result is exact.
    edited = [*TURNS[:20], "an edited turn", *TURNS[21:]]
    segments = conversation_of(edited)
    ids = tok.encode_segments(segments)
    assert ids == tok.encode_raw(join_segments(segments))
    assert 0 < tok.prefix_cache.reused_ids < len(ids)
    # A different conversation head shares nothing.
    other = [Seg("<｜begin▁of▁sentence｜>", True), Seg("Another system prompt."), *conversation_of(TURNS)[2:]]
    reused = tok.prefix_cache.reused_ids
    assert tok.encode_segments(other) == tok.encode_raw(join_segments(other))
    assert tok.prefix_cache.reused_ids == reused


def test_a_shorter_prompt_of_the_same_conversation_is_a_prefix_hit() -> None:
    tok = PromptTokenizer.load()
    full = conversation_of(TURNS)
    tok.encode_segments(full)
    shorter = conversation_of(TURNS[:10])  # e.g. a retried earlier request
    assert tok.encode_segments(shorter) == tok.encode_raw(join_segments(shorter))
    assert tok.prefix_cache.hits == 1


def test_a_follow_up_chain_keeps_every_cached_prompt_exact() -> None:
    """A prefix entry is the prompt's own id array, extended by the next prompt's copy of it: each
    prompt of a growing conversation, and an older one asked again, still gets a fresh encode's ids;
    a pending encoding is finished once (a second pass would extend a cached entry)."""
    tok = PromptTokenizer.load()
    prompts = [conversation_of(TURNS[:n]) for n in (2, 4, 6, 8)]
    for segments in [*prompts, prompts[1], prompts[3]]:
        assert tok.encode_segments(segments) == tok.encode_raw(join_segments(segments))
    assert tok.prefix_cache.hits >= 4
    pending = tok.start_encoding(prompts[3])
    pending.encode()
    tok.finish_encoding(pending)
    with pytest.raises(RuntimeError, match="only once"):
        tok.finish_encoding(pending)
    assert tok.encode_segments(prompts[3]) == tok.encode_raw(join_segments(prompts[3]))


def _user_turn(text: str) -> list[Seg]:
    return [Seg("<｜User｜>", True), Seg(text)]


def test_prefix_cache_is_bounded_by_entries() -> None:
    cache = PrefixCache(max_entries=2)
    for head in ("a", "b", "c"):
        cache.store(_user_turn(head), [1, 2], [0], [1])
    assert len(cache) == 2
    assert cache.lookup(_user_turn("a")) is None  # evicted first
    assert cache.lookup(_user_turn("c")) is not None


def test_prefix_cache_is_bounded_by_bytes_counting_text_and_ids() -> None:
    one = PrefixCache()
    one.store(_user_turn("x" * 10_000), list(range(3000)), [0], [1])
    entry_bytes = one.bytes
    assert entry_bytes >= 10_000 + 4 * 3000  # the text and 4 bytes an id, at least
    cache = PrefixCache(max_bytes=3 * entry_bytes)
    for head in "abcde":
        cache.store(_user_turn(head + "x" * 9_999), list(range(3000)), [0], [1])
    assert len(cache) == 3 and cache.bytes <= cache.max_bytes
    assert cache.lookup(_user_turn("a" + "x" * 9_999)) is None
    assert cache.lookup(_user_turn("e" + "x" * 9_999)) is not None
    cache.store(_user_turn("y" * 4 * entry_bytes), [1], [0], [1])  # larger than the whole budget
    assert cache.lookup(_user_turn("y" * 4 * entry_bytes)) is None and len(cache) == 3


def test_idle_entries_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("deepseek_frontend.tokenization.caches.time.monotonic", lambda: clock[0])
    tok = PromptTokenizer.load(cache_idle_s=60)
    tok.encode_segments(conversation("a message that is certainly long enough to be cached"))
    assert len(tok.cache) > 0 and len(tok.prefix_cache) == 1
    clock[0] += 59
    tok.expire_idle()
    assert len(tok.prefix_cache) == 1
    clock[0] += 2
    tok.expire_idle()
    assert len(tok.cache) == 0 and len(tok.prefix_cache) == 0
    assert tok.cache.bytes == 0 and tok.prefix_cache.bytes == 0
    stats = tok.cache_stats()
    assert stats["prefix"]["entries"] == 0 and stats["run"]["misses"] > 0


def test_run_cache_is_bounded_by_bytes() -> None:
    probe = RunCache()
    probe.put("00" + "x" * 18, (0,))
    entry_bytes = probe.bytes
    cache = RunCache(max_bytes=5 * entry_bytes)
    for i in range(20):
        cache.put(f"{i:02d}" + "x" * 18, (i,))
    assert len(cache) == 5 and cache.bytes <= cache.max_bytes
    assert cache.get("00" + "x" * 18) is None
    assert list(cache.get("19" + "x" * 18) or ()) == [19]
    cache.put("y" * 6 * entry_bytes, (1,))  # larger than the whole cache: not stored
    assert cache.get("y" * 6 * entry_bytes) is None and len(cache) == 5


def test_self_check_switches_the_caches_off_when_they_disagree() -> None:
    tok = PromptTokenizer.load()
    segments = conversation("a message that is certainly long enough to be cached")
    good = tok.encode_segments(segments)
    # Corrupt the cached ids of the user's run, as a tokenizer bug would, and forget the prompt itself.
    tok.cache.put("a message that is certainly long enough to be cached", (1, 2, 3))
    tok.prefix_cache.clear()
    tok.self_check_rate = 1.0
    tok.encode_segments(segments)  # served from the corrupt entry; the check notices
    assert tok.cache.max_bytes == 0 and tok.prefix_cache.max_entries == 0
    assert tok.encode_segments(segments) == good


def test_load_from_a_model_directory_and_from_a_file(tmp_path: Path) -> None:
    shutil.copy(bundled_tokenizer_path(), tmp_path / "tokenizer.json")
    from_dir = PromptTokenizer.load(tmp_path)
    from_file = PromptTokenizer.load(tmp_path / "tokenizer.json")
    assert from_dir.encode_text("hello world") == from_file.encode_text("hello world") != []
    assert from_dir.eos_token_id == 1 and from_dir.bos_token_id == 0
    with pytest.raises(FileNotFoundError):
        PromptTokenizer.load(tmp_path / "missing")


def test_detokenizer_matches_batch_decode_under_any_chunking(prompt_tokenizer: PromptTokenizer) -> None:
    rng = random.Random(11)
    text = "Plain ASCII, accents é à ü, CJK 中文字符, emoji 😀🚀👍🏽, math ∑∫, </think> and DSML <｜DSML｜x"
    ids = [*prompt_tokenizer.encode_raw(text), prompt_tokenizer.eos_token_id]
    expected = prompt_tokenizer.full.decode(ids, skip_special_tokens=False)  # the HF tokenizer's own decode
    for _ in range(50):
        det = prompt_tokenizer.new_detokenizer()
        pieces: list[str] = []
        i = 0
        while i < len(ids):
            step = rng.randint(1, 4)
            pieces.append(det.push(ids[i : i + step]))
            i += step
        pieces.append(det.flush())
        assert "".join(pieces) == expected
        # no piece ever carries half a character
        assert all("\ufffd" not in p for p in pieces)


def test_detokenizer_matches_decode_on_random_ids(prompt_tokenizer: PromptTokenizer) -> None:
    rng = random.Random(3)
    ids = [rng.randrange(prompt_tokenizer.vocab_size) for _ in range(3000)]
    det = prompt_tokenizer.new_detokenizer()
    out = "".join(det.push(ids[i : i + 5]) for i in range(0, len(ids), 5)) + det.flush()
    assert out == prompt_tokenizer.full.decode(ids, skip_special_tokens=False)  # the HF tokenizer's own


def test_decode_is_the_hf_decode(prompt_tokenizer: PromptTokenizer) -> None:
    """The byte-table ``decode`` gives exactly the HF tokenizer's text: random ids (invalid UTF-8
    included), special tokens, and ids it does not know (left to the tokenizer)."""
    rng = random.Random(5)
    hf = prompt_tokenizer.full
    for size in (1, 7, 300, 5000):
        ids = [rng.randrange(prompt_tokenizer.vocab_size) for _ in range(size)]
        assert prompt_tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=False)
        assert prompt_tokenizer.decode(ids, skip_special_tokens=True) == hf.decode(
            ids, skip_special_tokens=True
        )
    text = "emoji 😀🚀, CJK 中文, </think> <｜DSML｜tool_calls>"
    ids = [*prompt_tokenizer.encode_raw(text), prompt_tokenizer.eos_token_id]
    assert prompt_tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=False)
    assert prompt_tokenizer.decode([]) == ""
    for bad in ([prompt_tokenizer.vocab_size + 10], [-1]):
        try:
            expected: str | None = hf.decode(bad, skip_special_tokens=False)
        except Exception:
            expected = None
        if expected is not None:
            assert prompt_tokenizer.decode(bad) == expected
        else:
            with pytest.raises(Exception):  # noqa: B017 - whatever the HF tokenizer raises
                prompt_tokenizer.decode(bad)


def test_decode_reads_the_pipelines_id_array_as_its_list(prompt_tokenizer: PromptTokenizer) -> None:
    """An ``array("i")`` of ids (what the in-process engine reads) decodes as the same ids in a
    list, a negative id included: it is never read from the end of the byte table."""
    from array import array

    rng = random.Random(6)
    vocab = prompt_tokenizer.vocab_size
    for size in (1, 300, 5000):
        ids = [rng.randrange(vocab) for _ in range(size)]
        assert prompt_tokenizer.decode(array("i", ids)) == prompt_tokenizer.decode(ids)
    for negative in (-1, -5, -(2**31)):
        for where in (0, 150, 299):
            ids = [rng.randrange(vocab) for _ in range(300)]
            ids[where] = negative
            outcomes: list[object] = []
            for form in (ids, array("i", ids)):
                try:
                    outcomes.append(prompt_tokenizer.decode(form))
                except Exception as exc:  # whatever the HF tokenizer makes of a negative id
                    outcomes.append(type(exc))
            assert outcomes[0] == outcomes[1]
            if negative > -vocab:  # the id the table's end would have given instead
                wrapped = [*ids[:where], vocab + negative, *ids[where + 1 :]]
                assert outcomes[1] != prompt_tokenizer.decode(wrapped)


def test_detokenizer_rejects_ids_outside_the_vocabulary(prompt_tokenizer: PromptTokenizer) -> None:
    det = prompt_tokenizer.new_detokenizer()
    with pytest.raises(FormatError, match="out of range"):
        det.push([prompt_tokenizer.vocab_size + 10])


def test_lone_surrogates_in_request_text_are_a_format_error(prompt_tokenizer: PromptTokenizer) -> None:
    # Python's json accepts "\ud800"; the Rust tokenizer cannot take it: a 400, not a crash.
    with pytest.raises(FormatError, match="U\\+D800 at character 1"):
        prompt_tokenizer.encode_segments(conversation("a\ud800b and more text to make a long run"))
    with pytest.raises(FormatError, match="surrogate"):
        prompt_tokenizer.encode_raw("x\udfff")
