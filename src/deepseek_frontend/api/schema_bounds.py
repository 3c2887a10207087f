"""What a client's JSON schema demands of the output, bounded before any engine sees it.

A schema is a promise the model must keep within the request's ``max_tokens``: ``minItems:
1000000000`` asks for a billion array items, ``minLength: 1e12`` for a terabyte string. No model
can write them, a decoding grammar built from them never lets the model finish, and a simulated
model that tried would stop the server. :func:`output_demands` reads a schema once (the result is
cached with the schema's validation, api/schemas.py) and lists every place that makes the output
long, with the fewest characters a valid value there needs; :func:`check_output_budget` then
refuses a schema one of whose places needs more characters than ``max_tokens`` tokens can hold.

The figure is a lower bound, never a guess: the shortest JSON text valid against the schema, as
far as these keywords go -- ``minLength`` (one character each), ``minItems`` / ``minContains``
(times the shortest item, plus commas), ``minProperties`` and ``required`` (the shortest members),
``const`` and ``enum`` (the shortest value), integer bounds (their digits); ``anyOf`` / ``oneOf``
take their shortest branch, ``allOf`` and ``$ref`` their longest part, a ``$ref`` cycle counts as
nothing. One token holds at most :data:`MAX_CHARS_PER_TOKEN` characters (the longest token of the
DeepSeek vocabularies is 128 characters), so a schema is refused only when no tokenization at all
could fit it: the check never refuses a schema a model could meet.

Limits that hold whatever ``max_tokens`` says (the decoding grammar's own limits, see
parsing/schema_grammar.py): integers whose bounds force more than
:data:`~deepseek_frontend.parsing.ebnf_text.MAX_INT_DIGITS` digits (``minimum: 1e20`` with
``type: integer``), more than :data:`MAX_ENUM_VALUES` values in one ``enum``, and more than
:data:`MAX_LITERAL_CHARS` characters of ``enum`` and ``const`` values in one schema (each is a
literal in the grammar).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from deepseek_frontend.errors import RequestError
from deepseek_frontend.parsing.ebnf_text import MAX_INT_DIGITS
from deepseek_frontend.parsing.schema_grammar import resolve_local_ref

__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "MAX_ENUM_VALUES",
    "MAX_LITERAL_CHARS",
    "MAX_OUTPUT_TOKENS",
    "Demand",
    "check_output_budget",
    "json_path",
    "output_demands",
]

#: the longest output any served model can write: DeepSeek-V4's context, 1M tokens (the budget of
#: tool parameters -- a declared tool need not be called -- and of answers without a limit)
MAX_OUTPUT_TOKENS = 1_048_576
#: the most characters one token can carry (the DeepSeek-V3.2/V4 vocabularies' longest tokens are
#: 128 dots or spaces): a text of N characters takes at least N / 128 tokens
MAX_CHARS_PER_TOKEN = 128
#: most values one ``enum`` may list (each is an alternative of the decoding grammar)
MAX_ENUM_VALUES = 10_000
#: most characters of ``enum`` and ``const`` values one schema may carry (each is a grammar literal)
MAX_LITERAL_CHARS = 1_000_000
#: places needing fewer characters than this are not listed (no max_tokens is that small)
_LISTED_FROM = 256


@dataclass(frozen=True, slots=True)
class Demand:
    """A place in a schema whose values need at least ``chars`` characters: ``keyword`` at
    ``parts`` (the path inside the schema), ``value`` the keyword's value (for the message)."""

    parts: tuple[str | int, ...]
    keyword: str
    value: Any
    chars: int


