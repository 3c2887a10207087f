"""The random bytes every id is made of: from ``os.urandom``, each handed out once -- across threads
and across forked server processes -- and drawn uniformly into an id's alphabet."""

from __future__ import annotations

import os
import string
import threading
from collections import Counter

import pytest

from deepseek_frontend import _random_ids
from deepseek_frontend._random_ids import random_bytes, random_hex, random_text


def test_ids_have_the_length_and_alphabet_asked_for_and_do_not_repeat() -> None:
    ids = [random_hex(16) for _ in range(5000)]
    assert all(len(i) == 32 and set(i) <= set("0123456789abcdef") for i in ids)
    assert len(set(ids)) == len(ids)
    assert len(random_bytes(200)) == 200  # longer than one piece of the pool
    texts = [random_text(string.ascii_letters + string.digits, 24) for _ in range(2000)]
    assert all(len(t) == 24 and t.isalnum() and t.isascii() for t in texts)
    assert len(set(texts)) == len(texts)


def test_text_characters_are_drawn_uniformly() -> None:
    # 36 characters do not divide 256: folding every byte in would make the first 4 characters 8/7
    # as likely as the rest, 2,250 each of 72,000 against 2,000 (drawn uniformly, the mean of the
    # four has a standard deviation of 22: 2,100 is 4.5 of them away from either)
    alphabet = string.ascii_lowercase + string.digits
    counts = Counter(random_text(alphabet, 72_000))
    assert set(counts) == set(alphabet)
    first_four = sum(counts[char] for char in alphabet[:4]) / 4
    assert first_four < 2100, counts.most_common()


def test_an_alphabet_of_one_or_more_than_256_characters_is_refused() -> None:
    with pytest.raises(ValueError, match="2 to 256"):
        random_text("a", 4)


def test_threads_drawing_at_once_never_get_the_same_bytes() -> None:
    drawn: list[list[str]] = [[] for _ in range(4)]

    def draw(into: list[str]) -> None:
        into.extend(random_hex(16) for _ in range(5000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in drawn]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    everything = [i for into in drawn for i in into]
    assert len(everything) == 20_000 and len(set(everything)) == 20_000


def test_a_forked_process_does_not_hand_out_its_parents_bytes() -> None:
    _random_ids._pieces.clear()
    random_bytes(1)  # the pool is filled again: what the parent hands out next is in it
    assert _random_ids._pieces
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        try:
            os.write(write, random_bytes(64))
        finally:
            os._exit(0)
    os.close(write)
    try:
        from_child = b""
        while len(from_child) < 64:
            part = os.read(read, 64)
            if not part:
                break
            from_child += part
    finally:
        os.close(read)
        os.waitpid(child, 0)
    assert len(from_child) == 64
    assert random_bytes(64) != from_child
