"""The sim engine's prompt memo: a body read through it means exactly what its full parse means."""

from __future__ import annotations

import dataclasses
import json
import random
from array import array
from typing import Any

import orjson
import pytest

from deepseek_frontend.engines.sim.engine import PrefixCache
from deepseek_frontend.engines.sim.prompts import RecentPrompts, SimPrompt, prompt_bytes
from deepseek_frontend.errors import RequestError
from deepseek_frontend.generation import GenerateRequest, SamplingParams


def body_of(ids: Any, *, rid: str = "r1", compact: bool = True, **extra: Any) -> bytes:
    """A /generate body the way the frontend's SGLang client writes it (or json's spaced style)."""
    payload = {"rid": rid, "input_ids": ids, "sampling_params": {"max_new_tokens": 4}, **extra}
    if compact:
        return orjson.dumps(payload)
    return json.dumps(payload).encode()


def assert_reads_as_parsed(recent: RecentPrompts, body: bytes) -> SimPrompt | None:
    """``recent.read`` is None (left to the full parse) or exactly the full parse."""
    read = recent.read(body)
    if read is None:
        return None
    parsed, prompt = read
    assert parsed == orjson.loads(body)
    assert prompt.ids is parsed["input_ids"]
    assert prompt.data == prompt_bytes(prompt.ids)
    return prompt


def test_a_follow_up_reuses_the_remembered_prefix_and_reads_only_its_tail() -> None:
    recent = RecentPrompts()
    rng = random.Random(1)
    history = [rng.randrange(100, 128_000) for _ in range(3000)]
    first = assert_reads_as_parsed(recent, body_of([*history, 5, 6]))
    assert first is not None and recent.read_whole == 1
    for turn in range(3):
        follow_up = [*history, 5, 6, 700 + turn, 12345, 7]
        prompt = assert_reads_as_parsed(recent, body_of(follow_up, rid=f"r{turn + 2}"))
        assert prompt is not None and prompt.ids == follow_up
    assert recent.reused == 3 and recent.read_whole == 1
    # json.dumps' spaced style is not the frontend's: left to the full parse
    assert recent.read(body_of([*history, 9], compact=False)) is None


def test_random_conversations_read_exactly_as_their_full_parse() -> None:
    """Trees of prompts sharing prefixes of every length (digits of ids cut at any byte), some with
    ids past 32 bits, negative ids or spaced JSON: each read equals ``orjson.loads`` of its body."""
    rng = random.Random(7)
    recent = RecentPrompts(entries=8, budget_ids=20_000, min_ids=4)
    roots = [[rng.randrange(0, 130_000) for _ in range(rng.randrange(5, 3000))] for _ in range(6)]
    reads = 0
    for i in range(600):
        base = rng.choice(roots)
        ids = base[: rng.randrange(0, len(base) + 1)]
        ids += [
            rng.choice([rng.randrange(0, 10), rng.randrange(0, 130_000)]) for _ in range(rng.randrange(0, 40))
        ]
        if rng.random() < 0.05:
            ids.append(rng.choice([-3, 2**31, 2**40]))
        if not ids:
            ids = [1]
        if rng.random() < 0.3:
            roots.append(ids)
        body = body_of(ids, rid=f"r{i}", compact=rng.random() > 0.1)
        prompt = assert_reads_as_parsed(recent, body)
        if prompt is not None:
            reads += 1
            assert prompt.ids == ids
    assert reads > 500
    assert recent.reused > 200, "prefixes were shared"


@pytest.mark.parametrize(
    "body",
    [
        b'{"rid":"a","input_ids":[1,2,3.5]}',  # not an int
        b'{"rid":"a","input_ids":[1,2,"3"]}',
        b'{"rid":"a","input_ids":[1,[2],3]}',  # nested list
        b'{"rid":"a","input_ids":[]}',
        b'{"rid":"a","input_ids":[1,2,3]',  # truncated
        b'[{"input_ids":[1,2,3]}]',  # not an object
        b'{"x":{"input_ids":[1,2,3]}}',  # nested, and no input_ids of its own
        b'{"x":{"input_ids":[1,2,3]},"input\\u005fids":0}',  # the list is nested; the real key escaped
        b'{"x":{"input_ids":[1,2,3]},"input_ids":0}',
        b'{"input_ids":[1,2,3],"input_ids":[4]}',  # duplicate key: the last one counts
        b'{"input_ids":[1,2,3],"input\\u005fids":[4]}',
        b'{"rid":"\\"input_ids\\":[1]","input_ids":false}',
    ],
)
def test_a_body_that_is_not_a_plain_request_is_left_to_the_full_parse(body: bytes) -> None:
    recent = RecentPrompts(min_ids=1)
    # remember a prompt these bodies start like, so the memo's own path is the one tried
    assert recent.read(b'{"rid":"a","input_ids":[1,2,3,4,5]}') is not None
    assert recent.read(body) is None


