"""What the simulated engine keeps of a conversation's previous request, so that reading a
follow-up costs what the follow-up adds, not its whole length.

An agent resends its whole conversation every turn: each request's prompt is the previous one's,
its answer, and new user turns (tool results render as user turns in V4). Its text before the last
``<｜User｜>`` (which the model reads for tools and schemas) and the prefix-cache page hashes of
that part are the previous request's plus the turns between; the previous request's last user
turn is one of this prompt's earlier ones. So both are remembered under the ids before each
prompt's last user turn -- their count, and the hash of their bytes to confirm it -- and a
follow-up looks for its earlier user turns among them, newest first: a hit leaves only the ids
after it to decode, and the pages after it to hash. The answers are the same as from the whole
prompt: byte-level decoding joins each id's bytes, and a user-turn id's spelling starts with an
ASCII byte, so text cut there rejoins exactly; the page hashes are chained over the same pages
either way.

The planning thread and the event loop (``plan_request``) may both read prompts, as they share
the engine's other memo tables: each step here is one ``OrderedDict`` operation, and an entry the
other evicted meanwhile is only not found.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from itertools import islice
from typing import Generic, TypeVar

from deepseek_frontend.engines.sim.prompts import ID_WIDTH, SimPrompt

#: prompt heads remembered (each entry: the text of one, or its page hashes) ...
TURN_MEMO_SIZE = 256
#: ... and at most this many characters of head text (about 32-128 MB) ...
HEAD_TEXT_BUDGET = 32 * 2**20
#: ... and page hashes (about 36 MB)
PAGE_HASH_BUDGET = 2**20
#: earlier user turns of a prompt looked up, newest first (a lookup is a dict probe; only a length
#: found there costs a hash of the prompt's bytes)
LOOKBACK_TURNS = 64

_Value = TypeVar("_Value")


class _PrefixMemo(Generic[_Value]):
    """Values remembered for a prompt's first ``count`` ids, by ``count`` (the hash of those ids'
    bytes confirms a match), least recently used dropped first: at most :data:`TURN_MEMO_SIZE`
    of them, their lengths together at most ``budget`` (a longer value is not kept)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._by_count: OrderedDict[int, tuple[int, _Value]] = OrderedDict()
        #: the lengths of the values held
        self.size = 0
        #: lookups that found an earlier prefix
        self.hits = 0

    def find(self, data: bytes, counts: Iterator[int]) -> tuple[int, _Value] | None:
        """The longest remembered prefix among ``counts`` (descending), with its value."""
        for count in islice(counts, LOOKBACK_TURNS):
            entry = self._by_count.get(count)
            if entry is not None and entry[0] == hash(data[: count * ID_WIDTH]):
                with contextlib.suppress(KeyError):  # evicted by the other thread meanwhile
                    self._by_count.move_to_end(count)
                self.hits += 1
                return count, entry[1]
        return None

    def remember(self, data: bytes, count: int, value: _Value) -> None:
        length = len(value)  # type: ignore[arg-type]
        if length > self.budget:
            return
        table = self._by_count
        replaced = table.get(count)
        table[count] = (hash(data[: count * ID_WIDTH]), value)
        self.size += length - (len(replaced[1]) if replaced is not None else 0)  # type: ignore[arg-type]
        with contextlib.suppress(KeyError):  # the other thread may be trimming the table too
            table.move_to_end(count)
            while len(table) > TURN_MEMO_SIZE or self.size > self.budget:
                self.size -= len(table.popitem(last=False)[1][1])  # type: ignore[arg-type]


class HeadTexts(_PrefixMemo[str]):
    """The text of ``ids[:last]`` (the prompt before its last user turn), decoded from where the
    conversation's previous request left off when that is remembered."""

    def __init__(self, budget: int = HEAD_TEXT_BUDGET) -> None:
        super().__init__(budget)

    def text(
        self,
        ids: Sequence[int],
        data: bytes,
        last: int,
        earlier: Iterator[int],
        decode: Callable[[list[int]], str],
    ) -> str:
        """``decode(ids[:last])``; ``earlier``: indices of the user turns before ``last``, newest first."""
        found = self.find(data, earlier)
        if found is None:
            text = decode(list(ids[:last]))
        else:
            count, known = found
            text = known + decode(list(ids[count:last]))
        self.remember(data, last, text)
        return text


class PageChains(_PrefixMemo[list[int]]):
    """Seeds a :class:`SimPrompt`'s prefix-cache page hashes from the conversation's previous
    request, and remembers this one's for the next."""

    def __init__(self, page_size: int, budget: int = PAGE_HASH_BUDGET) -> None:
        super().__init__(budget)
        self.page_size = page_size

    def seed(self, prompt: SimPrompt, earlier: Iterator[int]) -> None:
        """Give ``prompt`` (whose hashes are not known yet) the remembered hashes of the pages
        before the newest of its ``earlier`` user turns (indices, newest first) that has them."""
        if prompt.chains or prompt.data is None:
            return
        found = self.find(prompt.data, earlier)
        if found is not None:
            count, chains = found
            prompt.chains, prompt.chained_ids = list(chains), count

    def remember_head(self, prompt: SimPrompt, last: int) -> None:
        """Keep the hashes of ``prompt``'s pages before ``last`` (its last user turn)."""
        pages = last // self.page_size
        if prompt.data is not None and last > 0 and len(prompt.chains) >= pages:
            self.remember(prompt.data, last, prompt.chains[:pages])
