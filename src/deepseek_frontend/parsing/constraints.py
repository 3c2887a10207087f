"""Decoding constraints the frontend hands to an engine: tool-call grammars and JSON schemas.

``tool_choice`` ``"required"`` (or Anthropic ``"any"``) and a named tool are enforced by
constrained decoding: :func:`build_tool_call_constraint` turns the request's tool schemas
into an EBNF grammar in the GBNF / xgrammar dialect that SGLang's ``ebnf`` sampling field
takes. The grammar describes the whole completion the model writes after the prompt::

    root      ::= think? ws block          (think only in thinking mode, where it is required)
    think     ::= <text without "</think>"> "</think>"
    block     ::= "<｜DSML｜tool_calls>\\n" invoke+ "</｜DSML｜tool_calls>"
    invoke    ::= one alternative per allowed tool:
                  "<｜DSML｜invoke name=\\"NAME\\">\\n" param... "</｜DSML｜invoke>\\n"
    param     ::= "<｜DSML｜parameter name=\\"P\\" string=\\"true\\">" <text> "</｜DSML｜parameter>\\n"
                | "<｜DSML｜parameter name=\\"P\\" string=\\"false\\">" <JSON value> "</｜DSML｜parameter>\\n"

Parameters appear in schema property order; required ones must appear, others are optional
(the order restriction is what lets a context-free grammar enforce ``required``). String
parameters take free text that cannot contain the closing tag; other types take a JSON
value narrowed by the property's type (integer, number, boolean, enum, const, else any JSON).
EOS after the block is the engine's business. DeepSeek-V3.2 spells the block
``function_calls`` instead of ``tool_calls``; everything else is shared.

:func:`ebnf_accepts` is a small Earley recognizer for exactly the EBNF subset this module
emits (rules, quoted literals, character classes, grouping, ``|``, ``*``, ``+``, ``?``).
The simulated engine uses it to make its output satisfy the grammar, and tests use it to
check that canonical calls are accepted and wrong ones rejected. It is pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from deepseek_frontend.engines.base import DecodingConstraint
from deepseek_frontend.errors import RequestError

__all__ = [
    "BLOCK_NAMES",
    "Grammar",
    "build_json_schema_constraint",
    "build_tool_call_constraint",
    "ebnf_accepts",
    "ebnf_example",
    "normalize_tool",
    "parse_ebnf",
    "resolve_tool_choice",
]

#: the DSML block name per family (the only spelling that differs between V4 and V3.2)
BLOCK_NAMES: dict[str, str] = {
    "deepseek_v4": "tool_calls",
    "deepseek_v41": "tool_calls",
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

    Requires that ``stop[0]`` does not occur again in ``stop`` (true for the closing tags
    used here). Then the text splits at each ``stop[0]`` into pieces; a piece after a
    ``stop[0]`` must not start with ``stop[1:]``, which the nested alternatives spell out:
    after matching ``stop[1:k]`` the next character must differ from ``stop[k]``.
    """
    head = stop[0]
    assert head not in stop[1:], stop
    plain = f"[^{_cls_char(head)}]"
    rest = stop[1:]
    piece = ""
    # build from the innermost level outwards: level k = "after stop[1:k] matched"; each level
    # is optional (the text may end there) -- written with ``?`` rather than an empty literal
    for k in range(len(rest) - 1, -1, -1):
        ch = rest[k]
        mismatch = f"[^{_cls_char(ch)}{_cls_char(head)}] {plain}*"
        alts = [mismatch, f"{_lit(ch)} {piece}"] if piece else [mismatch]
        piece = "(" + " | ".join(alts) + ")?"
    return f"{plain}* ({_lit(head)} {piece})*"


_JSON_RULES = r"""
json-value ::= json-object | json-array | json-string | json-number | "true" | "false" | "null"
json-object ::= "{" ws ( json-member ( "," ws json-member )* )? "}"
json-member ::= json-string ws ":" ws json-value ws
json-array ::= "[" ws ( json-value ws ( "," ws json-value ws )* )? "]"
json-string ::= "\"" ( [^"\\\n] | "\\" ( ["\\/bfnrt] | "u" hex hex hex hex ) )* "\""
hex ::= [0-9a-fA-F]
json-int ::= "-"? ( "0" | [1-9] [0-9]* )
json-number ::= json-int ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n]*
""".strip()


