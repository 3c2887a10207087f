"""Streaming parser: model text -> reasoning, content and DSML tool-call events.

Design (see ``docs/parsing.md`` for the diagram and the contested choices):

* **Grammar as data.** :mod:`~deepseek_frontend.parsing.grammars` lists the spellings of each family. For
  every parser state, :class:`_LexTables` precomputes once per grammar the terminals that state reacts to
  (a dict probed once per distinct terminal length), their two-character heads, the set of their proper
  prefixes and the longest length.
* **One incremental lexer.** In each state the lexer jumps with ``str.find`` to the next character that can
  start something (``<``, and ``\\n`` where a blank line may precede a block). Plain text between such
  characters is released in one slice. At a ``<`` it matches a terminal, or holds the rest of the input
  back *only* if it is a proper prefix of a terminal of the current state. Held text is at most the longest
  terminal plus two newlines (one newline in a value), or one short attribute header (``_HEADER_CAP``);
  nothing else buffers, and no input is scanned twice except that bounded tail. Cost per character is
  constant, whatever came before. ``feed`` has a fast path for pieces that contain neither ``<`` nor a
  newline: they become one delta without entering the lexer.
* **One state machine.** ``(state, terminal) -> (next state, events)`` is spelled out in
  ``_on_text_terminal`` (REASONING, CONTENT), ``_lex_structure`` (BLOCK, INVOKE) and ``_lex_param`` (PARAM),
  one branch per transition, each odd one with its reason.

States: ``REASONING`` and ``CONTENT`` (text), ``BLOCK`` (inside ``<｜DSML｜tool_calls>``), ``INVOKE`` (inside
an invoke, between parameters), ``PARAM`` (inside a value) and ``DONE`` (after the block or EOS); the diagram
is in ``docs/parsing.md``.

The only lifecycle rule: call :meth:`StreamParser.feed` any number of times, then
:meth:`StreamParser.finish` exactly once; both raise :class:`RuntimeError` after ``finish``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from json.encoder import encode_basestring  # type: ignore[attr-defined]  # C-accelerated json string quoting
from typing import Any

from deepseek_frontend._random_ids import random_hex
from deepseek_frontend.errors import RequestError
from deepseek_frontend.parsing.events import (
    ContentDelta,
    Event,
    Finish,
    FinishReason,
    ParsedMessage,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallEnd,
    ToolCallStart,
    assemble_message,
)
from deepseek_frontend.parsing.grammars import DsmlGrammar, Terminal, get_grammar

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------------
# parser states
_REASONING = 0
_CONTENT = 1
_BLOCK = 2
_INVOKE = 3
_PARAM = 4
_DONE = 5
_STATE_NAMES = ("REASONING", "CONTENT", "BLOCK", "INVOKE", "PARAM", "DONE")

# Terminals each state reacts to. Anything else is plain text of that state: reasoning / content / a
# parameter value, or ignored filler between tags in BLOCK and INVOKE.
_T = Terminal
_STATE_TERMINALS: dict[int, frozenset[Terminal]] = {
    # Closers and parameter tags are terminals in the text states only so that they are dropped instead of
    # leaking (I1).
    _REASONING: frozenset(_T),
    _CONTENT: frozenset(_T),
    _BLOCK: frozenset({_T.EOS, _T.BLOCK_OPEN, _T.BLOCK_CLOSE, _T.INVOKE_OPEN}),
    _INVOKE: frozenset({_T.EOS, _T.BLOCK_CLOSE, _T.INVOKE_OPEN, _T.INVOKE_CLOSE, _T.PARAM_OPEN}),
    # Inside a value only DSML structure and EOS count: ``<think>`` in an argument is data.
    _PARAM: frozenset(
        {_T.EOS, _T.BLOCK_CLOSE, _T.INVOKE_OPEN, _T.INVOKE_CLOSE, _T.PARAM_OPEN, _T.PARAM_CLOSE}
    ),
}

# Lexer results besides a Terminal
_HOLD = -1  # the rest of the input may still become a terminal: keep it for the next feed
_NONE = -2  # no terminal starts here: the ``<`` is text
_PARTIAL = -3  # end of output inside what could have been a terminal

# Attribute headers after ``<｜DSML｜invoke`` / ``<｜DSML｜parameter``. The opener only becomes structural
# once `` name="`` follows (scenario 11: ``<｜DSML｜invoke> here`` in prose stays text).
_NAME_OPEN = re.compile(r'\s+name="')
_NAME_OPEN_PREFIX = re.compile(r"(?:\s+(?:n(?:a(?:m(?:e=?)?)?)?)?)?")
#: longest whitespace run (plus ``name=``) held back before deciding an opener is text
_PRE_HEADER_CAP = 64
#: longest name + attributes accepted in a header; tool names are at most 64 characters in the OpenAI API
_HEADER_CAP = 256
# Body between ``name="`` and the first ``>``. The name is matched lazily so that a name containing a quote
# (``we"ird``) is kept whole, as DeepSeek's reference parser does; quotes around the string value are
# optional. This regex cannot fail.
_HEADER_BODY = re.compile(
    r'(?P<name>.*?)"?(?:\s+string\s*=\s*"?(?P<string>[^"\s/]*)"?)?\s*(?P<slash>/)?', re.S
)
_HDR_HOLD = 0
_HDR_REJECT = 1  # not a header after all: the opener is plain text up to ``pos``
_HDR_ABORT = 2  # committed to markup but the header broke at ``pos``: drop it
_HDR_OK = 3

# parameter value modes
_P_STRING = 0  # string="true": streamed verbatim as a JSON string
_P_RAW = 1  # string="false" or no attribute: JSON if it parses, else a string; emitted at the close
_P_UNWRAP = 2  # a lone ``arguments`` object for a tool whose schema has no such property (scenario 40)
_P_DISCARD = 3  # dropped call, or a repeated parameter name

# text channels of the pending-delta batch
_K_REASONING = 1
_K_CONTENT = 2
_K_ARGS = 3

_MARKER = "｜"  # full-width bar: present in every DSML/special-token terminal, never in ordinary prose


@dataclass(frozen=True, slots=True)
class _LexTables:
    """What one state's lexer needs, computed once per grammar."""

    kinds: Mapping[str, Terminal]
    #: distinct terminal lengths, longest first: matching is one slice + dict lookup per length
    lengths: tuple[int, ...]
    #: first two characters of every terminal, to dismiss a ``<`` that starts nothing in one lookup
    heads: frozenset[str]
    prefixes: frozenset[str]
    maxlen: int