def test_a_remembered_prefix_with_a_bad_tail_is_left_to_the_full_parse() -> None:
    recent = RecentPrompts(min_ids=1)
    ids = list(range(1000, 1400))
    assert recent.read(body_of(ids)) is not None
    for tail in (b"1.5]", b'"x"]', b"[1]]", b"true,]", b"-]"):
        text = orjson.dumps(ids)[:-1] + b"," + tail
        body = b'{"rid":"r","input_ids":' + text + b"}"
        assert recent.read(body) is None, body[-20:]


def test_page_hashes_carried_over_give_the_cached_lengths_of_hashing_every_page() -> None:
    rng = random.Random(3)
    recent = RecentPrompts(min_ids=1)
    carried, hashed = PrefixCache(page_size=4, max_pages=10_000), PrefixCache(page_size=4, max_pages=10_000)
    history: list[int] = []
    for turn in range(40):
        if rng.random() < 0.2:
            history = history[: rng.randrange(0, len(history) + 1)]  # an edit: the tail is new
        history += [rng.randrange(0, 50_000) for _ in range(rng.randrange(1, 30))]
        read = recent.read(body_of(history, rid=f"r{turn}"))
        assert read is not None
        _, prompt = read
        assert carried.lookup_and_insert(prompt.ids, prompt=prompt) == hashed.lookup_and_insert(history)
        assert len(prompt.chains) == (len(history) - 1) // 4
    assert recent.reused > 20


def test_the_memo_is_bounded_in_prompts_and_ids() -> None:
    recent = RecentPrompts(entries=4, budget_ids=2500, min_ids=10)
    for i in range(10):
        assert recent.read(body_of([i * 1000 + k for k in range(1000)])) is not None
        remembered = list(recent._by_head.values())
        assert len(remembered) <= 4 and sum(len(r.prompt.ids) for r in remembered) <= 2500
    assert recent.read(body_of([1, 2, 3])) is not None  # short prompts are read, not remembered
    assert all(len(r.prompt.ids) == 1000 for r in recent._by_head.values())


def test_an_id_past_32_bits_does_not_hide_a_non_int_after_it() -> None:
    """Packing stops at the first id past 32 bits; the ids after it are still checked."""
    with pytest.raises(RequestError):
        prompt_bytes([1, 2**40, 2.5])
    assert prompt_bytes([1, 2**40, 3]) is None  # ints all: read with 8-byte ids
    recent = RecentPrompts(min_ids=1)
    assert recent.read(body_of(list(range(1000, 1300)))) is not None
    assert recent.read(body_of([*range(1000, 1300), 2**40, 2.5])) is None


def test_mutated_bodies_are_read_exactly_as_parsed_or_left_to_the_parse() -> None:
    """Random byte edits of a remembered body (digits, brackets, quotes, escapes, keys cut):
    whatever the memo accepts is exactly ``orjson.loads`` of the body, ids all ints."""
    rng = random.Random(11)
    recent = RecentPrompts(min_ids=1)
    base = body_of([rng.randrange(0, 130_000) for _ in range(400)], stream=True)
    assert recent.read(base) is not None
    alphabet = b'0123456789,[]{}":-.eEtruefalsn \\u'
    accepted = 0
    for _ in range(20_000):
        body = bytearray(base)
        for _ in range(rng.randrange(1, 4)):
            at, op = rng.randrange(len(body)), rng.random()
            if op < 0.4:
                body[at] = rng.choice(alphabet)
            elif op < 0.7:
                body.insert(at, rng.choice(alphabet))
            else:
                del body[at]
        read = recent.read(bytes(body))
        if read is None:
            continue
        parsed, prompt = read
        assert parsed == orjson.loads(bytes(body)), bytes(body)
        assert all(isinstance(i, int) for i in prompt.ids)
        assert prompt.data == prompt_bytes(prompt.ids)
        accepted += 1
    assert accepted > 3000, "most edits outside the ids keep a valid body"


def test_a_request_is_read_from_its_own_ids_whether_a_list_or_the_tokenizers_array() -> None:
    """The in-process engine reads the tokenizer's ``array("i")`` as its bytes, the same bytes a
    list of the same ids packs to; a request whose ids were replaced -- a migrated request's prompt
    plus its output, or any other list, even of the same length -- is read from its new ids."""
    ids = list(range(1000, 1400))
    as_array = array("i", ids)
    request = GenerateRequest("r1", as_array, SamplingParams(max_new_tokens=4))
    prompt = SimPrompt.of(request.input_ids)
    assert prompt.ids is as_array
    assert prompt.data == prompt_bytes(ids) == as_array.tobytes()
    for replaced in ([*ids, 7, 8], list(reversed(ids))):
        moved = dataclasses.replace(request, input_ids=replaced)
        prompt = SimPrompt.of(moved.input_ids)
        assert prompt.ids is replaced and prompt.data == prompt_bytes(replaced) != as_array.tobytes()
    # an array of another width is read id by id: its items, not its bytes
    wide = array("q", ids)
    assert SimPrompt.of(wide).data == as_array.tobytes()
