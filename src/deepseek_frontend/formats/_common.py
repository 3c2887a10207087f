"""Pieces both DeepSeek families share: errors with paths, JSON as the reference
writes it, template compilation into segments, typed tool calls and tool schemas.

Nothing here knows a token spelling; each family passes its own table.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats.segments import PromptSegment

THINKING_MODES: tuple[str, ...] = ("chat", "thinking")


def fail(path: str, problem: str) -> NoReturn:
    """Raise :class:`FormatError` for the field at ``path`` (``messages[3].content``)."""
    raise FormatError(f"{path}: {problem}", param=path)


def check_thinking_mode(thinking_mode: object) -> None:
    if thinking_mode not in THINKING_MODES:
        fail("thinking_mode", f"must be 'chat' or 'thinking', got {thinking_mode!r}")


_ENCODER = json.JSONEncoder(ensure_ascii=False)


def to_json(value: Any, path: str) -> str:
    """JSON text exactly as the reference writes it.

    The reference calls ``json.dumps(value, ensure_ascii=False)``: default
    separators (``", "`` and ``": "``), non-ASCII kept, and -- a Python accident
    we keep because the fixtures pin it (``quirk:python-json``) -- ``NaN`` and
    ``Infinity`` written bare. Same encoder settings, minus ``dumps``' per-call setup.
    """
    try:
        return _ENCODER.encode(value)
    except (TypeError, ValueError) as exc:
        fail(path, f"is not JSON-serializable ({exc})")


def type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


# --- segments under construction ------------------------------------------------------------

Item = str | PromptSegment
"""What renderers append while building: a ``str`` is plain text, a ``PromptSegment`` a
special-token constant. :func:`merge_plain` turns the run into segments once, so a
message costs a few list appends instead of one segment object per template piece."""


_SHORT_RUN = 24
"""Plain runs up to this many characters are shared from :data:`_RUN_CACHE`."""
_RUN_CACHE_SIZE = 4096
_RUN_CACHE: dict[str, PromptSegment] = {}
"""Bounded (stops growing at ``_RUN_CACHE_SIZE``): segments are immutable, and most short
runs are template glue such as ``parameter>\\n<`` repeated in every tool call. Building a
frozen-dataclass segment costs far more than this lookup."""


def _new_plain(text: str) -> PromptSegment:
    segment = PromptSegment(text)
    if len(text) <= _SHORT_RUN and len(_RUN_CACHE) < _RUN_CACHE_SIZE:
        _RUN_CACHE[text] = segment
    return segment


def merge_plain(items: list[Item]) -> list[PromptSegment]:
    """Segments for ``items``: each run of plain strings becomes one non-special segment.

    So two plain segments are never adjacent and none is empty: the text between two
    special tokens is one piece, as when the reference's prompt string is tokenized
    (splitting it could change the token ids at the split).

    This loop runs once per special token of the prompt, so it is kept lean: the
    specials are found by a comprehension, and short runs come from the cache.
    """
    special = PromptSegment
    cached = _RUN_CACHE.get
    segments: list[PromptSegment] = []
    append = segments.append
    start = 0
    for i in [i for i, item in enumerate(items) if item.__class__ is special]:
        if i != start:
            text = items[start] if i - start == 1 else "".join(items[start:i])  # type: ignore[arg-type]
            if text:
                append(cached(text) or _new_plain(text))  # type: ignore[arg-type]
        append(items[i])  # type: ignore[arg-type]
        start = i + 1
    if start < len(items) and (text := "".join(items[start:])):  # type: ignore[arg-type]
        append(cached(text) or _new_plain(text))
    return segments


class Slot(str):
    """A data slot of a compiled template (a ``str`` subclass, so never mistaken for text)."""


TemplatePart = Item | Slot


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


def expand_template(out: list[Item], parts: Sequence[TemplatePart], **slots: str) -> None:
    """Append a compiled template to ``out``, filling slots with plain text."""
    for part in parts:
        out.append(slots[part] if part.__class__ is Slot else part)  # type: ignore[index]


# --- typed request pieces -------------------------------------------------------------------


class ToolCall(NamedTuple):
    """One historical tool call, as the reference reads it from the OpenAI shape.

    (A named tuple rather than a frozen dataclass: one is built per call per render.)
    """

    name: str
    arguments: Any
    """The ``function.arguments`` value as sent (normally a JSON string)."""
    call_id: Any
    path: str


def read_tool_calls(raw: Any, path: str) -> list[ToolCall]:
    """Type ``assistant.tool_calls``; a falsy value means no calls (reference: ``if tool_calls``)."""
    if not raw:
        return []
    if not isinstance(raw, list):
        fail(path, f"must be a list of tool calls, got {type_name(raw)}")
    calls: list[ToolCall] = []
    for i, call in enumerate(raw):
        where = f"{path}[{i}]"
        if not isinstance(call, dict):
            fail(where, f"must be an object, got {type_name(call)}")
        function = call.get("function")
        if not isinstance(function, dict):
            fail(f"{where}.function", "is required and must be an object")
        if "name" not in function:
            fail(f"{where}.function.name", "is required")
        if "arguments" not in function:
            fail(f"{where}.function.arguments", "is required")
        name = function["name"]
        if name is None:
            # Reference quirk (not tagged as one in the fixtures): it formats the
            # name with str(), so a null name is written as the text "None".
            name = "None"
        elif not isinstance(name, str):
            fail(f"{where}.function.name", f"must be a string, got {type_name(name)}")
        call_id = call.get("id") or function.get("id", "")
        calls.append(ToolCall(name, function["arguments"], call_id, where))
    return calls


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


def optional_text(raw: dict[str, Any], key: str, path: str) -> str:
    """A text field the reference writes as ``value or ""``: absent, null and "" all give ""."""
    value = raw.get(key)
    if not value:
        return ""
    if not isinstance(value, str):
        # The reference would write repr(value) (``quirk:python-repr``); we refuse.
        fail(f"{path}.{key}", f"must be a string, got {type_name(value)}")
    return value


def required_text(value: Any, path: str) -> str:
    """A text field the reference writes with str(): anything but a string is refused.

    The reference would write ``None`` or a list's repr here (``quirk:none-rendered``,
    ``quirk:python-repr``); a model never saw such text in training, so we reject it.
    """
    if not isinstance(value, str):
        fail(path, f"must be a string, got {type_name(value)}")
    return value