class _SchemaLimit(Exception):
    """A limit that holds whatever ``max_tokens`` says: (path parts, message)."""

    def __init__(self, parts: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.parts = parts
        self.message = message


def _count(value: Any) -> int:
    """A count keyword's value as an int (the meta-schema admits ``1e9``, a float); 0 if not a count."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(0, int(value))


def _json_len(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return 1


class _Reader:
    """One walk over a schema: the fewest characters of each node's values, and the demands."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.demands: list[Demand] = []
        self.literal_chars = 0
        #: id(node) -> fewest characters (None while the node is being read: a $ref cycle)
        self._memo: dict[int, int | None] = {}

    def node(self, schema: Any, parts: tuple[str | int, ...]) -> int:
        if not isinstance(schema, Mapping):
            return 0 if schema is False else 1
        key = id(schema)
        if key in self._memo:
            return self._memo[key] or 0  # a cycle counts as nothing: a lower bound
        self._memo[key] = None
        chars = self._read(schema, parts)
        self._memo[key] = chars
        return chars

    def _note(self, parts: tuple[str | int, ...], keyword: str, value: Any, chars: int) -> None:
        if chars >= _LISTED_FROM:
            self.demands.append(Demand(parts, keyword, value, chars))

    def _read(self, schema: Mapping[str, Any], parts: tuple[str | int, ...]) -> int:
        lower = 1
        ref = schema.get("$ref")
        if isinstance(ref, str):
            target = resolve_local_ref(self.root, ref)
            if target is not None:
                lower = max(lower, self.node(target, (*parts, "$ref")))
        if "const" in schema:
            size = _json_len(schema["const"])
            self._literal(parts, "const", size)
            self._note(parts, "const", "...", size)
            lower = max(lower, size)
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            if len(enum) > MAX_ENUM_VALUES:
                raise _SchemaLimit(
                    (*parts, "enum"), f"{len(enum)} values; at most {MAX_ENUM_VALUES} are allowed in one enum"
                )
            sizes = [_json_len(v) for v in enum]
            self._literal(parts, "enum", sum(sizes))
            self._note(parts, "enum", "...", min(sizes))
            lower = max(lower, min(sizes))
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                shortest = min(self.node(o, (*parts, key, i)) for i, o in enumerate(options))
                lower = max(lower, shortest)
        parts_all = schema.get("allOf")
        if isinstance(parts_all, list):
            for i, part in enumerate(parts_all):
                lower = max(lower, self.node(part, (*parts, "allOf", i)))
        typ = schema.get("type")
        types = [t for t in typ if isinstance(t, str)] if isinstance(typ, list) else [typ]
        typed = [self._typed(schema, t, parts) for t in types]
        return max(lower, min(typed) if typed else 1)

    def _literal(self, parts: tuple[str | int, ...], keyword: str, size: int) -> None:
        self.literal_chars += size
        if self.literal_chars > MAX_LITERAL_CHARS:
            raise _SchemaLimit(
                (*parts, keyword),
                f"the schema's enum and const values exceed {MAX_LITERAL_CHARS} characters "
                "(each is a literal of the decoding grammar)",
            )

    def _typed(self, schema: Mapping[str, Any], typ: Any, parts: tuple[str | int, ...]) -> int:
        """The fewest characters of a value of type ``typ`` (None: inferred as the grammar does)."""
        if typ is None:
            if any(k in schema for k in ("properties", "required", "minProperties")):
                typ = "object"
            elif any(k in schema for k in ("items", "prefixItems", "minItems", "contains")):
                typ = "array"
            elif "minLength" in schema:
                typ = "string"
        if typ == "string":
            length = _count(schema.get("minLength"))
            chars = 2 + length
            self._note(parts, "minLength", schema.get("minLength"), chars)
            return chars
        if typ == "integer":
            return self._integer(schema, parts)
        if typ in ("boolean", "null"):
            return 4
        if typ == "array":
            return self._array(schema, parts)
        if typ == "object":
            return self._object(schema, parts)
        return 1

    def _integer(self, schema: Mapping[str, Any], parts: tuple[str | int, ...]) -> int:
        chars = 1
        for key, rounding in (
            ("minimum", math.ceil),
            ("exclusiveMinimum", math.floor),
            ("maximum", math.floor),
            ("exclusiveMaximum", math.ceil),
        ):
            bound = schema.get(key)
            if isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound):
                continue
            forced = (key.endswith("inimum") and bound > 0) or (key.endswith("aximum") and bound < 0)
            if not forced:
                continue
            digits = len(str(abs(int(rounding(bound)))))
            if digits > MAX_INT_DIGITS:
                raise _SchemaLimit(
                    (*parts, key),
                    f"{bound!r} forces integers of more than {MAX_INT_DIGITS} digits; integers are "
                    f"written with at most {MAX_INT_DIGITS} digits (past 2^53 most JSON readers lose "
                    "precision anyway: use a string)",
                )
            chars = max(chars, digits + (bound < 0))
        return chars

    def _array(self, schema: Mapping[str, Any], parts: tuple[str | int, ...]) -> int:
        items = schema.get("items")
        item = self.node(items, (*parts, "items")) if items is not None else 1
        prefix = schema.get("prefixItems")
        prefix_sizes = (
            [self.node(p, (*parts, "prefixItems", i)) for i, p in enumerate(prefix)]
            if isinstance(prefix, list)
            else []
        )
        count = _count(schema.get("minItems"))
        # the first items may follow prefixItems, the rest items
        fixed = sum(prefix_sizes[:count])
        chars = 2 + fixed + max(count - len(prefix_sizes), 0) * item + max(count - 1, 0)
        self._note(parts, "minItems", schema.get("minItems"), chars)
        contains = schema.get("contains")
        if contains is not None:
            times = _count(schema.get("minContains", 1))
            needed = 2 + times * self.node(contains, (*parts, "contains")) + max(times - 1, 0)
            self._note(parts, "minContains", schema.get("minContains"), needed)
            chars = max(chars, needed)
        return chars

    def _object(self, schema: Mapping[str, Any], parts: tuple[str | int, ...]) -> int:
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = schema.get("required")
        required = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
        members = 0
        for name, sub in props.items():
            size = self.node(sub, (*parts, "properties", name))
            if name in required:
                members += _json_len(name) + 1 + size
        extra = schema.get("additionalProperties")
        for name in required:
            if name not in props:
                members += _json_len(name) + 1 + self.node(extra, (*parts, "additionalProperties"))
        chars = 2 + members + max(len(required) - 1, 0)
        self._note(parts, "required", "...", chars)
        count = _count(schema.get("minProperties"))
        # distinct members: the shortest is '"":0' (4 characters), plus a comma between two
        by_count = 2 + 4 * count + max(count - 1, 0)
        self._note(parts, "minProperties", schema.get("minProperties"), by_count)
        return max(chars, by_count)