@lru_cache(maxsize=16)
def _lex_tables(grammar: DsmlGrammar) -> tuple[_LexTables, ...]:
    terminals = grammar.terminals()
    for a in terminals:
        for b in terminals:
            # The lexer takes the first terminal matching at a position; a prefix relation would make that
            # ambiguous (and make a complete terminal indistinguishable from a held prefix).
            if a != b and b.startswith(a):
                raise ValueError(f"grammar {grammar.family}: terminal {a!r} is a prefix of {b!r}")
    tables = []
    for state in range(_DONE):
        kinds = {t: k for t, k in terminals.items() if k in _STATE_TERMINALS[state]}
        lengths = tuple(sorted({len(t) for t in kinds}, reverse=True))
        prefixes = frozenset(t[:i] for t in kinds for i in range(1, len(t)))
        heads = frozenset(t[:2] for t in kinds)
        tables.append(_LexTables(kinds, lengths, heads, prefixes, max(map(len, kinds))))
    return tuple(tables)


def _default_id() -> str:
    return f"call_{random_hex(12)}"


def _reject_constant(name: str) -> Any:
    # json.loads accepts NaN/Infinity; they are not JSON, so such a value falls back to a string.
    raise ValueError(name)


def _json_value(raw: str) -> str:
    """``raw`` re-serialized if it is one JSON value, else ``raw`` as a JSON string (never invalid JSON)."""
    try:
        return json.dumps(
            json.loads(raw, parse_constant=_reject_constant), ensure_ascii=False, allow_nan=False
        )
    except ValueError:  # JSONDecodeError, a non-standard constant, or a float overflowing to inf
        return encode_basestring(raw)


