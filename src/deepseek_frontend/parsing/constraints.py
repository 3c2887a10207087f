"""Decoding constraints the frontend hands to an engine: tool-call grammars and JSON answers.

``tool_choice`` ``"required"`` (or Anthropic ``"any"``) and a named tool are enforced by
constrained decoding: :func:`build_tool_call_constraint` turns the request's tool schemas
into an EBNF grammar in the GBNF dialect that SGLang's ``ebnf`` field and vLLM's
``structured_outputs.grammar`` take; the same text compiles on xgrammar and llguidance. The
grammar describes the whole completion the model writes after the prompt::

    root      ::= think? block             (think only in thinking mode, where it is required)
    think     ::= <text without "</think>"> "</think>"
    block     ::= "<｜DSML｜tool_calls>\\n" invoke+ "</｜DSML｜tool_calls>"   (no whitespace before it)
    invoke    ::= one alternative per allowed tool:
                  "<｜DSML｜invoke name=\\"NAME\\">\\n" param... "</｜DSML｜invoke>\\n"
    param     ::= "<｜DSML｜parameter name=\\"P\\" string=\\"true\\">" <raw string> "</｜DSML｜parameter>\\n"
                | "<｜DSML｜parameter name=\\"P\\" string=\\"false\\">" <JSON value> "</｜DSML｜parameter>\\n"

Parameters appear in schema property order; required ones must appear, others are optional
(the order restriction is what lets a context-free grammar enforce ``required``). A value is
raw text when it is a string (DeepSeek's encoder decides by the value), otherwise JSON that
follows the property's schema recursively (:class:`_SchemaCompiler`: nested objects with their
required properties, typed arrays, enums, const, anyOf, local ``$ref``; what has no grammar is
listed in :data:`UNENFORCED_KEYWORDS` and docs/parsing.md). EOS after the block is the engine's
business. DeepSeek-V3.2 spells the block ``function_calls``, V4.1 `` calls`` (and its element
names after a space); everything else is shared.

:func:`build_structured_output_constraint` is the JSON answer of ``response_format``: in thinking
mode ``think`` then the value, so the reasoning stays free. :func:`to_lark` writes a grammar in
llguidance's Lark syntax with ``</think>`` as the special token llguidance sees. Schemas must have
passed :func:`deepseek_frontend.api.schemas.check_json_schema` first.

:func:`ebnf_accepts` is a small Earley recognizer for exactly the EBNF subset this module
emits (rules, quoted literals, character classes, grouping, ``|``, ``*``, ``+``, ``?``).
The simulated engine uses it to make its output satisfy the grammar, and tests use it to
check that canonical calls are accepted and wrong ones rejected. It is pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from deepseek_frontend.engines.base import DecodingConstraint
from deepseek_frontend.errors import RequestError

__all__ = [
    "BLOCK_NAMES",
    "MAX_GRAMMAR_DEPTH",
    "UNENFORCED_KEYWORDS",
    "Grammar",
    "build_json_schema_constraint",
    "build_structured_output_constraint",
    "build_tool_call_constraint",
    "ebnf_accepts",
    "ebnf_example",
    "normalize_tool",
    "parse_ebnf",
    "resolve_local_ref",
    "resolve_tool_choice",
    "to_lark",
]

#: the DSML block name per family; V4.1 also writes its element names after a space
#: (``<｜DSML｜ calls>``, ``<｜DSML｜ invoke``, ``<｜DSML｜ parameter``)
BLOCK_NAMES: dict[str, str] = {
    "deepseek_v4": "tool_calls",
    "deepseek_v41": " calls",
    "deepseek_v32": "function_calls",
}
_DSML = "｜DSML｜"
_THINK_END = "</think>"


# --------------------------------------------------------------------------- tools


def normalize_tool(tool: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(name, parameters_schema)`` of one tool in OpenAI, flat or Anthropic form.

    Accepts ``{"type": "function", "function": {"name", "parameters"}}``,
    ``{"name", "parameters"}`` and Anthropic's ``{"name", "input_schema"}``.
    """
    fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError("tool without a name", param="tools")
    params = fn.get("parameters", fn.get("input_schema")) or {"type": "object", "properties": {}}
    if not isinstance(params, Mapping):
        raise RequestError(f"tool {name!r}: parameters must be a JSON schema object", param="tools")
    return name, dict(params)


def resolve_tool_choice(tool_choice: Any, names: Sequence[str]) -> list[str]:
    """The tool names a constrained ``tool_choice`` allows, in declaration order.

    ``"required"`` / ``"any"`` (or ``{"type": "any"}``) allow every tool; a named choice --
    ``{"type": "function", "function": {"name": N}}``, Anthropic ``{"type": "tool", "name": N}``
    -- allows exactly ``N``. Raises :class:`RequestError` for ``auto``/``none`` (nothing to
    enforce), an unknown name, or an empty tool list.
    """
    if not names:
        raise RequestError("tool_choice requires at least one tool in 'tools'", param="tool_choice")
    if tool_choice in ("required", "any") or (
        isinstance(tool_choice, Mapping) and tool_choice.get("type") in ("any", "required")
    ):
        return list(names)
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
        if isinstance(name, str):
            if name not in names:
                raise RequestError(
                    f"tool_choice names {name!r}, which is not in 'tools'", param="tool_choice"
                )
            return [name]
    raise RequestError(f"tool_choice {tool_choice!r} is not a constraint", param="tool_choice")


