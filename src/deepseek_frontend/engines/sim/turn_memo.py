"""What the simulated engine keeps of a conversation's previous request, so that reading a
follow-up costs what the follow-up adds, not its whole length.

An agent resends its whole conversation every turn: each request's prompt is the previous one's,
its answer, and new user turns (tool results render as user turns in V4). Its text before the last
``<｜User｜>`` (which the model reads for tools and schemas) and the prefix-cache page hashes of
that part are the previous request's plus the turns between; the previous request's last user
turn is one of this prompt's earlier ones. So both are remembered under the ids before each
prompt's last user turn -- their count, and the hash of their bytes to confirm it -- and a
follow-up looks for its earlier user turns among them, newest first: a hit leaves only the ids
after it to decode, and the pages after it to hash, and is replaced by the follow-up's own. The
answers are the same as from the whole prompt: byte-level decoding joins each id's bytes, and a
user-turn id's spelling starts with an ASCII byte, so text cut there rejoins exactly; the page
hashes are chained over the same pages either way.

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
    """Values remembered for a prompt's first ``count`` ids, by ``count`` and the hash of those ids'
    bytes (conversations of the same agent have heads of equal length: 128 conversations' first
    turns here spanned 300 counts), least recently used dropped first: at most
    :data:`TURN_MEMO_SIZE` of them, their lengths together at most ``budget`` (a longer value is
    not kept). A lookup hashes a prompt's prefix only at the counts some entry has."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._entries: OrderedDict[tuple[int, int], _Value] = OrderedDict()
        #: how many entries each count has
        self._counts: dict[int, int] = {}
        #: the lengths of the values held
        self.size = 0
        #: lookups that found an earlier prefix
        self.hits = 0

    def take(self, data: bytes, counts: Iterator[int]) -> tuple[int, _Value] | None:
        """The longest remembered prefix among ``counts`` (descending: the prompt's earlier user
        turns), with its value, which is no longer remembered -- the caller remembers the longer
        prompt it extends into, so a conversation holds one entry, its newest request's, and 256
        agent streams per process do not fill the memo with their last two turns each. Kept is
        a prefix that ends at the prompt's first user turn: the system prompt and tools, which
        the other conversations of the same agent start with too."""
        found = self._take(data, counts)
        return (found[0][0], found[1]) if found is not None else None

    def _take(self, data: bytes, counts: Iterator[int]) -> tuple[tuple[int, int], _Value] | None:
        """:meth:`take`, with the entry's whole key (its count, and the hash of its ids' bytes)."""
        earlier = list(islice(counts, LOOKBACK_TURNS))
        found = self._match(data, iter(earlier))
        if found is None:
            return None
        self.hits += 1
        key, value = found
        if key[0] == earlier[-1] and len(earlier) < LOOKBACK_TURNS:
            with contextlib.suppress(KeyError):  # the other thread may have evicted it meanwhile
                self._entries.move_to_end(key)
        else:
            self._drop(key)
        return key, value

    def longest(self, data: bytes, counts: Iterator[int]) -> int | None:
        """The count of the longest remembered prefix among ``counts`` (descending), or None; the
        memo is left as it was (a question asked before deciding where to :meth:`take` it)."""
        found = self._match(data, counts)
        return found[0][0] if found is not None else None

    def _match(self, data: bytes, counts: Iterator[int]) -> tuple[tuple[int, int], _Value] | None:
        held = self._counts
        for count in islice(counts, LOOKBACK_TURNS):
            if count in held:
                key = (count, hash(data[: count * ID_WIDTH]))
                value = self._entries.get(key)
                if value is not None:
                    return key, value
        return None

    def remember(self, data: bytes, count: int, value: _Value) -> None:
        if len(value) > self.budget:  # type: ignore[arg-type]
            return
        key = (count, hash(data[: count * ID_WIDTH]))
        self._drop(key)
        self._entries[key] = value
        self._counts[count] = self._counts.get(count, 0) + 1
        self.size += len(value)  # type: ignore[arg-type]
        entries = self._entries
        while len(entries) > TURN_MEMO_SIZE or self.size > self.budget:
            try:
                oldest = next(iter(entries))
            except (StopIteration, RuntimeError):  # emptied, or changed by the other thread meanwhile
                break
            self._drop(oldest)

    def _drop(self, key: tuple[int, int]) -> None:
        """Forget ``key``'s entry, if held (the other thread may have dropped it first)."""
        value = self._entries.pop(key, None)
        if value is None:
            return
        self.size -= len(value)  # type: ignore[arg-type]
        left = self._counts.get(key[0], 0) - 1
        if left > 0:
            self._counts[key[0]] = left
        else:
            self._counts.pop(key[0], None)


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
        decode: Callable[[Sequence[int]], str],
    ) -> tuple[str, tuple[int, int] | None]:
        """``decode(ids[:last])``, and the key of the remembered head it extends (its id count and
        the hash of those ids' bytes; None: decoded whole); ``earlier``: indices of the user turns
        before ``last``, newest first."""
        found = self._take(data, earlier)
        if found is None:
            text = decode(ids[:last])
        else:
            extended, known = found
            text = known + decode(ids[extended[0] : last])
        self.remember(data, last, text)
        return text, found[0] if found is not None else None


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
        found = self.take(prompt.data, earlier)
        if found is not None:
            count, chains = found
            prompt.chains, prompt.chained_ids = list(chains), count

    def remember_head(self, prompt: SimPrompt, last: int) -> None:
        """Keep the hashes of ``prompt``'s pages before ``last`` (its last user turn)."""
        pages = last // self.page_size
        if prompt.data is not None and last > 0 and len(prompt.chains) >= pages:
            self.remember(prompt.data, last, prompt.chains[:pages])
