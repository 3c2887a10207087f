"""Pieces both DeepSeek families share: errors with paths, JSON as the reference
writes it, template compilation into segments, typed messages and tool calls, tool
schemas.

Nothing here knows a token spelling; each family passes its own table.
"""

from __future__ import annotations

import functools
import inspect
import json
import string
from collections.abc import Callable, Mapping, Sequence
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from typing import Any, NamedTuple, NoReturn, ParamSpec, Protocol

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats.segments import PromptSegment, join_segments

THINKING_MODES: tuple[str, ...] = ("chat", "thinking")


def fail(path: str, problem: str) -> NoReturn:
    """Raise :class:`FormatError` for the field at ``path`` (``messages[3].content``)."""
    raise FormatError(f"{path}: {problem}", param=path)


def check_thinking_mode(thinking_mode: object) -> None:
    if thinking_mode not in THINKING_MODES:
        fail("thinking_mode", f"must be 'chat' or 'thinking', got {thinking_mode!r}")


def _not_serializable(value: object) -> NoReturn:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def _c_encoder() -> Callable[[Any], str] | None:
    """``json.dumps(value, ensure_ascii=False)`` as one C encoder built once, or ``None``.

    ``json.dumps`` runs two Python-level wrappers (``encode``, ``iterencode``) and
    builds a new C encoder per call; for a typical tool-call argument that setup cost
    more than the encoding. This is the same C encoder with the same settings (default
    separators, non-ASCII kept, NaN allowed), built once. No circular-reference table
    (``markers=None``): decoded JSON cannot be cyclic, and a cyclic Python object ends
    in RecursionError, which :func:`to_json` reports. ``c_make_encoder`` is a CPython
    internal, so the result is checked against ``json.dumps`` once; on any difference
    the plain encoder is used.
    """
    if c_make_encoder is None:  # pragma: no cover - CPython always has the accelerator
        return None
    try:
        # (markers, default, encoder, indent, key_sep, item_sep, sort_keys, skipkeys, allow_nan)
        settings = (None, _not_serializable, encode_basestring, None, ": ", ", ", False, False, True)
        chunks = c_make_encoder(*settings)
    except TypeError:  # pragma: no cover - a future signature change
        return None

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    probe = {"k": [1, -2.5, float("nan"), True, None, "é\n\x00", {"n": {}}]}
    try:
        same = encode(probe) == json.dumps(probe, ensure_ascii=False)
    except Exception:  # pragma: no cover
        same = False
    return encode if same else None


_encode: Callable[[Any], str] = _c_encoder() or json.JSONEncoder(ensure_ascii=False).encode


def to_json(value: Any, path: str) -> str:
    """JSON text exactly as the reference writes it.

    The reference calls ``json.dumps(value, ensure_ascii=False)``: default
    separators (``", "`` and ``": "``), non-ASCII kept, and -- a Python accident
    we keep because the fixtures pin it (``quirk:python-json``) -- ``NaN`` and
    ``Infinity`` written bare.
    """
    try:
        return _encode(value)
    except (TypeError, ValueError, RecursionError) as exc:
        fail(path, f"is not JSON-serializable ({exc})")


scan_json = json.JSONDecoder().scan_once
"""The C scanner behind ``json.loads``: ``scan_json(text, 0) -> (value, end)``, or
``StopIteration`` when no JSON value starts at 0. No leading/trailing whitespace,
BOM or type handling: callers fall back to ``json.loads`` unless ``end == len(text)``."""