def json_path(base: str, parts: tuple[str | int, ...] | list[str | int]) -> str:
    """``base`` extended by object keys (``.key``) and array indexes (``[i]``)."""
    out = [base]
    for part in parts:
        out.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(out)


def output_demands(schema: Mapping[str, Any]) -> tuple[tuple[str | int, ...], str] | tuple[Demand, ...]:
    """The schema's demands on the output, deepest places first -- or ``(path parts, message)``
    for a limit that holds whatever ``max_tokens`` says. The schema must be valid (api/schemas.py)."""
    reader = _Reader(schema)
    try:
        reader.node(schema, ())
    except _SchemaLimit as limit:
        return limit.parts, limit.message
    except RecursionError:  # validation caps nesting at 64 levels; $ref chains are memoised
        return (), "schema is too deeply nested to be written"
    # post-order: a place is listed after every place inside it
    return tuple(reader.demands)


def check_output_budget(demands: tuple[Demand, ...], path: str, max_tokens: int, why: str) -> None:
    """``RequestError`` for the first of ``demands`` (the deepest) that needs more characters than
    ``max_tokens`` tokens can hold; ``path`` is where the schema sits in the request, ``why`` says
    where ``max_tokens`` came from (``"the request's max_tokens"``, ``"the context length"``)."""
    most = max_tokens * MAX_CHARS_PER_TOKEN
    for demand in demands:
        if demand.chars > most:
            where = json_path(path, (*demand.parts, demand.keyword))
            shown = "" if demand.value == "..." else f" {demand.value!r}"
            raise RequestError(
                f"{where}:{shown} needs a value of at least {demand.chars} characters, more than "
                f"{max_tokens} tokens can hold ({why}; at most {MAX_CHARS_PER_TOKEN} characters a "
                f"token, {most} characters)",
                param=where,
            )