class StreamParser:
    """Incremental parser of one assistant turn.

    ``family``: ``deepseek_v4``, ``deepseek_v32`` or ``deepseek_v41``. ``thinking``: the prompt ended with
    ``<think>``, so output starts inside reasoning.

    ``tools``: the request's OpenAI-format tool list. ``None`` means *no filtering* (every call is kept; used
    for offline parsing); a list -- even empty -- declares the tools, and calls to any other name are
    dropped (logged, counted in :attr:`dropped_undeclared_calls`) unless ``keep_undeclared_tools``. The
    schemas also drive the ``arguments`` unwrap (contract scenario 40).

    ``tool_choice``: ``"auto"``, ``"required"`` (the parser cannot force a call; same as auto),
    ``"none"`` (no call is produced, markup is swallowed; counted in :attr:`suppressed_calls`) or
    ``{"type": "function", "function": {"name": ...}}`` (calls to other tools are undeclared).

    ``id_factory``: makes each call's id (default ``call_`` + 24 hex digits; the Anthropic layer passes a
    ``toolu_`` factory). Ids must be unique; the factory is called once per emitted call.

    :meth:`feed` returns the events the new text completes; :meth:`finish` flushes everything held back,
    closes an unfinished call (arguments always end as valid JSON) and ends with :class:`Finish`.
    """

    __slots__ = (
        "_call_active",
        "_call_complete",
        "_call_first",
        "_call_index",
        "_call_keys",
        "_call_name",
        "_choice_name",
        "_complete_calls",
        "_content_emitted",
        "_declared",
        "_deferred",
        "_finished",
        "_held",
        "_id_factory",
        "_in_bare",
        "_keep_undeclared",
        "_next_index",
        "_out",
        "_param_name",
        "_pmode",
        "_raw",
        "_reasoning_seen",
        "_state",
        "_suppress_all",
        "_tables",
        "_tk",
        "_tparts",
        "dropped_undeclared_calls",
        "family",
        "suppressed_calls",
    )

    def __init__(
        self,
        family: str,
        *,
        thinking: bool,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] = "auto",
        keep_undeclared_tools: bool = False,
        id_factory: Callable[[], str] | None = None,
    ) -> None:
        self.family = family
        self._tables = _lex_tables(get_grammar(family))
        self._state = _REASONING if thinking else _CONTENT
        self._held = ""
        self._out: list[Event] = []
        self._deferred: list[Event] | None = None
        self._tk = 0
        self._tparts: list[str] = []
        self._finished = False
        self._content_emitted = False
        self._reasoning_seen = thinking
        self._in_bare = False
        self._declared = _declared_tools(tools)
        self._suppress_all, self._choice_name = _tool_choice(tool_choice)
        self._keep_undeclared = keep_undeclared_tools
        self._id_factory = id_factory or _default_id
        self._next_index = 0
        self._complete_calls = 0
        self._call_active = False
        self._call_complete = False
        self._call_index = 0
        self._call_name = ""
        self._call_first = True
        self._call_keys: set[str] = set()
        self._pmode = _P_DISCARD
        self._param_name = ""
        self._raw: list[str] = []
        #: calls dropped because their tool was not declared (or not the named ``tool_choice``)
        self.dropped_undeclared_calls = 0
        #: calls swallowed because ``tool_choice`` was ``"none"``
        self.suppressed_calls = 0

    def __repr__(self) -> str:
        return (
            f"StreamParser(family={self.family!r}, state={_STATE_NAMES[self._state]}, "
            f"calls={self._next_index}, finished={self._finished})"
        )

    @property
    def state(self) -> str:
        """The current state: ``REASONING``, ``CONTENT``, ``BLOCK``, ``INVOKE``, ``PARAM`` or ``DONE``."""
        return _STATE_NAMES[self._state]

    # ------------------------------------------------------------------------------------------- public API
    def feed(self, text: str) -> list[Event]:
        """Consume the next piece of model text; return the events it completes (possibly none)."""
        if self._finished:
            raise RuntimeError("StreamParser.feed() called after finish()")
        state = self._state
        if not self._held:
            # Hot paths: a piece that cannot start or end anything becomes one delta directly.
            if state <= _CONTENT:  # REASONING or CONTENT
                if "<" not in text and "\n" not in text:
                    if not text:
                        return []
                    if state == _CONTENT:
                        self._content_emitted = True
                        return [ContentDelta(text)]
                    return [ReasoningDelta(text)]
            elif state == _PARAM:
                if "<" not in text and text[-1:] != "\n" and text:
                    mode = self._pmode
                    if mode != _P_STRING:
                        if mode != _P_DISCARD:
                            self._raw.append(text)  # JSON values are judged whole at their closer
                        return []
                    if self._deferred is None:
                        return [ToolCallArgumentsDelta(self._call_index, encode_basestring(text)[1:-1])]
            elif state == _DONE:
                return []
        out: list[Event] = []
        self._out = out
        if self._held:
            text = self._held + text
            self._held = ""
        self._lex(text, False)
        self._flush()
        return out

    def finish(self, finish_reason: str = "stop") -> list[Event]:
        """End of output. ``finish_reason`` is the engine's (``stop`` or ``length``).

        Flushes held text, closes any open call, and returns the remaining events ending with
        :class:`Finish`: ``length`` if the engine hit its token limit, else ``tool_calls`` if at least one
        call was completed (closed by ``</invoke>``, the next invoke, or the block's end), else ``stop``.
        """
        if self._finished:
            raise RuntimeError("StreamParser.finish() called twice")
        out: list[Event] = []
        self._out = out
        if self._held:
            held, self._held = self._held, ""
            self._lex(held, True)
        self._end_of_output()
        self._flush()
        self._finished = True
        reason: FinishReason
        if finish_reason == "length":
            reason = "length"
        elif self._complete_calls:
            reason = "tool_calls"
        else:
            reason = "stop"
        out.append(Finish(reason))
        return out

    # -------------------------------------------------------------------------------------------- emission
    def _text(self, kind: int, s: str) -> None:
        """Queue ``s`` on a text channel; consecutive text of one channel becomes one delta per feed."""
        if kind != self._tk:
            if self._tparts:
                self._flush()
            self._tk = kind
        self._tparts.append(s)
        if kind == _K_CONTENT and s:
            self._content_emitted = True

    def _flush(self) -> None:
        parts = self._tparts
        if not parts:
            return
        s = "".join(parts)
        parts.clear()
        if not s:
            return
        kind = self._tk
        event: Event
        if kind == _K_REASONING:
            event = ReasoningDelta(s)
        elif kind == _K_CONTENT:
            event = ContentDelta(s)
        else:
            event = ToolCallArgumentsDelta(self._call_index, s)
        (self._out if self._deferred is None else self._deferred).append(event)

    def _emit(self, event: Event) -> None:
        self._flush()
        (self._out if self._deferred is None else self._deferred).append(event)

    # ----------------------------------------------------------------------------------------------- lexer
    def _lex(self, buf: str, final: bool) -> None:
        """Run the state machine over ``buf``. Anything that might still become markup goes to ``_held``."""
        pos = 0
        n = len(buf)
        while pos < n:
            state = self._state
            if state <= _CONTENT:
                pos = self._lex_text(buf, pos, final)
            elif state == _PARAM:
                pos = self._lex_param(buf, pos, final)
            elif state == _DONE:
                return
            else:
                pos = self._lex_structure(buf, pos, final)

    def _match(self, buf: str, lt: int, final: bool) -> tuple[int, int]:
        """Classify the ``<`` at ``lt``: ``(terminal, end)``, or ``(_HOLD|_NONE|_PARTIAL, lt)``."""
        tables = self._tables[self._state]
        rest = len(buf) - lt
        if rest >= 2 and buf[lt : lt + 2] not in tables.heads:
            return _NONE, lt  # the common case of a ``<`` in prose or code
        kinds = tables.kinds
        for length in tables.lengths:
            if length <= rest:
                kind = kinds.get(buf[lt : lt + length])
                if kind is not None:
                    return kind, lt + length
        if rest < tables.maxlen and buf[lt:] in tables.prefixes:
            return (_PARTIAL if final else _HOLD), lt
        return _NONE, lt

    def _header(self, buf: str, e: int, final: bool) -> tuple[int, int, str, str | None, bool]:
        """Read the attribute header starting at ``e`` (just after an invoke/parameter opener).

        Returns ``(status, pos, name, string_attr, self_closing)`` where ``pos`` is where lexing resumes.
        """
        n = len(buf)
        m = _NAME_OPEN.match(buf, e)
        if m is None:
            p = _NAME_OPEN_PREFIX.match(buf, e)
            end = p.end() if p is not None else e
            if end == n and not final and n - e < _PRE_HEADER_CAP:
                return _HDR_HOLD, n, "", None, False
            return _HDR_REJECT, end, "", None, False
        s = m.end()
        limit = min(n, s + _HEADER_CAP)
        gt = buf.find(">", s, limit)
        lt = buf.find("<", s, limit if gt == -1 else gt)
        if lt != -1:
            # A tag starts inside the header (typically EOS after ``name="``): the header is broken.
            return _HDR_ABORT, lt, "", None, False
        if gt == -1:
            if limit == n and not final:
                return _HDR_HOLD, n, "", None, False
            return _HDR_ABORT, limit, "", None, False
        body = _HEADER_BODY.fullmatch(buf, s, gt)
        assert body is not None  # the pattern matches any string
        return _HDR_OK, gt + 1, body.group("name"), body.group("string"), body.group("slash") is not None

    def _lex_text(self, buf: str, pos: int, final: bool) -> int:
        """REASONING / CONTENT: text up to the next ``<`` or newline run, then one transition."""
        n = len(buf)
        kind = _K_REASONING if self._state == _REASONING else _K_CONTENT
        lt = buf.find("<", pos)
        stop = n if lt == -1 else lt
        scan = pos
        while True:
            nl = buf.find("\n", scan, stop)
            if nl == -1:
                # no newline run touches ``stop``: everything before it is plain text
                if lt == -1:
                    self._text(kind, buf[pos:])
                    return n
                if lt > pos:
                    self._text(kind, buf[pos:lt])
                nl_start = lt
                break
            k = nl + 1
            while k < stop and buf[k] == "\n":
                k += 1
            if k < stop:
                scan = k  # newlines inside text: keep scanning, release everything in one slice
                continue
            # Up to two newlines right before a ``<`` or the end of input may be the blank line that
            # precedes a block: keep them aside until we know.
            cut = max(nl, stop - 2)
            if cut > pos:
                self._text(kind, buf[pos:cut])
            if lt == -1:
                if final:
                    self._text(kind, buf[cut:])
                else:
                    self._held = buf[cut:]
                return n
            nl_start = cut
            break

        term, e = self._match(buf, lt, final)
        newlines = buf[nl_start:lt]
        if term == _HOLD:
            self._held = buf[nl_start:]
            return n
        if term == _NONE:
            self._text(kind, buf[nl_start : lt + 1])
            return lt + 1
        if term == _PARTIAL:
            # Output ended inside a would-be tag. Drop it -- with the blank line that announced it -- if it
            # already shows the special-token bar (I1); a bare ``<`` or ``</th`` is ordinary text.
            if _MARKER not in buf[lt:]:
                self._text(kind, buf[nl_start:])
            return n
        return self._on_text_terminal(buf, Terminal(term), lt, e, newlines, kind, final)

    def _on_text_terminal(
        self, buf: str, term: Terminal, lt: int, e: int, newlines: str, kind: int, final: bool
    ) -> int:
        if term == _T.THINK_CLOSE:
            self._text(kind, newlines)
            if self._state == _REASONING:
                self._flush()
                self._state = _CONTENT
            # A stray ``</think>`` in content is dropped (scenario 7).
            return e
        if term == _T.THINK_OPEN:
            if self._state == _CONTENT and not self._content_emitted and not self._reasoning_seen:
                # Chat mode, the model opened reasoning itself before any content (scenario 6).
                self._reasoning_seen = True
                self._state = _REASONING
                return e
            self._text(kind, newlines)  # nested / late ``<think>``: dropped, never reopens reasoning
            return e
        if term == _T.EOS:
            self._text(kind, newlines)
            self._end_of_output()
            return len(buf)
        if term == _T.BLOCK_OPEN:
            # The blank line before the block belongs to the format, not to the text (scenario 15).
            self._flush()
            self._state = _BLOCK
            self._in_bare = False
            return e
        if term == _T.INVOKE_OPEN or term == _T.PARAM_OPEN:
            status, pos, name, _string, self_closing = self._header(buf, e, final)
            if status == _HDR_HOLD:
                self._held = buf[lt - len(newlines) :]
                return len(buf)
            if status == _HDR_REJECT:
                # An opener not followed by `` name="``: prose (scenario 11), unless output ended in the
                # middle of it.
                if final and pos == len(buf):
                    self._text(kind, newlines)
                else:
                    self._text(kind, newlines + buf[lt:pos])
                return pos
            if status == _HDR_ABORT:
                return pos  # committed markup with a broken header: dropped, stay in the text state
            if term == _T.PARAM_OPEN:
                self._text(kind, newlines)
                return pos  # a parameter tag outside any invoke: the tag is dropped, its value stays text
            # A bare invoke without a block opener (scenario 32): its events wait for its ``</invoke>``
            # so that an invoke that is never closed leaves no call behind (scenario 33).
            self._flush()
            self._in_bare = True
            self._state = _BLOCK
            self._open_invoke(name, self_closing)
            return pos
        # A closer with no opener is markup all the same: drop it (I1).
        self._text(kind, newlines)
        return e

    def _lex_structure(self, buf: str, pos: int, final: bool) -> int:
        """BLOCK / INVOKE: filler between tags (newlines, stray text) is ignored."""
        lt = buf.find("<", pos)
        if lt == -1:
            return len(buf)
        term, e = self._match(buf, lt, final)
        if term == _HOLD:
            self._held = buf[lt:]
            return len(buf)
        if term in (_NONE, _PARTIAL):
            return lt + 1
        term = Terminal(term)
        in_invoke = self._state == _INVOKE
        if term == _T.EOS:
            self._end_of_output()
            return len(buf)
        if term == _T.BLOCK_CLOSE:
            if in_invoke:
                self._close_invoke(complete=True)
            self._state = _DONE
            return len(buf)
        if term == _T.INVOKE_CLOSE:
            self._close_invoke(complete=True)
            return e
        if term == _T.BLOCK_OPEN:
            return e  # a repeated block opener adds nothing
        if term == _T.INVOKE_OPEN:
            status, p, name, _string, self_closing = self._header(buf, e, final)
            if status == _HDR_HOLD:
                self._held = buf[lt:]
                return len(buf)
            if status == _HDR_REJECT:
                return p
            if in_invoke:
                # A new invoke closes the open one (scenario 28).
                self._close_invoke(complete=True)
            if status == _HDR_OK:
                self._open_invoke(name, self_closing)
            return p
        # PARAM_OPEN (only reachable in INVOKE)
        status, p, name, string_attr, self_closing = self._header(buf, e, final)
        if status == _HDR_HOLD:
            self._held = buf[lt:]
            return len(buf)
        if status == _HDR_OK:
            self._open_param(name, string_attr)
            if self_closing:
                self._close_param()
        return p

    def _lex_param(self, buf: str, pos: int, final: bool) -> int:
        """PARAM: the value streams until a DSML tag or EOS."""
        n = len(buf)
        lt = buf.find("<", pos)
        if lt == -1:
            if final or buf[-1] != "\n":
                self._value(buf[pos:])
                return n
            # A trailing newline may be the separator before an unclosed parameter's successor
            # (scenario 27), so it waits one feed.
            if n - 1 > pos:
                self._value(buf[pos : n - 1])
            self._held = "\n"
            return n
        nl_start = lt - 1 if lt > pos and buf[lt - 1] == "\n" else lt
        if nl_start > pos:
            self._value(buf[pos:nl_start])
        term, e = self._match(buf, lt, final)
        if term == _HOLD:
            self._held = buf[nl_start:]
            return n
        if term == _NONE:
            self._value(buf[nl_start : lt + 1])
            return lt + 1
        if term == _PARTIAL:
            # Output ended inside a would-be tag: drop it and the newline before it if it shows the
            # special-token bar (I1), else it was value text.
            if _MARKER not in buf[lt:]:
                self._value(buf[nl_start:])
            return n
        term = Terminal(term)
        newline = buf[nl_start:lt]
        if term == _T.PARAM_CLOSE:
            self._value(newline)  # the value is verbatim up to its closer (scenario 22)
            self._close_param()
            return e
        if term == _T.EOS:
            self._value(newline)
            self._end_of_output()
            return n
        if term == _T.PARAM_OPEN or term == _T.INVOKE_OPEN:
            status, p, name, string_attr, self_closing = self._header(buf, e, final)
            if status == _HDR_HOLD:
                self._held = buf[nl_start:]
                return n
            if status == _HDR_REJECT:
                # Not a tag: value text -- unless output ended in the middle of the opener (I1).
                if not (final and p == n):
                    self._value(buf[nl_start:p])
                return p
            # A new tag closes the parameter whose closer is missing (scenarios 27, 28); the newline
            # before it was the separator, not data.
            self._close_param()
            if term == _T.PARAM_OPEN:
                if status == _HDR_OK:
                    self._open_param(name, string_attr)
                    if self_closing:
                        self._close_param()
                return p
            self._close_invoke(complete=True)
            if status == _HDR_OK:
                self._open_invoke(name, self_closing)
            return p
        # INVOKE_CLOSE or BLOCK_CLOSE with the parameter closer missing
        self._close_param()
        self._close_invoke(complete=True)
        if term == _T.BLOCK_CLOSE:
            self._state = _DONE
            return n
        return e

    # ------------------------------------------------------------------------------------ call assembly
    def _allowed(self, name: str) -> bool:
        if self._suppress_all:
            self.suppressed_calls += 1
            return False
        declared = self._declared
        if (self._choice_name is None or name == self._choice_name) and (
            declared is None or name in declared
        ):
            return True
        if self._keep_undeclared:
            return True
        self.dropped_undeclared_calls += 1
        logger.info("dropped a call to undeclared tool %r", name)
        return False

    def _open_invoke(self, name: str, self_closing: bool) -> None:
        self._state = _INVOKE
        self._call_active = self._allowed(name)
        if self._call_active:
            self._flush()
            if self._in_bare:
                self._deferred = []
            self._call_index = self._next_index
            self._next_index += 1
            self._call_name = name
            self._call_first = True
            self._call_keys = set()
            self._emit(ToolCallStart(self._call_index, self._id_factory(), name))
        if self_closing:
            self._close_invoke(complete=True)

    def _close_invoke(self, *, complete: bool) -> None:
        self._state = _BLOCK
        if not self._call_active:
            return
        self._call_active = False
        self._text(_K_ARGS, "{}" if self._call_first else "}")
        self._emit(ToolCallEnd(self._call_index))
        deferred = self._deferred
        if deferred is not None:
            self._deferred = None
            if not complete:
                # A bare invoke that never closed is prose that went wrong, not a call (scenario 33).
                self._next_index -= 1
                return
            self._out.extend(deferred)
        if complete:
            self._complete_calls += 1

    def _open_param(self, name: str, string_attr: str | None) -> None:
        self._state = _PARAM
        self._param_name = name
        if not self._call_active or name in self._call_keys:
            # Dropped call, or a repeated name: the first value wins because it may already be streamed.
            self._pmode = _P_DISCARD
            return
        self._raw = []
        if string_attr != "true" and name == "arguments" and self._call_first and self._unwrap_candidate():
            self._pmode = _P_UNWRAP
            return
        self._key(name)
        if string_attr == "true":
            self._pmode = _P_STRING
            self._text(_K_ARGS, '"')
        else:
            self._pmode = _P_RAW

    def _unwrap_candidate(self) -> bool:
        declared = self._declared
        if declared is None:
            return False
        schema = declared.get(self._call_name)
        if not isinstance(schema, Mapping):
            return False
        properties = schema.get("properties")
        return not (isinstance(properties, Mapping) and "arguments" in properties)

    def _key(self, name: str) -> None:
        self._text(_K_ARGS, ("{" if self._call_first else ", ") + encode_basestring(name) + ": ")
        self._call_first = False
        self._call_keys.add(name)

    def _value(self, s: str) -> None:
        if not s:
            return
        mode = self._pmode
        if mode == _P_STRING:
            self._text(_K_ARGS, encode_basestring(s)[1:-1])
        elif mode != _P_DISCARD:
            self._raw.append(s)

    def _close_param(self) -> None:
        self._state = _INVOKE
        mode = self._pmode
        self._pmode = _P_DISCARD
        if mode == _P_STRING:
            self._text(_K_ARGS, '"')
        elif mode == _P_RAW:
            self._text(_K_ARGS, _json_value("".join(self._raw)))
        elif mode == _P_UNWRAP:
            raw = "".join(self._raw)
            try:
                obj = json.loads(raw, parse_constant=_reject_constant)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                # The model wrapped the whole argument object in one ``arguments`` parameter: use it as
                # the arguments themselves (scenario 40). Later parameters still append after it.
                if obj:
                    self._text(_K_ARGS, "{" + json.dumps(obj, ensure_ascii=False)[1:-1])
                    self._call_first = False
                    self._call_keys.update(obj)
            else:
                self._key(self._param_name)
                self._text(_K_ARGS, _json_value(raw))
        self._raw = []

    def _end_of_output(self) -> None:
        """EOS, or the end of input: close what is open; nothing after this point is parsed."""
        state = self._state
        if state == _PARAM:
            self._close_param()
            state = _INVOKE
        if state == _INVOKE:
            # Closed as valid JSON but not complete: it does not make the finish reason ``tool_calls``.
            self._close_invoke(complete=False)
        self._flush()
        self._state = _DONE


