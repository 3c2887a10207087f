"""DSML, the XML-like tool-call markup both families write and read.

Rendering writes historical calls into the prompt; parsing is the strict one-shot
reading of one raw completion with the same contract as DeepSeek's reference
``parse_message_from_completion_text``: exact texts, exact failures, no repair.
The streaming parser lives in ``parsing/``; this one is the oracle it is checked
against.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats._common import PromptBuilder, ToolCall, fail, from_json, scan_json, to_json
from deepseek_frontend.formats.segments import PromptSegment


class _Glue(NamedTuple):
    """The constant text between DSML values, with the builder's marker embedded
    where each ``｜DSML｜`` token goes (``M`` below); built once per marker."""

    first_invoke: str  # \n\n<M{block}>\n<Minvoke name="
    next_invoke: str  # \n<Minvoke name="
    head_end: str  # ">\n
    first_param: str  # <Mparameter name="
    next_param: str  # \n<Mparameter name="
    string_true: str  # " string="true">
    string_false: str  # " string="false">
    param_close: str  # </Mparameter>
    invoke_close: str  # \n</Minvoke>
    block_close: str  # \n</M{block}>


@dataclass(frozen=True, slots=True)
class DsmlSpelling:
    """The spellings DSML uses in one family."""

    bos: str
    eos: str
    think_start: str
    think_end: str
    dsml: str
    block: str
    """Name of the wrapping element: ``tool_calls`` (V4), ``function_calls`` (V3.2), `` calls`` (V4.1)."""
    invoke: str = "invoke"
    """Name of the call element (V4.1: `` invoke``, with its leading space)."""
    parameter: str = "parameter"
    """Name of the parameter element (V4.1: `` parameter``)."""
    segment: PromptSegment = field(init=False)
    """The shared special segment of ``dsml`` (built once, reused by every render)."""
    _glue: dict[str, _Glue] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segment", PromptSegment(self.dsml, special=True))
        object.__setattr__(self, "_glue", {})

    def glue(self, mark: str) -> _Glue:
        """The DSML glue for a builder marker (a handful of markers exist, so this stays small)."""
        glue = self._glue.get(mark)
        if glue is None:
            block, invoke, parameter = self.block, self.invoke, self.parameter
            glue = self._glue[mark] = _Glue(
                f'\n\n<{mark}{block}>\n<{mark}{invoke} name="',
                f'\n<{mark}{invoke} name="',
                '">\n',
                f'<{mark}{parameter} name="',
                f'\n<{mark}{parameter} name="',
                '" string="true">',
                '" string="false">',
                f"</{mark}{parameter}>",
                f"\n</{mark}{invoke}>",
                f"\n</{mark}{block}>",
            )
        return glue


def dsml_example(block: str, call_name: str, invoke: str = "invoke", parameter: str = "parameter") -> str:
    """The two-call DSML example every family's tools prose shows, as template text.

    ``{dsml}`` fields stand for the family's DSML spelling (``compile_template`` makes
    them special segments); ``block``, ``invoke`` and ``parameter`` are the element
    names (V4.1 spells them with a leading space) and ``$<call_name>`` /
    ``$<call_name>2`` the placeholder call names the family's prose uses. Ends with a
    newline.
    """
    return (
        f"<{{dsml}}{block}>\n"
        f'<{{dsml}}{invoke} name="${call_name}">\n'
        f'<{{dsml}}{parameter} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE'
        f"</{{dsml}}{parameter}>\n"
        "...\n"
        f"</{{dsml}}{invoke}>\n"
        f'<{{dsml}}{invoke} name="${call_name}2">\n'
        "...\n"
        f"</{{dsml}}{invoke}>\n"
        f"</{{dsml}}{block}>\n"
    )


ArgumentsReader = Callable[[ToolCall], dict[str, Any]]
_NOT_SCANNED = (None, -1)


def render_tool_calls(
    out: PromptBuilder, calls: list[ToolCall], sp: DsmlSpelling, read_arguments: ArgumentsReader
) -> None:
    """Append ``\\n\\n<DSML{block}>\\n<invoke ...>...\\n</DSML{block}>`` for ``calls``.

    Names, keys and values are request text, so they are plain text even when
    they contain a DSML spelling; only the renderer's own ``｜DSML｜`` is special.
    A string value is written raw with ``string="true"``; anything else as JSON
    with ``string="false"``.

    The hot path of a long agent prompt (about ten ``｜DSML｜`` tokens per call): the
    constant glue between values carries the builder's marker inline, so a parameter
    is one tuple extend, and the ``｜DSML｜`` segments go to ``out.specials`` in one
    step at the end, counted (two per element: block, each invoke, each parameter).
    """
    g = sp.glue(out.mark)
    next_param, string_true, string_false, param_close = (
        g.next_param,
        g.string_true,
        g.string_false,
        g.param_close,
    )
    parts = out.parts
    count = 2
    invoke = g.first_invoke
    for call in calls:
        # The usual arguments (a JSON object, as a string with no surrounding space)
        # decoded by the C scanner directly; anything else goes through the family's
        # reader, which owns the rules and the errors.
        raw = call.arguments
        try:
            arguments, end = scan_json(raw, 0) if raw.__class__ is str else _NOT_SCANNED
        except Exception:  # not JSON at 0 (StopIteration), invalid, too deep: the reader decides
            arguments, end = _NOT_SCANNED
        if arguments.__class__ is not dict or end != len(raw):
            arguments = read_arguments(call)
        parts += (invoke, call.name, g.head_end)
        invoke = g.next_invoke
        param = g.first_param
        for key, value in arguments.items():
            if isinstance(value, str):
                parts += (param, key, string_true, value, param_close)
            else:
                parts += (param, key, string_false, scalar_json(value, call), param_close)
            param = next_param
        parts.append(g.invoke_close)
        count += 2 + 2 * len(arguments)
    parts.append(g.block_close)
    out.specials += repeat(sp.segment, count)


def scalar_json(value: Any, call: ToolCall) -> str:
    """``json.dumps`` of an argument value, with the common scalars done directly."""
    cls = value.__class__
    if cls is int:
        return int.__repr__(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    return to_json(value, f"{call.path}.function.arguments")


# --- strict completion parsing --------------------------------------------------------------

# Both patterns end in ``$`` without MULTILINE, exactly like the reference's: ``$``
# also matches just before one trailing newline, and the contract inherits that.
_INVOKE_HEAD = re.compile(r'\s*name="(.*?)">\n$', re.DOTALL)
_PARAMETER = re.compile(r' name="(.*?)" string="(true|false)">(.*?)<$', re.DOTALL)


def _scan(text: str, pos: int, stops: tuple[str, ...]) -> tuple[int, str, str | None]:
    """Read from ``pos`` to the earliest of ``stops``.

    Returns the position after the stop, the text before it and the stop found;
    with no stop, the rest of the text and ``None``. On a tie the earlier entry of
    ``stops`` wins (no two stops used here can start at the same place).
    """
    best = len(text)
    found: str | None = None
    for stop in stops:
        at = text.find(stop, pos)
        if at != -1 and at < best:
            best, found = at, stop
    if found is None:
        return len(text), text[pos:], None
    return best + len(found), text[pos:best], found


def _parse_error(problem: str) -> FormatError:
    return FormatError(f"completion: {problem}", param="completion")


def _arguments_json(args: dict[str, tuple[str, str]]) -> str:
    # The reference builds the JSON by hand: keys and string values through
    # json.dumps, non-string values pasted verbatim (not validated, spacing kept).
    items = []
    for key, (value, is_str) in args.items():
        items.append(
            f"{to_json(key, 'completion')}: {to_json(value, 'completion') if is_str == 'true' else value}"
        )
    return "{" + ", ".join(items) + "}"


def _parse_calls(text: str, pos: int, sp: DsmlSpelling) -> tuple[int, str | None, list[dict[str, Any]]]:
    invoke_open = f"<{sp.dsml}{sp.invoke}"
    invoke_close = f"</{sp.dsml}{sp.invoke}"
    param_open = f"<{sp.dsml}{sp.parameter}"
    param_close = f"/{sp.dsml}{sp.parameter}"
    block_close = f"</{sp.dsml}{sp.block}>"
    calls: list[dict[str, Any]] = []
    stop: str | None = None
    while pos < len(text):
        pos, gap, stop = _scan(text, pos, (invoke_open, block_close))
        if gap != ">\n":
            raise _parse_error(f"expected '>\\n' between tool-call elements, got {gap!r}")
        if stop == block_close:
            break
        if stop is None:
            raise _parse_error("tool-call block is not closed")
        pos, head, stop = _scan(text, pos, (param_open, invoke_close))
        m = _INVOKE_HEAD.match(head)
        if m is None:
            raise _parse_error(f"malformed invoke element {head!r}")
        name = m.group(1)
        args: dict[str, tuple[str, str]] = {}
        while stop == param_open:
            pos, body, stop = _scan(text, pos, (param_close,))
            p = _PARAMETER.match(body)
            if p is None:
                raise _parse_error(f"malformed parameter element {body!r}")
            key, is_str, value = p.group(1), p.group(2), p.group(3)
            if key in args:
                raise _parse_error(f"duplicate parameter {key!r} in call to {name!r}")
            args[key] = (value, is_str)
            pos, gap, stop = _scan(text, pos, (param_open, invoke_close))
            if gap != ">\n":
                raise _parse_error(f"expected '>\\n' after a parameter, got {gap!r}")
        calls.append({"type": "function", "function": {"name": name, "arguments": _arguments_json(args)}})
    return pos, stop, calls


def parse_completion(text: str, thinking_mode: str, sp: DsmlSpelling) -> dict[str, Any]:
    """Parse one whole raw completion (see the family modules for the contract).

    ``thinking_mode`` is compared with ``"thinking"`` only; any other value reads
    the text as chat output, as the reference does.
    """
    if not isinstance(text, str):
        fail("completion", "must be a string")
    block_start = f"\n\n<{sp.dsml}{sp.block}"
    pos = 0
    reasoning = ""
    if thinking_mode == "thinking":
        pos, reasoning, stop = _scan(text, pos, (sp.think_end, block_start))
        if stop != sp.think_end:
            raise _parse_error(f"thinking output must end with {sp.think_end}")
    pos, content, stop = _scan(text, pos, (sp.eos, block_start))
    calls: list[dict[str, Any]] = []
    if stop == block_start:
        pos, stop, calls = _parse_calls(text, pos, sp)
        pos, trailing, stop = _scan(text, pos, (sp.eos,))
        if trailing:
            raise _parse_error(f"unexpected text after the tool calls: {trailing!r}")
    elif stop != sp.eos:
        raise _parse_error(f"missing {sp.eos}")
    if pos != len(text) or stop not in (sp.eos, None):
        raise _parse_error(f"unexpected text after {sp.eos}: {text[pos:]!r}")
    for token in (sp.bos, sp.eos, sp.think_start, sp.think_end, sp.dsml):
        if token in content or token in reasoning:
            raise _parse_error(f"special token {token} inside content or reasoning")
    return {"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": calls}


def lenient_arguments(call: ToolCall) -> dict[str, Any]:
    """V4's reading of ``function.arguments``.

    Whatever does not decode as JSON (invalid text, or a non-string such as a dict
    or null) becomes one parameter named ``arguments`` holding the raw value -- the
    reference catches every decode failure this way. A decoded non-object is an
    error (the reference fails on ``.items()``).
    """
    raw = call.arguments
    try:
        decoded = from_json(raw)
    except Exception:  # mirrors the reference's catch-all fallback
        return {"arguments": raw}
    if not isinstance(decoded, dict):
        fail(f"{call.path}.function.arguments", "must decode to a JSON object")
    return decoded


def strict_arguments(call: ToolCall) -> dict[str, Any]:
    """V3.2's reading of ``function.arguments``: a string holding a JSON object."""
    raw = call.arguments
    where = f"{call.path}.function.arguments"
    if not isinstance(raw, str):
        fail(where, f"must be a JSON string, got {type(raw).__name__}")
    try:
        decoded = from_json(raw)
    except ValueError as exc:
        fail(where, f"is not valid JSON ({exc})")
    if not isinstance(decoded, dict):
        fail(where, "must decode to a JSON object")
    return decoded
