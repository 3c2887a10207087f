"""Shared machinery of the parsing tests: DSML builders, chunkings, a replay runner and the invariant checker.

Every run of the parser in these tests goes through :func:`run`, which asserts the streaming contract's
invariants I1 (no markup in any delta or in the accumulated text), I3 (argument deltas concatenate to the
final, valid JSON object), I4 (name once, before arguments; unique ids; indexes 0..n-1 in order) and the
shape of the event stream (exactly one ``Finish``, last).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache

from tokenizers import Tokenizer

from deepseek_frontend.parsing import (
    ContentDelta,
    Event,
    Finish,
    ParsedMessage,
    ReasoningDelta,
    StreamParser,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    assemble_message,
    get_grammar,
)
from deepseek_frontend.tokenization import bundled_tokenizer_path

EOS = "<｜end▁of▁sentence｜>"
S = "<｜DSML｜"

# Structural markup only: ``<｜DSML｜not_a_tool`` (scenario 11) or ``<｜DSML｜invoke> here`` in prose is text.
_BLOCK_OPENER = re.compile(r"<｜DSML｜ ?(?:tool_calls|function_calls|toolcalls|calls)>")
_VALUE_MARKUP = re.compile(
    r"</｜DSML｜ ?(?:tool_calls|function_calls|toolcalls|calls|invoke|parameter)>"
    r"|<｜DSML｜ ?(?:invoke|parameter)\s+name="
    r"|<｜end▁of▁sentence｜>"
)
_THINK_MARKUP = re.compile(r"</?think>")


def markup_in(text: str, *, in_arguments: bool = False) -> list[str]:
    """Markup fragments found in ``text``.

    Inside an argument value only what is structural there counts: think tags and a block opener written
    inside a value are data (DeepSeek's reference keeps them too).
    """
    found = _VALUE_MARKUP.findall(text)
    if not in_arguments:
        found += _BLOCK_OPENER.findall(text) + _THINK_MARKUP.findall(text)
    return found


# ------------------------------------------------------------------------------------------ DSML builders
def block(body: str, family: str = "deepseek_v4") -> str:
    g = get_grammar(family)
    return f"{g.block_open}\n{body}{g.block_close}"


def invoke(name: str, body: str = "", family: str = "deepseek_v4") -> str:
    g = get_grammar(family)
    return f'{g.invoke_open} name="{name}">\n{body}{g.invoke_close}\n'


def param(key: str, value: str, string: str | None = "true", family: str = "deepseek_v4") -> str:
    g = get_grammar(family)
    attr = "" if string is None else f' string="{string}"'
    return f'{g.parameter_open} name="{key}"{attr}>{value}{g.parameter_close}\n'


def canonical_call(family: str = "deepseek_v4", *, eos: bool = True) -> str:
    """The contract's canonical get_weather call, blank line included."""
    body = invoke(
        "get_weather", param("city", "Paris", family=family) + param("days", "3", "false", family), family
    )
    return "\n\n" + block(body, family) + (EOS if eos else "")


# ---------------------------------------------------------------------------------------------- chunkings
@lru_cache(maxsize=1)
def _tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(bundled_tokenizer_path()))


@lru_cache(maxsize=512)
def token_pieces(text: str) -> tuple[str, ...]:
    """The text as the incremental detokenizer releases it: one piece per token, whole characters only.

    Byte-level BPE tokens may split a character; their offsets then overlap, so pieces are cut at the
    distinct token end offsets (which merges such tokens), as a detokenizer that only releases complete
    characters would.
    """
    encoding = _tokenizer().encode(text, add_special_tokens=False)
    ends = sorted({end for _, end in encoding.offsets if 0 < end <= len(text)})
    if not ends or ends[-1] != len(text):
        ends.append(len(text))
    pieces, start = [], 0
    for end in ends:
        pieces.append(text[start:end])
        start = end
    assert "".join(pieces) == text
    return tuple(pieces)


def mtp_chunks(text: str, seed: int) -> list[str]:
    """2-6 tokens per chunk, as speculative decoding delivers them."""
    pieces = token_pieces(text)
    rng = random.Random(seed)
    out, i = [], 0
    while i < len(pieces):
        k = rng.randint(2, 6)
        out.append("".join(pieces[i : i + k]))
        i += k
    return out


CHUNKINGS = ("all", "char", "tok", "mtp", "split2")


def chunkings(text: str, name: str) -> list[list[str]]:
    """The chunkings of ``text`` named by the contract (``mtp`` with three seeds)."""
    if name == "all":
        return [[text]]
    if name == "char":
        return [list(text)]
    if name == "tok":
        return [list(token_pieces(text))]
    if name == "mtp":
        return [mtp_chunks(text, seed) for seed in (0, 1, 2)]
    if name == "split2":
        return [[text[:i], text[i:]] for i in range(1, len(text))]
    raise ValueError(name)


# ------------------------------------------------------------------------------------------------- runner
@dataclass
class Run:
    events: list[Event]
    message: ParsedMessage
    parser: StreamParser

    def deltas(self, kind: type) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]

    def calls(self) -> list[tuple[str, str]]:
        return [(c.name, c.arguments) for c in self.message.tool_calls]


def run(
    chunks: list[str],
    *,
    family: str = "deepseek_v4",
    thinking: bool = False,
    finish_reason: str = "stop",
    **options: object,
) -> Run:
    """Feed ``chunks`` one by one, finish, check the invariants, and return everything."""
    parser = StreamParser(family, thinking=thinking, **options)  # type: ignore[arg-type]
    events: list[Event] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish(finish_reason))
    check_invariants(events)
    return Run(events, assemble_message(events), parser)


def check_invariants(events: list[Event]) -> None:
    """Assert I1, I3, I4 and the event-stream shape on one response's events."""
    assert events and isinstance(events[-1], Finish), "the last event must be Finish"
    assert sum(isinstance(e, Finish) for e in events) == 1
    reasoning: list[str] = []
    content: list[str] = []
    args: dict[int, list[str]] = {}
    open_calls: set[int] = set()
    ids: set[str] = set()
    next_index = 0
    for event in events:
        if isinstance(event, (ReasoningDelta, ContentDelta)):
            assert event.text, "empty text delta"
            assert not markup_in(event.text), f"markup leaked in {event!r}"
            (reasoning if isinstance(event, ReasoningDelta) else content).append(event.text)
        elif isinstance(event, ToolCallStart):
            assert event.index == next_index, "indexes must run 0..n-1 in order"
            assert event.id not in ids, "ids must be unique"
            assert event.name is not None and not markup_in(event.name)
            ids.add(event.id)
            next_index += 1
            args[event.index] = []
            open_calls.add(event.index)
        elif isinstance(event, ToolCallArgumentsDelta):
            assert event.index in open_calls, "arguments before ToolCallStart or after ToolCallEnd"
            assert event.text, "empty arguments delta"
            assert not markup_in(event.text, in_arguments=True), f"markup leaked in {event!r}"
            args[event.index].append(event.text)
        elif isinstance(event, ToolCallEnd):
            assert event.index in open_calls
            open_calls.remove(event.index)
    assert not open_calls, "every started call must end"
    # Held partials must not leak either: check the accumulated text, not only each delta.
    assert not markup_in("".join(reasoning)), "markup in the accumulated reasoning"
    assert not markup_in("".join(content)), "markup in the accumulated content"
    for index, parts in args.items():
        text = "".join(parts)
        assert not markup_in(text, in_arguments=True)
        value = json.loads(text)  # I3: the concatenation is valid JSON ...
        assert isinstance(value, dict), f"call {index}: arguments must be a JSON object"