def _declared_tools(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any] | None:
    if tools is None:
        return None
    declared: dict[str, Any] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise RequestError(
                f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}",
                param=f"tools[{i}]",
            )
        declared[function["name"]] = function.get("parameters")
    return declared


def _tool_choice(choice: str | Mapping[str, Any]) -> tuple[bool, str | None]:
    """``(suppress_all, named_tool)`` for an OpenAI ``tool_choice`` value."""
    if choice in ("auto", "required"):
        return False, None
    if choice == "none":
        return True, None
    if isinstance(choice, Mapping):
        function = choice.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return False, function["name"]
    raise RequestError(f"tool_choice: unsupported value {choice!r}", param="tool_choice")


def parse_completion(
    text: str,
    *,
    family: str,
    thinking: bool,
    finish_reason: str = "stop",
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] = "auto",
    keep_undeclared_tools: bool = False,
) -> ParsedMessage:
    """Parse a whole completion: exactly ``feed(text)`` then ``finish(finish_reason)``, assembled.

    Never raises on malformed model output; the result follows the streaming contract.
    """
    parser = StreamParser(
        family,
        thinking=thinking,
        tools=tools,
        tool_choice=tool_choice,
        keep_undeclared_tools=keep_undeclared_tools,
    )
    events = parser.feed(text)
    events += parser.finish(finish_reason)
    return assemble_message(events)
