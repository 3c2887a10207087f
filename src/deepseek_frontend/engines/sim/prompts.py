"""A ``/generate`` prompt read once per shared prefix: the simulated engine's cost per follow-up.

An agent resends its whole conversation every turn, so a worker sees the same long run of ids
again and again with a new tail. Read naively, every request costs the engine a pass over all
of its ids three times -- parsing the JSON list (0.18 ms for 12K ids), packing them into bytes
(0.16 ms) and hashing their prefix-cache pages (0.17 ms) -- about half of what the simulated
engine spends on a follow-up, on the critical path of every first token in a load test.

:class:`RecentPrompts` remembers the last prompts it read: the JSON text of their ``input_ids``,
the parsed ids, their packed bytes and their page hashes. A new body whose ``input_ids`` text
starts like a remembered one reuses all of that for the common run of ids and parses, packs and
hashes only the rest. Whatever does not fit the expected shape (no ``"input_ids":[`` key, text that
differs from its own parse, an id that is not an int, a body that is not an object) is left to the
caller's full parse, which reports the error as before: the fast path never changes an answer.

Pure: bytes in, parsed values out; no I/O.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from deepseek_frontend.errors import RequestError
from deepseek_frontend.generation import ID_ARRAY_ITEMSIZE, is_id_array

__all__ = ["ID_WIDTH", "INPUT_IDS_ERROR", "RecentPrompts", "SimPrompt", "prompt_bytes"]

#: bytes per id in :func:`prompt_bytes`: the tokenizer's id array is those bytes already
ID_WIDTH = ID_ARRAY_ITEMSIZE
#: the refusal of an ``input_ids`` that is not a non-empty list of ints (SGLang's 400)
INPUT_IDS_ERROR = "input_ids must be a non-empty list of token ids (the sim serves token mode)"
#: how a body's ``input_ids`` starts in orjson's and json's compact output (the frontend's clients)
_KEY = b'"input_ids":['
#: the key's spelling, to make sure the body has it once
_NAME = b'"input_ids"'
#: bytes of a list's text that pick the remembered prompt to compare with
_HEAD = 64
#: text compared per step when finding the common prefix (slices of this size, then a bisection)
_BLOCK = 4096


def prompt_bytes(ids: Sequence[int]) -> bytes | None:
    """``ids`` as 4-byte machine ints -- one C loop; what the engine hashes and searches instead of
    a Python loop per id of a long prompt -- or None when an id does not fit in 32 bits.

    The pipeline's ``array("i")`` (:attr:`GenerateRequest.input_ids` for this engine) is those
    bytes already: one memory copy, not a conversion per id (0.45 ms for an agent's 29K-token
    prompt, on the event loop).

    Raises :class:`RequestError` when an item is not an int (the check a worker makes of
    ``input_ids``).
    """
    if is_id_array(ids):
        return ids.tobytes()
    try:
        return array("i", ids).tobytes()
    except OverflowError:
        pass  # the packing stopped at a large id: the items after it are still to be checked
    except TypeError:
        raise RequestError(INPUT_IDS_ERROR, param="input_ids") from None
    if not all(isinstance(item, int) for item in ids):
        raise RequestError(INPUT_IDS_ERROR, param="input_ids")
    return None


def positions_from_end(data: bytes, token_id: int) -> Iterator[int]:
    """The indices of ``token_id`` in :func:`prompt_bytes` ``data``, last first (aligned matches
    only: its four bytes can also straddle two neighbouring ids).

    Searched from the end: ``rfind`` screens positions by the needle's first byte, ``find`` by its
    last, and the last byte of a little-endian id under 2**24 is zero in every fourth byte of the
    data (counting in a 12K-token prompt: 17 us this way, 40-50 us the other).
    """
    needle = array("i", [token_id]).tobytes()
    end = len(data)
    while (at := data.rfind(needle, 0, end)) >= 0:
        if at % ID_WIDTH == 0:
            yield at // ID_WIDTH
            end = at
        else:
            end = at + ID_WIDTH - 1


def count_id(data: bytes, token_id: int) -> int:
    """How many times ``token_id`` occurs in :func:`prompt_bytes` ``data``."""
    return sum(1 for _ in positions_from_end(data, token_id))


def last_index(data: bytes, token_id: int) -> int:
    """The index of the last ``token_id`` in :func:`prompt_bytes` ``data``, or -1."""
    return next(positions_from_end(data, token_id), -1)


@dataclass(slots=True, eq=False)
class SimPrompt:
    """A prompt as the engine reads it: the ids and their :func:`prompt_bytes` (None: an id needs
    more than 32 bits).

    ``chains``: the chained hashes of the prefix-cache pages of a prompt whose first
    ``chained_ids`` ids are this one's (those pages hash the same here); the
    :class:`~deepseek_frontend.engines.sim.engine.PrefixCache` reuses them and stores this
    prompt's own.
    """

    #: a list, or the pipeline's ``array("i")`` (:attr:`GenerateRequest.input_ids`)
    ids: Sequence[int]
    data: bytes | None
    chains: list[int] = field(default_factory=list)
    chained_ids: int = 0

    @classmethod
    def of(cls, ids: Sequence[int]) -> SimPrompt:
        """Read ``ids`` whole (raises :class:`RequestError` when an item is not an int)."""
        return cls(ids if isinstance(ids, list | array) else list(ids), prompt_bytes(ids))


@dataclass(slots=True, eq=False)
class _Remembered:
    text: bytes  # the JSON text of its input_ids, brackets included
    prompt: SimPrompt


def _common_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (C compares of slices)."""
    end = min(len(a), len(b))
    lo = 0
    while lo + _BLOCK <= end and a[lo : lo + _BLOCK] == b[lo : lo + _BLOCK]:
        lo += _BLOCK
    hi = min(lo + _BLOCK, end)
    # a[:lo] == b[:lo]; the first difference (if any) is before hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class RecentPrompts:
    """The last prompts read, by the first bytes of their ``input_ids`` text (see module docstring).

    Bounded: at most ``entries`` prompts and ``budget_ids`` ids in all (a list of Python ints
    costs about 36 bytes per id); prompts under ``min_ids`` ids are not remembered (nothing to
    gain). The least recently matched prompt goes first.
    """

    def __init__(self, entries: int = 64, budget_ids: int = 2_000_000, min_ids: int = 256) -> None:
        self.entries = entries
        self.budget_ids = budget_ids
        self.min_ids = min_ids
        self._by_head: OrderedDict[bytes, _Remembered] = OrderedDict()
        self._ids = 0
        #: bodies read with a remembered prefix / read whole (for tests and the stats endpoint)
        self.reused = 0
        self.read_whole = 0

    def read(self, body: bytes) -> tuple[dict[str, Any], SimPrompt] | None:
        """``(the body as a dict, its prompt)`` when the body is a JSON object with an ``input_ids``
        list of ints written compactly; None otherwise (the caller parses the body itself and
        reports what is wrong with it)."""
        key = body.find(_KEY)
        if key < 0:
            return None
        start = key + len(_KEY) - 1  # at the list's "["
        end = body.find(b"]", start) + 1
        if end <= 0:
            return None
        # The key found must be the object's one input_ids: with no \u escape outside the list, a
        # key spelling input_ids is spelled literally, and there is no other such spelling.
        if (
            body.find(_NAME, 0, key) >= 0
            or body.find(_NAME, end) >= 0
            or body.find(b"\\u", 0, key) >= 0
            or body.find(b"\\u", end) >= 0
        ):
            return None
        try:
            # the rest of the body, the list replaced by a marker: small, parsed in full
            rest = orjson.loads(body[:start] + b"0" + body[end:])
        except orjson.JSONDecodeError:
            return None
        if rest.__class__ is not dict or rest.get("input_ids") != 0:
            return None  # not an object, or the list found was nested in another value
        prompt = self._read_ids(body[start:end])
        if prompt is None:
            return None
        rest["input_ids"] = prompt.ids
        return rest, prompt

    def _read_ids(self, text: bytes) -> SimPrompt | None:
        head = text[:_HEAD]
        known = self._by_head.get(head)
        prompt = None
        if known is not None:
            prompt = self._extend(known, text)
        if prompt is None:
            try:
                ids = orjson.loads(text)
            except orjson.JSONDecodeError:
                return None
            if not ids or ids.__class__ is not list:
                return None
            try:
                prompt = SimPrompt.of(ids)
            except RequestError:
                return None
            self.read_whole += 1
        else:
            self.reused += 1
        if prompt.data is not None and len(prompt.ids) >= self.min_ids:
            self._remember(head, _Remembered(text, prompt))
        return prompt

    def _extend(self, known: _Remembered, text: bytes) -> SimPrompt | None:
        """``text`` read as ``known``'s ids up to the last comma both share, then its own tail."""
        old = known.text
        if text == old:
            return known.prompt
        common = _common_prefix(old, text)
        cut = old.rfind(b",", 0, common)
        if cut < 0:
            return None
        # ``known`` was a valid list of ints: its text up to this comma holds whole ids only
        shared = old.count(b",", 0, cut + 1)
        try:
            tail = orjson.loads(b"[" + text[cut + 1 :])
        except orjson.JSONDecodeError:
            return None
        if tail.__class__ is not list or not tail:
            return None
        try:
            tail_data = prompt_bytes(tail)
        except RequestError:
            return None
        old_prompt = known.prompt
        if tail_data is None or old_prompt.data is None:
            return None
        ids = old_prompt.ids[:shared] + tail
        data = old_prompt.data[: shared * ID_WIDTH] + tail_data
        return SimPrompt(ids, data, old_prompt.chains, min(shared, old_prompt.chained_ids))

    def _remember(self, head: bytes, entry: _Remembered) -> None:
        by_head = self._by_head
        replaced = by_head.pop(head, None)
        if replaced is not None:
            self._ids -= len(replaced.prompt.ids)
        by_head[head] = entry
        self._ids += len(entry.prompt.ids)
        while by_head and (len(by_head) > self.entries or self._ids > self.budget_ids):
            _, dropped = by_head.popitem(last=False)
            self._ids -= len(dropped.prompt.ids)
