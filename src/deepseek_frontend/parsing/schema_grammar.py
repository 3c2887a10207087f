"""JSON Schema -> grammar rules: the JSON text of a value valid against a schema.

:class:`SchemaCompiler` turns a schema into GBNF rules (nested objects with their required
properties, typed and counted arrays, enums, const, anyOf / oneOf / allOf, type lists, bounded
integers, local ``$ref`` as one rule per target so recursive schemas give recursive grammars);
what has no grammar falls back to the generic ``json-value`` of
:data:`~deepseek_frontend.parsing.ebnf_text.JSON_RULES` and is listed in
:data:`UNENFORCED_KEYWORDS` (and docs/parsing.md). :func:`string_kind` says whether a schema's
values are strings, which decides a DSML parameter's raw or JSON form. :func:`resolve_local_ref`
follows a local JSON pointer; request validation uses it too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from deepseek_frontend.errors import RequestError
from deepseek_frontend.parsing.ebnf_text import MAX_INT_DIGITS, lit

__all__ = [
    "MAX_GRAMMAR_CHARS",
    "MAX_GRAMMAR_DEPTH",
    "MAX_GRAMMAR_WORK",
    "UNENFORCED_KEYWORDS",
    "GrammarTooLargeError",
    "SchemaCompiler",
    "resolve_local_ref",
    "string_kind",
]

#: an integer range this small is enumerated exactly; a larger one is bounded by sign and digit count
_MAX_ENUMERATED_INTS = 64

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
#: most schema nodes one grammar compiles: ``anyOf`` branches (each merged with its siblings),
#: ``type`` lists and ``$ref`` with siblings compile their subschemas once per branch, so nesting
#: them multiplies; a real tool or answer schema compiles a few hundred nodes
MAX_GRAMMAR_WORK = 20_000
#: most characters of rules one grammar may have
MAX_GRAMMAR_CHARS = 2_000_000
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
    return lit(json.dumps(value, ensure_ascii=False))


class GrammarTooLargeError(RequestError):
    """A schema whose grammar would pass :data:`MAX_GRAMMAR_WORK` or :data:`MAX_GRAMMAR_CHARS` (400)."""


class SchemaCompiler:
    """Turns JSON schemas into grammar rules; one instance per grammar (shares rule names).

    :meth:`value` returns an expression for the JSON text of a value valid against a schema,
    adding the rules it needs. Local ``$ref`` pointers become one rule each, so recursive
    schemas give recursive grammars. What cannot be expressed falls back to ``json-value``
    (see :data:`UNENFORCED_KEYWORDS`).
    """

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self.rule_refs: dict[tuple[int, str], str] = {}
        self._counter = 0
        self._work = 0
        self._chars = 0

    def add(self, stem: str, expr: str) -> str:
        """A new rule ``stem-N`` for ``expr``; returns its name."""
        self._counter += 1
        self._chars += len(expr)
        if self._chars > MAX_GRAMMAR_CHARS:
            raise GrammarTooLargeError(
                f"the decoding grammar of this schema would pass {MAX_GRAMMAR_CHARS} characters "
                "(enum and const values, anyOf / oneOf branches, type lists and $ref with siblings)"
            )
        name = f"{stem}-{self._counter}"
        self.rules[name] = expr
        return name

    def value(self, schema: Any, root: Mapping[str, Any], depth: int = 0) -> str:
        """The expression for a JSON value valid against ``schema``; raises
        :class:`GrammarTooLargeError` past the compiler's work or size limits."""
        if schema is True or not isinstance(schema, Mapping) or depth > MAX_GRAMMAR_DEPTH:
            return "json-value"
        self._work += 1
        if self._work > MAX_GRAMMAR_WORK:
            raise GrammarTooLargeError(
                f"the decoding grammar of this schema would compile more than {MAX_GRAMMAR_WORK} "
                "subschemas (anyOf / oneOf branches, type lists and $ref with siblings nested in "
                "each other multiply)"
            )
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
                return "(" + " | ".join(lit(str(v)) for v in range(lo, hi + 1)) + ")"
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
        if key not in self.rule_refs:
            # named before it is compiled, so a recursive reference finds the rule
            name = f"ref-{len(self.rule_refs) + 1}"
            self.rule_refs[key] = name
            self.rules[name] = "json-value"
            self.rules[name] = self.value(target, root, depth + 1)
        return self.rule_refs[key]

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


def string_kind(
    schema: Any, root: Mapping[str, Any], depth: int = 0, _seen: dict[int, str] | None = None
) -> str:
    """Whether values of ``schema`` are strings: ``"only"``, ``"maybe"`` or ``"never"``.

    DeepSeek's encoder writes a parameter raw with ``string="true"`` exactly when its value is
    a string, so the grammar offers the raw form where the schema admits strings and the JSON
    form where it admits anything else.
    """
    if not isinstance(schema, Mapping) or depth > MAX_GRAMMAR_DEPTH:
        return "never" if schema is False else "maybe"
    # each $ref target is read once: $defs referring to each other twice per level would
    # otherwise be walked 2^depth times
    seen: dict[int, str] = {} if _seen is None else _seen
    if isinstance(schema.get("$ref"), str):
        target = resolve_local_ref(root, schema["$ref"])
        if target is None:
            return "maybe"
        key = id(target)
        if key not in seen:
            seen[key] = "maybe"  # a cycle reads as maybe
            seen[key] = string_kind(target, root, depth + 1, seen)
        return seen[key]
    if "const" in schema:
        return "only" if isinstance(schema["const"], str) else "never"
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        strs = sum(isinstance(v, str) for v in enum)
        return "only" if strs == len(enum) else "maybe" if strs else "never"
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            kinds = {string_kind(o, root, depth + 1, seen) for o in options}
            return kinds.pop() if len(kinds) == 1 else "maybe"
    typ = schema.get("type")
    if isinstance(typ, str):
        return "only" if typ == "string" else "never"
    if isinstance(typ, list):
        return "only" if typ == ["string"] else "maybe" if "string" in typ else "never"
    if any(k in schema for k in (*_OBJECT_KEYS, "items")):
        return "never"
    return "maybe"