# --------------------------------------------------------------------------- grammar text


def _lit(text: str) -> str:
    """A GBNF double-quoted literal."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + out.replace("\t", "\\t") + '"'


def _cls_char(ch: str) -> str:
    if ch in "\\]^-[":
        return "\\" + ch
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, ch)


def _text_without(stop: str) -> str:
    """Grammar expression for any text that does not contain ``stop``.

    Requires that ``stop[0]`` (call it *h*) does not occur again in ``stop`` (true for the
    closing tags used here). Then every occurrence of *h* in the text starts a *run*: *h*
    followed by a proper prefix ``p_k = stop[1:k+1]`` of the rest. A run either ends the text,
    is followed by another *h*, or by one character that is neither *h* nor ``stop[k+1]``.
    Written flat -- alternatives over ``k`` rather than ``k`` nested optional groups -- because
    llguidance refuses nesting deeper than about ten levels (``lark grammar too deeply nested``)
    and turns the whole expression into one regular expression either way.
    """
    head = stop[0]
    assert head not in stop[1:], stop
    rest = stop[1:]
    plain = f"[^{_cls_char(head)}]"
    # runs that may end the text or precede another head: h p_k for k < len(rest)
    prefixes = [_lit(rest[:k]) for k in range(1, len(rest))]
    bare_run = f"{_lit(head)} ({' | '.join(prefixes)})?" if prefixes else _lit(head)
    # runs followed by a character that breaks the match
    broken = [f"[^{_cls_char(rest[0])}{_cls_char(head)}]"]
    broken += [f"{_lit(rest[:k])} [^{_cls_char(rest[k])}{_cls_char(head)}]" for k in range(1, len(rest))]
    return f"({plain} | ({bare_run})* {_lit(head)} ({' | '.join(broken)}))* ({bare_run})*"


#: free reasoning closed by ``</think>``, one rule: llguidance lexes a rule made of terminals as
#: one greedy lexeme, and a separate text lexeme could swallow ``</think`` and then get stuck
_THINK_RULE = f"think ::= {_text_without(_THINK_END)} {_lit(_THINK_END)}"

#: generic JSON. ``ws`` is at most one space: exactly what ``json.dumps`` writes after ``,`` and
#: ``:`` (DeepSeek's encoder and most models) or nothing (compact JSON); unbounded whitespace
#: lets a constrained model pad forever, which random-weight and weak models do.
_JSON_RULES = r"""
json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ws ( json-member ( "," ws json-member )* )? "}"
json-member ::= json-string ws ":" ws json-value ws
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
json-string ::= "\"" json-char* "\""
json-char ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex )
hex ::= [0-9a-fA-F]
json-int ::= "-"? json-nat
json-nat ::= "0" | [1-9] digits-15
json-number ::= json-int ( "." [0-9] digits-15 )? ( [eE] [-+]? [0-9] digits-2 )?
ws ::= " "?
""".strip()

#: at most this many digits in an integer (or a fraction) the grammar admits: every int JSON
#: round-trips exactly (2**53 has 16 digits) and a constrained model cannot write digits forever
MAX_INT_DIGITS = 16
#: an integer range this small is enumerated exactly; a larger one is bounded by sign and digit count
_MAX_ENUMERATED_INTS = 64


def _digit_rules(longest: int) -> list[str]:
    """``digits-N ::= ( [0-9] digits-(N-1) )?``: up to N digits, one flat rule per count (no nesting)."""
    rules = ["digits-1 ::= [0-9]?"]
    rules += [f"digits-{n} ::= ( [0-9] digits-{n - 1} )?" for n in range(2, longest + 1)]
    return rules


_JSON_RULES = "\n".join([_JSON_RULES, *_digit_rules(MAX_INT_DIGITS - 1)])

#: JSON-schema keywords the grammar does not enforce (the value is still well-formed JSON of the
#: right type); listed in docs/parsing.md (a test keeps the two in sync).
UNENFORCED_KEYWORDS: tuple[str, ...] = (
    "pattern",
    "format",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "uniqueItems",
    "contains",
    "prefixItems",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
)
#: deepest schema nesting compiled into the grammar; deeper parts get generic JSON
MAX_GRAMMAR_DEPTH = 24
#: arrays with at most this many minItems / maxItems get the exact count in the grammar
_MAX_COUNTED_ITEMS = 8
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated"})
_OBJECT_KEYS = ("properties", "required", "additionalProperties")


def _integer_bounds(schema: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """The inclusive integer range ``minimum`` / ``maximum`` and their exclusive forms allow."""
    lo: int | None = None
    hi: int | None = None

    def number(key: str) -> float | None:
        value = schema.get(key)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None

    if (v := number("minimum")) is not None:
        lo = math.ceil(v)
    if (v := number("exclusiveMinimum")) is not None:
        lo = max(lo, math.floor(v) + 1) if lo is not None else math.floor(v) + 1
    if (v := number("maximum")) is not None:
        hi = math.floor(v)
    if (v := number("exclusiveMaximum")) is not None:
        hi = min(hi, math.ceil(v) - 1) if hi is not None else math.ceil(v) - 1
    return lo, hi


def resolve_local_ref(root: Mapping[str, Any], ref: str) -> Mapping[str, Any] | bool | None:
    """The schema a local JSON pointer (``#``, ``#/$defs/Name``) names inside ``root``, or None."""
    if not ref.startswith("#"):
        return None
    node: Any = root
    for part in ref[1:].split("/")[1:] if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node if isinstance(node, Mapping | bool) else None


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Both schemas at once, approximately (``allOf`` / a branch of ``anyOf`` with its siblings)."""
    out = dict(base)
    for key, value in extra.items():
        if key == "properties" and isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = {**out[key], **value}
        elif key == "required" and isinstance(out.get(key), list) and isinstance(value, list):
            out[key] = [*out[key], *(v for v in value if v not in out[key])]
        else:
            out[key] = value
    return out


def _json_lit(value: Any) -> str:
    """A JSON value spelled as ``json.dumps`` does (the encoder's and the models' usual spelling)."""
    return _lit(json.dumps(value, ensure_ascii=False))


class _SchemaCompiler:
    """Turns JSON schemas into grammar rules; one instance per grammar (shares rule names).

    :meth:`value` returns an expression for the JSON text of a value valid against a schema,
    adding the rules it needs. Local ``$ref`` pointers become one rule each, so recursive
    schemas give recursive grammars. What cannot be expressed falls back to ``json-value``
    (see :data:`UNENFORCED_KEYWORDS`).
    """

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self._refs: dict[tuple[int, str], str] = {}
        self._counter = 0

    def add(self, stem: str, expr: str) -> str:
        """A new rule ``stem-N`` for ``expr``; returns its name."""
        self._counter += 1
        name = f"{stem}-{self._counter}"
        self.rules[name] = expr
        return name

    def value(self, schema: Any, root: Mapping[str, Any], depth: int = 0) -> str:
        if schema is True or not isinstance(schema, Mapping) or depth > MAX_GRAMMAR_DEPTH:
            return "json-value"
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self._ref(schema, ref, root, depth)
        if "const" in schema:
            return _json_lit(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return "(" + " | ".join(_json_lit(v) for v in enum) + ")"
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                # oneOf is enforced as anyOf (exclusivity is not context-free in general)
                base = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")}
                alts = [
                    self.value(_merge(base, o) if isinstance(o, Mapping) else o, root, depth + 1)
                    for o in options
                ]
                return self.add("any-of", " | ".join(dict.fromkeys(alts)))
        parts = schema.get("allOf")
        if isinstance(parts, list) and parts:
            merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
            for part in parts:
                if isinstance(part, Mapping):
                    merged = _merge(merged, part)
            return self.value(merged, root, depth + 1)
        typ = schema.get("type")
        if isinstance(typ, list):
            types = [t for t in typ if isinstance(t, str)]
            if not types:
                return "json-value"
            if len(types) > 1:
                alts = [self.value({**schema, "type": t}, root, depth + 1) for t in types]
                return self.add("types", " | ".join(alts))
            typ = types[0]
        if typ is None:
            if any(k in schema for k in _OBJECT_KEYS):
                typ = "object"
            elif "items" in schema:
                typ = "array"
            else:
                return "json-value"
        if typ == "object":
            return self._object(schema, root, depth)
        if typ == "array":
            return self._array(schema, root, depth)
        return {
            "string": "json-string",
            "integer": self._integer(schema),
            "number": "json-number",
            "boolean": '("true" | "false")',
            "null": '"null"',
        }.get(typ, "json-value")

    def _integer(self, schema: Mapping[str, Any]) -> str:
        """An integer within the schema's bounds: a small range exactly, a larger one by sign and digits.

        ``minimum`` / ``maximum`` (and their exclusive forms) give ``lo..hi``. With at most
        :data:`_MAX_ENUMERATED_INTS` values the grammar lists them; otherwise a non-negative
        lower bound drops the sign and a bound on the magnitude caps the digit count, so the
        grammar admits a superset of the range but never a runaway number.
        """
        lo, hi = _integer_bounds(schema)
        if lo is not None and hi is not None:
            if hi < lo:
                return "json-int"  # unsatisfiable: validation's business, the grammar stays well-formed
            if hi - lo < _MAX_ENUMERATED_INTS:
                return "(" + " | ".join(_lit(str(v)) for v in range(lo, hi + 1)) + ")"
        if lo is None and hi is None:
            return "json-int"
        magnitude = max(abs(v) for v in (lo, hi) if v is not None)
        digits = len(str(magnitude)) if lo is not None and hi is not None else MAX_INT_DIGITS
        digits = min(max(digits, 1), MAX_INT_DIGITS)
        nat = "[0-9]" if digits == 1 else f'"0" | [1-9] digits-{digits - 1}'
        sign = "" if lo is not None and lo >= 0 else '"-"? '
        return self.add("int", f"{sign}( {nat} )")

    def _ref(self, schema: Mapping[str, Any], ref: str, root: Mapping[str, Any], depth: int) -> str:
        target = resolve_local_ref(root, ref)
        if target is None:
            return "json-value"  # remote or dangling (validation rejects dangling local ones)
        siblings = {k: v for k, v in schema.items() if k != "$ref" and k not in _ANNOTATIONS}
        if siblings:
            # a $ref with constraints beside it: inline the merge (no recursion through this path)
            return self.value(
                _merge(target, siblings) if isinstance(target, Mapping) else siblings, root, depth + 1
            )
        key = (id(root), ref)
        if key not in self._refs:
            # named before it is compiled, so a recursive reference finds the rule
            name = f"ref-{len(self._refs) + 1}"
            self._refs[key] = name
            self.rules[name] = "json-value"
            self.rules[name] = self.value(target, root, depth + 1)
        return self._refs[key]

    def _object(self, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> str:
        props = schema.get("properties")
        props = dict(props) if isinstance(props, Mapping) else {}
        required = [r for r in schema.get("required") or () if isinstance(r, str)]
        extra = schema.get("additionalProperties")
        for key in required:
            if key not in props:
                # required but only valued by additionalProperties
                props[key] = extra if isinstance(extra, Mapping) else {}
        # a property whose schema is false can never be present
        props = {k: v for k, v in props.items() if v is not False}
        if not props:
            if extra is False:
                return '"{" ws "}"'
            if isinstance(extra, Mapping) and extra:
                member = self.add("member", f'json-string ws ":" ws {self.value(extra, root, depth + 1)}')
                return self.add("map", f'"{{" ws ( {member} ( "," ws {member} )* )? "}}"')
            return "json-object"
        # Properties in declaration order, each required one present: the order restriction is
        # what lets a context-free grammar enforce `required`. Additional properties are not
        # generated. Built back to front: first = properties i.. with none written yet,
        # after = properties i.. once one was written (each then needs a leading comma).
        first, after = "", ""
        names = list(props)
        for i in range(len(names) - 1, -1, -1):
            member = f'{_json_lit(names[i])} ws ":" ws {self.value(props[names[i]], root, depth + 1)}'
            with_first = f"{member} {after}".strip()
            with_comma = f'"," ws {member} {after}'.strip()
            if names[i] in required:
                first_expr, after_expr = with_first, with_comma
            else:
                first_expr = f"( {with_first} ) | {first}" if first else f"( {with_first} )?"
                after_expr = f"( {with_comma} ) | {after}" if after else f"( {with_comma} )?"
            first = self.add("props", first_expr)
            if i:
                after = self.add("more", after_expr)
        return self.add("object", f'"{{" ws {first} ws "}}"')

    def _array(self, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> str:
        items = schema.get("items")
        if items is False:
            return '"[" ws "]"'
        item = self.value(items, root, depth + 1) if isinstance(items, Mapping) else "json-value"
        lo = schema.get("minItems", 0)
        hi = schema.get("maxItems")
        lo = lo if isinstance(lo, int) and 0 <= lo <= _MAX_COUNTED_ITEMS else 0
        hi = hi if isinstance(hi, int) and lo <= hi <= _MAX_COUNTED_ITEMS else None
        if hi == 0:
            return '"[" ws "]"'
        more = f'"," ws {item}'
        mandatory = " ".join([item] + [more] * (max(lo, 1) - 1))
        if hi is None:
            rest = f"( {more} )*"
        else:
            # up to hi - max(lo, 1) further items: one rule per count, no nesting
            rest = ""
            for _ in range(hi - max(lo, 1)):
                rest = self.add("items", f"( {more} {rest} )?".replace("  ", " "))
        body = f"{mandatory} {rest}".strip()
        if lo == 0:
            body = f"( {body} )?"
        return self.add("array", f'"[" ws {body} ws "]"')


def _string_kind(schema: Any, root: Mapping[str, Any], depth: int = 0) -> str:
    """Whether values of ``schema`` are strings: ``"only"``, ``"maybe"`` or ``"never"``.

    DeepSeek's encoder writes a parameter raw with ``string="true"`` exactly when its value is
    a string, so the grammar offers the raw form where the schema admits strings and the JSON
    form where it admits anything else.
    """
    if not isinstance(schema, Mapping) or depth > MAX_GRAMMAR_DEPTH:
        return "never" if schema is False else "maybe"
    if isinstance(schema.get("$ref"), str):
        target = resolve_local_ref(root, schema["$ref"])
        return _string_kind(target, root, depth + 1) if target is not None else "maybe"
    if "const" in schema:
        return "only" if isinstance(schema["const"], str) else "never"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        strs = sum(isinstance(v, str) for v in enum)
        return "only" if strs == len(enum) else "maybe" if strs else "never"
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            kinds = {_string_kind(o, root, depth + 1) for o in options}
            return kinds.pop() if len(kinds) == 1 else "maybe"
    typ = schema.get("type")
    if isinstance(typ, str):
        return "only" if typ == "string" else "never"
    if isinstance(typ, list):
        return "only" if typ == ["string"] else "maybe" if "string" in typ else "never"
    if any(k in schema for k in (*_OBJECT_KEYS, "items")):
        return "never"
    return "maybe"


def _raw_string_expr(schema: Any, root: Mapping[str, Any]) -> str:
    """The raw (``string="true"``) text of a string parameter: literal enum/const values or free text."""
    for _ in range(MAX_GRAMMAR_DEPTH):
        if isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            schema = resolve_local_ref(root, schema["$ref"])
    if isinstance(schema, Mapping):
        if isinstance(schema.get("const"), str):
            return _lit(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and any(isinstance(v, str) for v in enum):
            return "(" + " | ".join(_lit(v) for v in enum if isinstance(v, str)) + ")"
    return "param-text"


def build_tool_call_constraint(
    family: str, tools: Sequence[Mapping[str, Any]], tool_choice: Any, *, thinking: bool
) -> DecodingConstraint:
    """An ``ebnf`` constraint forcing at least one DSML call to an allowed tool.

    ``family`` picks the block spelling (:data:`BLOCK_NAMES`); ``tool_choice`` is
    ``"required"``/``"any"`` or a named choice (see :func:`resolve_tool_choice`);
    ``thinking`` says the prompt ended with ``<think>``, so the output starts with
    reasoning closed by ``</think>``. The calls block starts right at the answer: no
    whitespace before it (it would come back as ``content`` of spaces). Every parameter's
    value follows its JSON schema recursively (see :class:`_SchemaCompiler`). The tool
    schemas must have passed :func:`deepseek_frontend.api.schemas.check_json_schema`.
    Raises :class:`RequestError` when the choice or the tools cannot be turned into a grammar.
    """
    normalized = [normalize_tool(t) for t in tools]
    allowed = resolve_tool_choice(tool_choice, [n for n, _ in normalized])
    compiler = _SchemaCompiler()
    rules = [f"root ::= {'think ' if thinking else ''}block"]
    rules.extend(_block_rules(family, normalized, allowed, compiler))
    rules.extend(f"{n} ::= {e}" for n, e in compiler.rules.items())
    if thinking:
        rules.append(_THINK_RULE)
    rules.append(_JSON_RULES)
    return DecodingConstraint(kind="ebnf", value="\n".join(rules) + "\n")


def _block_rules(
    family: str,
    normalized: Sequence[tuple[str, dict[str, Any]]],
    allowed: Sequence[str],
    compiler: _SchemaCompiler,
) -> list[str]:
    """Rules ``block`` (one DSML calls block of calls to ``allowed`` tools), ``invoke-*``, ``param-text``."""
    if family not in BLOCK_NAMES:
        raise RequestError(f"no tool-call grammar for model family {family!r}", param="tool_choice")
    block = BLOCK_NAMES[family]
    space = " " if block.startswith(" ") else ""
    invoke, parameter = f"{space}invoke", f"{space}parameter"
    rules = [f"block ::= {_lit(f'<{_DSML}{block}>' + chr(10))} invoke+ {_lit(f'</{_DSML}{block}>')}"]
    invoke_alts: list[str] = []
    close_param = _lit(f"</{_DSML}{parameter}>" + "\n")
    for index, (name, params) in enumerate(normalized):
        if name not in allowed:
            continue
        rule = f"invoke-{index}"
        invoke_alts.append(rule)
        props = params.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = {r for r in params.get("required") or () if isinstance(r, str)}
        parts: list[str] = []
        for pname, pschema in props.items():
            if pschema is False:
                continue
            kind = _string_kind(pschema, params)
            forms: list[str] = []
            if kind != "never":
                # its own rule, closing tag included: llguidance lexes a rule made only of terminals
                # as one lexeme; a free-text lexeme followed by a separate closing-tag lexeme would
                # greedily swallow a prefix of the tag and fail
                opening = _lit(f'<{_DSML}{parameter} name="{pname}" string="true">')
                raw = f"{opening} {_raw_string_expr(pschema, params)} {close_param}"
                forms.append(compiler.add("raw", raw) if kind == "maybe" else raw)
            if kind != "only":
                opening = _lit(f'<{_DSML}{parameter} name="{pname}" string="false">')
                forms.append(f"{opening} {compiler.value(pschema, params)} {close_param}")
            param_rule = compiler.add("param", " | ".join(forms))
            parts.append(param_rule if pname in required else f"{param_rule}?")
        opening = _lit(f'<{_DSML}{invoke} name="{name}">\n')
        closing = _lit(f"</{_DSML}{invoke}>\n")
        rules.append(" ".join((f"{rule} ::=", opening, *parts, closing)))
    rules.insert(1, "invoke ::= " + " | ".join(invoke_alts))
    rules.append(f"param-text ::= {_text_without(f'</{_DSML}{parameter}>')}")
    return rules


def build_json_schema_constraint(schema: Mapping[str, Any]) -> DecodingConstraint:
    """A ``json_schema`` constraint (SGLang takes the schema as a JSON string)."""
    if not isinstance(schema, Mapping):
        raise RequestError("response_format.json_schema.schema must be an object", param="response_format")
    return DecodingConstraint(kind="json_schema", value=json.dumps(schema, ensure_ascii=False))


def build_structured_output_constraint(
    schema: Mapping[str, Any] | None,
    *,
    thinking: bool,
    family: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> DecodingConstraint:
    """The constraint for a JSON answer: ``schema`` (None: any JSON object, ``json_object`` mode).

    Without reasoning and tools this is a ``json_schema`` constraint: the engines' own
    JSON-schema compilers cover more of JSON Schema than a grammar written here. Otherwise an
    ``ebnf`` grammar (``schema`` must have passed validation): in thinking mode any text up to
    ``</think>`` first (the reasoning stays free); with ``tools`` (``tool_choice`` auto) the
    answer is either the JSON value or a DSML calls block of ``family`` -- agent loops call
    tools first and answer in the schema at the end.
    """
    if not thinking and not tools:
        return build_json_schema_constraint(schema if schema is not None else {"type": "object"})
    compiler = _SchemaCompiler()
    value = compiler.value(schema, schema) if schema is not None else "json-object"
    answer = f"( {value} | block )" if tools else value
    rules = [f"root ::= {'think ' if thinking else ''}{answer}"]
    if tools:
        normalized = [normalize_tool(t) for t in tools]
        rules.extend(_block_rules(family or "", normalized, [n for n, _ in normalized], compiler))
    rules.extend(f"{n} ::= {e}" for n, e in compiler.rules.items())
    if thinking:
        rules.append(_THINK_RULE)
    rules.append(_JSON_RULES)
    return DecodingConstraint(kind="ebnf", value="\n".join(rules) + "\n")


# --------------------------------------------------------------------------- Lark (llguidance)


def to_lark(grammar: str, special_tokens: Sequence[str] = (_THINK_END,)) -> str:
    """``grammar`` (the EBNF this module builds) in llguidance's Lark syntax, special tokens as tokens.

    llguidance treats the tokenizer's ``</think>`` as a special token, which a quoted literal cannot
    match; here a literal equal to one of ``special_tokens`` is written as the token itself
    (``</think>``), so a worker whose grammar backend is llguidance lets the model write the token
    it was trained on. The language is otherwise unchanged. Rules that can be regular (no
    recursion, no special token) become terminals, so free text stays one lexeme; in the other rules
    each run of such items is one terminal, as llguidance's own GBNF converter does.
    """
    rules = parse_ebnf(grammar).rules
    specials = frozenset(special_tokens)

    def refs_of(node: Any) -> set[str]:
        return _refs({"_": node})

    def has_special(node: Any) -> bool:
        tag = node[0]
        if tag == "lit":
            return node[1] in specials
        if tag in ("seq", "alt"):
            return any(has_special(child) for child in node[1])
        if tag == "rep":
            return has_special(node[1])
        return False

    # rules that reach themselves cannot be terminals
    reach = {name: refs_of(node) for name, node in rules.items()}
    changed = True
    while changed:
        changed = False
        for seen in reach.values():
            extra = set().union(*(reach.get(r, set()) for r in seen)) - seen
            if extra:
                seen |= extra
                changed = True
    lexical = {name for name, node in rules.items() if name not in reach[name] and not has_special(node)}
    changed = True
    while changed:
        changed = False
        for name in list(lexical):
            if not refs_of(rules[name]) <= lexical:
                lexical.discard(name)
                changed = True

    def name_of(rule: str) -> str:
        lark = rule.replace("-", "_")
        return lark.upper() if rule in lexical else lark.lower()

    def is_lexical(node: Any) -> bool:
        return not has_special(node) and refs_of(node) <= lexical

    def emit(node: Any) -> str:
        tag = node[0]
        if tag == "lit":
            return node[1] if node[1] in specials else json.dumps(node[1], ensure_ascii=False)
        if tag == "cls":
            _, chars, ranges, negated = node
            body = "".join(_regex_char(c) for c in sorted(chars))
            body += "".join(f"{_regex_char(lo)}-{_regex_char(hi)}" for lo, hi in ranges)
            return f"/[{'^' if negated else ''}{body}]/"
        if tag == "ref":
            return name_of(node[1])
        if tag == "seq":
            return " ".join(emit(child) for child in node[1])
        if tag == "alt":
            return "(" + " | ".join(emit(child) for child in node[1]) + ")"
        _, child, lo, hi = node
        op = "?" if hi == 1 else "+" if lo == 1 else "*"
        return f"({emit(child)}){op}"

    extra_terminals: list[str] = []

    def emit_rule_body(node: Any) -> str:
        """A non-terminal rule: runs of terminal-able items in a sequence become one terminal each."""
        alts = node[1] if node[0] == "alt" else [node]
        out = []
        for alt in alts:
            items = alt[1] if alt[0] == "seq" else [alt]
            parts: list[str] = []
            run: list[Any] = []
            for item in [*items, None]:
                if item is not None and is_lexical(item):
                    run.append(item)
                    continue
                if run:
                    if len(run) == 1 and run[0][0] == "ref":
                        parts.append(emit(run[0]))
                    else:
                        name = f"T_{len(extra_terminals) + 1}"
                        extra_terminals.append(f"{name}: {emit(('seq', run))}")
                        parts.append(name)
                    run = []
                if item is not None:
                    parts.append(emit(item))
            out.append(" ".join(parts))
        return " | ".join(out)

    lines = ["start: root"]
    for rule, node in rules.items():
        if rule in lexical and rule != "root":
            lines.append(f"{name_of(rule)}: {emit(node)}")
        else:
            lines.append(f"{rule.replace('-', '_')}: {emit_rule_body(node)}")
    return "\n".join([*lines, *extra_terminals]) + "\n"


def _regex_char(ch: str) -> str:
    """One character inside a regex class of a Lark ``/.../`` terminal."""
    if ch in "\\]^-[/":
        return "\\" + ch
    if ord(ch) < 0x20 or ord(ch) == 0x7F:
        return f"\\x{{{ord(ch):x}}}"
    return ch


# --------------------------------------------------------------------------- recognizer
# Grammar AST: ("lit", str) | ("cls", frozenset[str], negated) | ("ref", name)
#            | ("seq", [nodes]) | ("alt", [nodes]) | ("rep", node, min, max_or_None)


@dataclass(frozen=True, slots=True)
class Grammar:
    """A parsed EBNF grammar: ``rules`` maps each rule name to its AST; start at ``root``."""

    rules: dict[str, Any]


_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_ESCAPES = {
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "\\": "\\",
    '"': '"',
    "]": "]",
    "[": "[",
    "-": "-",
    "^": "^",
    "/": "/",
}


class _Reader:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, what: str) -> RequestError:
        return RequestError(f"ebnf: {what} at offset {self.pos}")

    def skip_ws(self, newlines: bool) -> None:
        while self.pos < len(self.text):
            ch = self.text[self.pos]
            if ch == "#":
                while self.pos < len(self.text) and self.text[self.pos] != "\n":
                    self.pos += 1
            elif ch in " \t" or (newlines and ch in "\r\n"):
                self.pos += 1
            else:
                return

    def escape(self) -> str:
        self.pos += 1  # the backslash
        ch = self.text[self.pos]
        self.pos += 1
        if ch in ("x", "u"):
            width = 2 if ch == "x" else 4
            code = self.text[self.pos : self.pos + width]
            self.pos += width
            return chr(int(code, 16))
        if ch not in _ESCAPES:
            raise self.error(f"unknown escape \\{ch}")
        return _ESCAPES[ch]


def parse_ebnf(text: str) -> Grammar:
    """Parse the GBNF subset :func:`build_tool_call_constraint` emits. Raises RequestError."""
    reader = _Reader(text)
    rules: dict[str, Any] = {}
    while True:
        reader.skip_ws(newlines=True)
        if reader.pos >= len(text):
            break
        match = _NAME.match(text, reader.pos)
        if not match:
            raise reader.error("expected a rule name")
        reader.pos = match.end()
        reader.skip_ws(newlines=False)
        if not text.startswith("::=", reader.pos):
            raise reader.error("expected '::='")
        reader.pos += 3
        rules[match.group()] = _parse_alt(reader, depth=0)
    if "root" not in rules:
        raise RequestError("ebnf: no 'root' rule")
    for name in _refs(rules):
        if name not in rules:
            raise RequestError(f"ebnf: rule {name!r} is used but not defined")
    return Grammar(rules)


def _refs(rules: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()

    def walk(node: Any) -> None:
        tag = node[0]
        if tag == "ref":
            found.add(node[1])
        elif tag in ("seq", "alt"):
            for child in node[1]:
                walk(child)
        elif tag == "rep":
            walk(node[1])

    for node in rules.values():
        walk(node)
    return found


def _parse_alt(reader: _Reader, depth: int) -> Any:
    alts = [_parse_seq(reader, depth)]
    while reader.pos < len(reader.text) and reader.text[reader.pos] == "|":
        reader.pos += 1
        alts.append(_parse_seq(reader, depth))
    return alts[0] if len(alts) == 1 else ("alt", alts)


def _parse_seq(reader: _Reader, depth: int) -> Any:
    items: list[Any] = []
    text = reader.text
    while True:
        # inside parentheses a rule may continue over lines; at top level a newline ends it
        reader.skip_ws(newlines=depth > 0)
        if reader.pos >= len(text):
            break
        ch = text[reader.pos]
        if ch in "|)\n\r":
            break
        if ch == '"':
            reader.pos += 1
            buf: list[str] = []
            while reader.pos < len(text) and text[reader.pos] != '"':
                if text[reader.pos] == "\\":
                    buf.append(reader.escape())
                else:
                    buf.append(text[reader.pos])
                    reader.pos += 1
            if reader.pos >= len(text):
                raise reader.error("unterminated literal")
            reader.pos += 1
            atom: Any = ("lit", "".join(buf))
        elif ch == "[":
            atom = _parse_class(reader)
        elif ch == "(":
            reader.pos += 1
            atom = _parse_alt(reader, depth + 1)
            reader.skip_ws(newlines=True)
            if reader.pos >= len(text) or text[reader.pos] != ")":
                raise reader.error("expected ')'")
            reader.pos += 1
        else:
            match = _NAME.match(text, reader.pos)
            if not match:
                raise reader.error(f"unexpected {ch!r}")
            # a name followed by ::= starts the next rule
            after = reader.pos
            reader.pos = match.end()
            probe = reader.pos
            while probe < len(text) and text[probe] in " \t":
                probe += 1
            if text.startswith("::=", probe):
                reader.pos = after
                break
            atom = ("ref", match.group())
        if reader.pos < len(text) and text[reader.pos] in "*+?":
            op = text[reader.pos]
            reader.pos += 1
            atom = ("rep", atom, 1 if op == "+" else 0, 1 if op == "?" else None)
        items.append(atom)
    return items[0] if len(items) == 1 else ("seq", items)


def _parse_class(reader: _Reader) -> Any:
    text = reader.text
    reader.pos += 1
    negated = text.startswith("^", reader.pos)
    if negated:
        reader.pos += 1

    def char() -> str:
        if text[reader.pos] == "\\":
            return reader.escape()
        reader.pos += 1
        return text[reader.pos - 1]

    chars: set[str] = set()
    ranges: list[tuple[str, str]] = []
    while reader.pos < len(text) and text[reader.pos] != "]":
        lo = char()
        if text.startswith("-", reader.pos) and not text.startswith("-]", reader.pos):
            reader.pos += 1
            ranges.append((lo, char()))
        else:
            chars.add(lo)
    if reader.pos >= len(text):
        raise reader.error("unterminated character class")
    reader.pos += 1
    return ("cls", frozenset(chars), tuple(ranges), negated)


def _class_matches(node: Any, ch: str) -> bool:
    _, chars, ranges, negated = node
    hit = ch in chars or any(lo <= ch <= hi for lo, hi in ranges)
    return hit != negated


@dataclass(slots=True)
class _Compiled:
    """BNF form for Earley: productions per nonterminal; symbols are str (nonterminal) or terminal nodes."""

    productions: dict[str, list[tuple[Any, ...]]]
    nullable: set[str]


def _compile(grammar: Grammar) -> _Compiled:
    productions: dict[str, list[tuple[Any, ...]]] = {}
    counter = [0]

    def fresh() -> str:
        counter[0] += 1
        return f"\x00{counter[0]}"

    def symbols(node: Any) -> list[Any]:
        tag = node[0]
        if tag == "lit":
            return [("cls", frozenset(ch), (), False) for ch in node[1]]
        if tag == "cls":
            return [node]
        if tag == "ref":
            return [node[1]]
        if tag == "seq":
            out: list[Any] = []
            for child in node[1]:
                out.extend(symbols(child))
            return out
        if tag == "alt":
            name = fresh()
            productions[name] = [tuple(symbols(child)) for child in node[1]]
            return [name]
        # repetition: N -> ε | N X (left recursion is Earley's friend)
        _, child, lo, hi = node
        inner = tuple(symbols(child))
        name = fresh()
        if hi == 1:
            productions[name] = [(), inner]
            return [name] if lo == 0 else list(inner)
        productions[name] = [(), (name, *inner)]
        return [name] if lo == 0 else [*inner, name]

    for rule, node in grammar.rules.items():
        productions[rule] = [tuple(symbols(node))] if node[0] != "alt" else []
        if node[0] == "alt":
            productions[rule] = [tuple(symbols(child)) for child in node[1]]
    nullable: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, prods in productions.items():
            if name not in nullable and any(
                all(isinstance(s, str) and s in nullable for s in prod) for prod in prods
            ):
                nullable.add(name)
                changed = True
    return _Compiled(productions, nullable)


@lru_cache(maxsize=64)
def _compiled_for(text: str) -> _Compiled:
    return _compile(parse_ebnf(text))


def ebnf_accepts(grammar: str | Grammar, text: str) -> bool:
    """True when ``text`` is a complete sentence of ``grammar`` (starting at ``root``).

    An Earley recognizer over characters; ``O(n^3)`` worst case, fine for the few
    kilobytes of a tool call. Compiled grammars given as text are cached.
    """
    compiled = _compiled_for(grammar) if isinstance(grammar, str) else _compile(grammar)
    prods = compiled.productions
    nullable = compiled.nullable
    # item: (lhs, production index, dot, origin)
    chart: list[set[tuple[str, int, int, int]]] = [set() for _ in range(len(text) + 1)]
    chart[0] = {("\x00start", 0, 0, 0)}
    prods = {**prods, "\x00start": [("root",)]}
    for i in range(len(text) + 1):
        agenda = list(chart[i])
        seen = chart[i]
        while agenda:
            item = agenda.pop()
            lhs, pi, dot, origin = item
            prod = prods[lhs][pi]
            if dot < len(prod):
                sym = prod[dot]
                if isinstance(sym, str):
                    for k in range(len(prods[sym])):
                        new = (sym, k, 0, i)
                        if new not in seen:
                            seen.add(new)
                            agenda.append(new)
                    if sym in nullable:
                        new = (lhs, pi, dot + 1, origin)
                        if new not in seen:
                            seen.add(new)
                            agenda.append(new)
                elif i < len(text) and _class_matches(sym, text[i]):
                    chart[i + 1].add((lhs, pi, dot + 1, origin))
            else:
                for plhs, ppi, pdot, porigin in list(chart[origin]):
                    pprod = prods[plhs][ppi]
                    if pdot < len(pprod) and pprod[pdot] == lhs:
                        new = (plhs, ppi, pdot + 1, porigin)
                        if new not in seen:
                            seen.add(new)
                            agenda.append(new)
        if i < len(text) and not chart[i + 1]:
            return False
    return ("\x00start", 0, 1, 0) in chart[len(text)]


def ebnf_example(grammar: str | Grammar, max_depth: int = 64) -> str:
    """A short sentence of ``grammar``: first alternatives, minimal repetitions.

    The fallback the simulated engine writes when none of its own plans fits a grammar.
    Works for grammars whose first alternatives terminate (all grammars built here do).
    """
    parsed = parse_ebnf(grammar) if isinstance(grammar, str) else grammar

    def gen(node: Any, depth: int) -> str:
        if depth > max_depth:
            raise RequestError("ebnf: cannot derive an example (recursion too deep)")
        tag = node[0]
        if tag == "lit":
            return node[1]
        if tag == "cls":
            _, chars, ranges, negated = node
            if not negated:
                return min(chars) if chars else ranges[0][0]
            return next(ch for ch in "abcxyz0 " if _class_matches(node, ch))
        if tag == "ref":
            return gen(parsed.rules[node[1]], depth + 1)
        if tag == "seq":
            return "".join(gen(child, depth) for child in node[1])
        if tag == "alt":
            return gen(node[1][0], depth)
        _, child, lo, _hi = node
        return "".join(gen(child, depth) for _ in range(lo))

    return gen(parsed.rules["root"], 0)