def from_json(text: str) -> Any:
    """``json.loads(text)``, with the usual case (a JSON string, no surrounding
    whitespace) done by the C scanner directly.

    ``json.loads`` wraps that scanner in two Python-level calls and two regex
    matches; for short argument strings the wrapping is most of the time. Whatever
    the fast path does not fully accept (leading or trailing whitespace, a BOM, not
    a ``str``, invalid text) goes through ``json.loads`` itself, so results and
    errors are exactly ``json.loads``'.
    """
    if text.__class__ is str:
        try:
            value, end = scan_json(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return value
    return json.loads(text)


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


# --- building the prompt --------------------------------------------------------------------
#
# Why this shape: a 3000-message agent prompt is ~30 000 segments, about half of them
# special tokens. Creating one object per piece and merging neighbouring text in a
# Python loop cost ~15 µs per message. Instead, a renderer appends plain ``str`` pieces
# to one list and, for each special token, a one-character *marker* to that list plus
# the token's pre-built segment to a second list (C-level appends, no allocation).
# At the end the pieces are joined once and split at the marker -- both in C -- which
# gives exactly the maximal plain runs between special tokens; the plain segments are
# then built from the runs and slotted between the specials by slice assignment, in C.
#
# The marker must not occur in request text. It is NUL first (latin-1, so an ASCII
# prompt stays a compact one-byte string through the join and split); when the split
# finds more markers than specials were written, some request text contains it, and
# :func:`build_segments` renders again with a character the first attempt's text
# does not contain.

_FIRST_MARK = "\x00"
_SPARE_MARKS = "".join(map(chr, (*range(1, 9), *range(0xFDD0, 0xFDF0))))
"""Tried next: other C0 controls, then the Unicode noncharacters U+FDD0..U+FDEF
(never assigned, so vanishingly rare in text)."""


class _PlainRuns(dict[str, "PromptSegment | None"]):
    """``run text -> plain segment`` for short runs; builds (and maybe keeps) on a miss.

    Most short runs are template glue repeated in every tool call (``parameter>\\n<``,
    ``tool_calls>\\n<``, ``invoke name="get_weather">\\n<``); a C-level dict hit is
    cheaper than building a segment. The empty run maps to ``None`` so that it is
    filtered out of the output. Bounded: when full it is cleared, so it follows
    what current traffic repeats. (Keeping long runs too -- a conversation's history
    repeats across its requests -- measured no faster: hashing the fresh run strings
    costs about what building their segments does.)
    """

    __slots__ = ()

    def __missing__(self, text: str) -> PromptSegment:
        segment = _new_tuple(PromptSegment, (text, False))
        if len(text) <= _SHORT_RUN:
            if len(self) >= _RUNS_MAX:
                self.clear()
                self[""] = None
            self[text] = segment
        return segment


_new_tuple = tuple.__new__
_SHORT_RUN = 64
_RUNS_MAX = 8192
_RUNS = _PlainRuns({"": None})
_run_segment = _RUNS.__getitem__


class PromptBuilder:
    """Collects one prompt: plain text pieces and special tokens, in order.

    Renderers append text with ``parts.append(text)`` and a special token with
    ``parts.append(mark); specials.append(segment)`` (lists and marker read into
    locals in hot loops). Template glue may embed ``mark`` inside a constant string
    (``"</" + mark + "parameter>"``) as long as one segment per embedded marker is
    added to ``specials``, in order. :meth:`segments` turns this into the output.
    """

    __slots__ = ("mark", "parts", "specials")

    def __init__(self, mark: str = _FIRST_MARK) -> None:
        self.mark = mark
        self.parts: list[str] = []
        self.specials: list[PromptSegment] = []

    def special(self, segment: PromptSegment) -> None:
        """Append one special token (for cold paths; hot paths inline the two appends)."""
        self.parts.append(self.mark)
        self.specials.append(segment)

    def text(self) -> str:
        """Everything appended, markers included."""
        return "".join(self.parts)

    def segments(self, text: str) -> list[PromptSegment] | None:
        """The segments of ``text`` (:meth:`text`): maximal non-empty plain runs
        between the special tokens.

        ``None`` when ``text`` holds more markers than specials were written, i.e.
        request text contains the marker character.
        """
        specials = self.specials
        runs = text.split(self.mark)
        if len(runs) != len(specials) + 1:
            return None
        # Runs at even places, specials at odd ones; empty runs map to None and are dropped.
        segments: list[PromptSegment | None] = [None] * (2 * len(runs) - 1)
        segments[0::2] = map(_run_segment, runs)
        segments[1::2] = specials
        return list(filter(None, segments))  # type: ignore[arg-type]


def build_segments(render: Callable[[PromptBuilder], None]) -> list[PromptSegment]:
    """Run ``render`` into a :class:`PromptBuilder` and return its segments.

    Renders again with another marker if the request text contains the current one
    (``render`` must be repeatable). Only a prompt containing every candidate
    character fails.
    """
    mark = _FIRST_MARK
    while True:
        builder = PromptBuilder(mark)
        render(builder)
        text = builder.text()
        segments = builder.segments(text)
        if segments is not None:
            return segments
        mark = next((c for c in _SPARE_MARKS if c not in text), "")
        if not mark:
            fail("messages", "the request text uses every character this renderer can reserve as a marker")


class Slot(str):
    """A data slot of a compiled template (a ``str`` subclass, so never mistaken for text)."""


TemplatePart = str | PromptSegment | Slot
"""Plain text, a special-token segment, or a slot for request text."""


def compile_template(text: str, tokens: Mapping[str, str]) -> tuple[TemplatePart, ...]:
    """Split ``text`` (``str.format`` syntax) into parts once, at import time.

    A field naming a key of ``tokens`` becomes a ``special`` segment holding that
    spelling: the reference writes these spellings into its template prose and then
    tokenizes the whole prompt with special tokens on, so they are real tokens
    there too. Any other field is a :class:`Slot` for :func:`expand_template` to fill
    with request text (never special). Literal prose stays plain text.
    """
    parts: list[TemplatePart] = []
    for literal, field, _spec, _conv in string.Formatter().parse(text):
        if literal:
            parts.append(literal)
        if field is None:
            continue
        if field in tokens:
            parts.append(PromptSegment(tokens[field], special=True))
        else:
            parts.append(Slot(field))
    return tuple(parts)


def expand_template(out: PromptBuilder, parts: Sequence[TemplatePart], **slots: str) -> None:
    """Append a compiled template to ``out``, filling slots with plain text."""
    for part in parts:
        if part.__class__ is PromptSegment:
            out.special(part)  # type: ignore[arg-type]
        elif part.__class__ is Slot:
            out.parts.append(slots[part])  # type: ignore[index]
        else:
            out.parts.append(part)  # type: ignore[arg-type]


_P = ParamSpec("_P")


def joined(render: Callable[_P, list[PromptSegment]]) -> Callable[_P, str]:
    """``encode_messages`` from a ``render_prompt_segments``: the same arguments, the
    prompt string (``join_segments`` of the segments) as the result.

    Used in a class body (``encode_messages = joined(render_prompt_segments)``), so
    the two entry points of a family can never take different arguments. The result
    calls ``render`` itself, not ``self.render_prompt_segments`` (a subclass that
    overrides ``render_prompt_segments`` writes the line again), and reports
    ``render``'s signature, with ``-> str``, to ``inspect`` and type checkers alike.
    The extra call costs well under a microsecond per render.
    """

    @functools.wraps(render)
    def encode_messages(*args: _P.args, **kwargs: _P.kwargs) -> str:
        return join_segments(render(*args, **kwargs))

    owner = getattr(render, "__qualname__", "").rpartition(".")[0]
    encode_messages.__name__ = "encode_messages"
    encode_messages.__qualname__ = f"{owner}.encode_messages" if owner else "encode_messages"
    encode_messages.__doc__ = "The prompt string: ``join_segments(render_prompt_segments(...))``."
    encode_messages.__annotations__ = {**getattr(render, "__annotations__", {}), "return": "str"}
    encode_messages.__signature__ = inspect.signature(render).replace(  # type: ignore[attr-defined]
        return_annotation="str"
    )
    return encode_messages


# --- typed request pieces -------------------------------------------------------------------


class Message(Protocol):
    """What the shared rendering pieces read of a family's typed message (a named tuple)."""

    @property
    def role(self) -> Any: ...

    @property
    def raw(self) -> Mapping[str, Any]:
        """The caller's dict, read-only."""
        ...

    @property
    def path(self) -> str:
        """``messages[3]``, built on demand (for errors)."""
        ...


def last_user_index(msgs: Sequence[Message]) -> int:
    """Index of the last user or developer message, ``-1`` if none.

    Renderers call it a fixed number of times per render: the reference searches
    again for every message it renders, which is quadratic on long agent loops.
    """
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role in ("user", "developer"):
            return i
    return -1


def field_text(m: Message, key: str, value: Any) -> str:
    """Slow path of the renderers' inline ``value.__class__ is str`` checks of
    ``m.raw[key]``: a ``str`` subclass passes, anything else is a :class:`FormatError`
    naming the field (see :func:`checked_text`)."""
    return checked_text(value, f"{m.path}.{key}")


def item_path(source: str, index: int) -> str:
    """``messages[3]``: paths are built only when an error needs one (building one per
    message and tool call was a measurable share of a long render)."""
    return f"{source}[{index}]"


class ToolCall(NamedTuple):
    """One historical tool call, as the reference reads it from the OpenAI shape.

    (A named tuple rather than a dataclass, and built with ``tuple.__new__``: one is
    built per call per render.)
    """

    name: str
    arguments: Any
    """The ``function.arguments`` value as sent (normally a JSON string)."""
    call_id: Any
    where: tuple[str, int, int]
    """``(source, message index, call index)``; see :attr:`path`."""

    @property
    def path(self) -> str:
        """``messages[3].tool_calls[0]``."""
        source, index, call = self.where
        return f"{source}[{index}].tool_calls[{call}]"


NO_CALLS: list[ToolCall] = []
"""The tool calls of a message without any (shared by every such message, never mutated)."""


def read_tool_calls(raw: Any, source: str, index: int) -> list[ToolCall]:
    """Type ``source[index].tool_calls``; a falsy value means no calls (reference: ``if tool_calls``)."""
    if not raw:
        return []
    if raw.__class__ is not list and not isinstance(raw, list):
        fail(f"{item_path(source, index)}.tool_calls", f"must be a list of tool calls, got {type_name(raw)}")
    calls: list[ToolCall] = []
    for i, call in enumerate(raw):
        if call.__class__ is not dict and not isinstance(call, dict):
            fail(f"{item_path(source, index)}.tool_calls[{i}]", f"must be an object, got {type_name(call)}")
        function = call.get("function")
        if function.__class__ is not dict or "name" not in function or "arguments" not in function:
            _check_function(function, f"{item_path(source, index)}.tool_calls[{i}]")
        name = function["name"]
        if name.__class__ is not str:
            if name is None:
                # Reference quirk (not tagged as one in the fixtures): it formats the
                # name with str(), so a null name is written as the text "None".
                name = "None"
            elif not isinstance(name, str):
                path = f"{item_path(source, index)}.tool_calls[{i}].function.name"
                fail(path, f"must be a string, got {type_name(name)}")
        call_id = call.get("id") or function.get("id", "")
        calls.append(_new_tuple(ToolCall, (name, function["arguments"], call_id, (source, index, i))))
    return calls


def _check_function(function: Any, where: str) -> None:
    """The slow path of :func:`read_tool_calls`: raise for a malformed ``function``."""
    if not isinstance(function, dict):
        fail(f"{where}.function", "is required and must be an object")
    if "name" not in function:
        fail(f"{where}.function.name", "is required")
    if "arguments" not in function:
        fail(f"{where}.function.arguments", "is required")


def read_tool_schemas(raw: Any, path: str) -> list[Any]:
    """Type a message's ``tools`` (OpenAI shape) into the ``function`` objects the prompt lists."""
    if not isinstance(raw, list):
        fail(path, f"must be a list of tools, got {type_name(raw)}")
    functions: list[Any] = []
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or "function" not in tool:
            fail(f"{path}[{i}].function", "is required (tools use the OpenAI shape)")
        functions.append(tool["function"])
    return functions


def checked_text(value: Any, path: str) -> str:
    """``value`` if it is a string, else :class:`FormatError` at ``path``.

    The slow path behind the renderers' inline ``value.__class__ is str`` checks (a
    ``str`` subclass passes here). The reference would write ``None`` or a Python
    repr for anything else (``quirk:none-rendered``, ``quirk:python-repr``); a model
    never saw such text in training, so it is refused.
    """
    if not isinstance(value, str):
        fail(path, f"must be a string, got {type_name(value)}")
    return value