#: JSON-schema ``type`` -> grammar expression for a non-string parameter of that type (others: any JSON value)
_TYPE_EXPRS = {
    "integer": "json-int",
    "number": "json-number",
    "boolean": '("true" | "false")',
    "null": '"null"',
    "array": "json-array",
    "object": "json-object",
}


def _value_expr(schema: Mapping[str, Any]) -> str:
    """Grammar expression for the JSON text of a non-string parameter."""
    if "const" in schema:
        return _lit(json.dumps(schema["const"], ensure_ascii=False))
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return "(" + " | ".join(_lit(json.dumps(v, ensure_ascii=False)) for v in schema["enum"]) + ")"
    typ = schema.get("type")
    return _TYPE_EXPRS.get(typ, "json-value") if isinstance(typ, str) else "json-value"


def _is_string_param(schema: Mapping[str, Any]) -> bool:
    """DSV4 writes a parameter with ``string="true"`` exactly when its type is string."""
    return schema.get("type") == "string"


def build_tool_call_constraint(
    family: str, tools: Sequence[Mapping[str, Any]], tool_choice: Any, *, thinking: bool
) -> DecodingConstraint:
    """An ``ebnf`` constraint forcing at least one DSML call to an allowed tool.

    ``family`` picks the block spelling (:data:`BLOCK_NAMES`); ``tool_choice`` is
    ``"required"``/``"any"`` or a named choice (see :func:`resolve_tool_choice`);
    ``thinking`` says the prompt ended with ``<think>``, so the output starts with
    reasoning closed by ``</think>``. Raises :class:`RequestError` when the choice or the
    tools cannot be turned into a grammar.
    """
    if family not in BLOCK_NAMES:
        raise RequestError(f"no tool-call grammar for model family {family!r}", param="tool_choice")
    block = BLOCK_NAMES[family]
    normalized = [normalize_tool(t) for t in tools]
    allowed = resolve_tool_choice(tool_choice, [n for n, _ in normalized])
    rules: list[str] = []
    think = f"think-text {_lit(_THINK_END)} " if thinking else ""
    rules.append(f"root ::= {think}[ \\n]* block")
    rules.append(f"block ::= {_lit(f'<{_DSML}{block}>' + chr(10))} invoke+ {_lit(f'</{_DSML}{block}>')}")
    invoke_alts: list[str] = []
    for index, (name, params) in enumerate(normalized):
        if name not in allowed:
            continue
        rule = f"invoke-{index}"
        invoke_alts.append(rule)
        props = params.get("properties") or {}
        required = set(params.get("required") or [])
        parts: list[str] = []
        for pname, pschema in props.items():
            pschema = pschema if isinstance(pschema, Mapping) else {}
            is_str = _is_string_param(pschema)
            flag = "true" if is_str else "false"
            opening = _lit(f'<{_DSML}parameter name="{pname}" string="{flag}">')
            if is_str and isinstance(pschema.get("enum"), list) and pschema["enum"]:
                # string enums are written raw (string="true"), so the literals are the values
                value = "(" + " | ".join(_lit(str(v)) for v in pschema["enum"]) + ")"
            else:
                value = "param-text" if is_str else _value_expr(pschema)
            item = f"{opening} {value} {_lit(f'</{_DSML}parameter>' + chr(10))}"
            parts.append(f"({item})" if pname in required else f"({item})?")
        body = " ".join(parts) if parts else ""
        opening = _lit(f'<{_DSML}invoke name="{name}">\n')
        closing = _lit(f"</{_DSML}invoke>\n")
        rules.append(" ".join(x for x in (f"{rule} ::=", opening, body, closing) if x))
    rules.insert(2, "invoke ::= " + " | ".join(invoke_alts))
    if thinking:
        rules.append(f"think-text ::= {_text_without(_THINK_END)}")
    rules.append(f"param-text ::= {_text_without(f'</{_DSML}parameter>')}")
    rules.append(_JSON_RULES)
    return DecodingConstraint(kind="ebnf", value="\n".join(rules) + "\n")


def build_json_schema_constraint(schema: Mapping[str, Any]) -> DecodingConstraint:
    """A ``json_schema`` constraint (SGLang takes the schema as a JSON string)."""
    if not isinstance(schema, Mapping):
        raise RequestError("response_format.json_schema.schema must be an object", param="response_format")
    return DecodingConstraint(kind="json_schema", value=json.dumps(schema, ensure_ascii=False))


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
