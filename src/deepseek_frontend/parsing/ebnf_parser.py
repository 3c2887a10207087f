"""Reading GBNF text back: the EBNF subset this package emits, parsed into a :class:`Grammar`.

:func:`parse_ebnf` reads rules, quoted literals, character classes, grouping, ``|``, ``*``,
``+`` and ``?`` (exactly what the grammar builders write) and raises :class:`RequestError` on
anything else or on a rule used but not defined. The AST of each rule is nested tuples::

    ("lit", str) | ("cls", frozenset[str], ((lo, hi), ...), negated) | ("ref", name)
    | ("seq", [nodes]) | ("alt", [nodes]) | ("rep", node, min, max_or_None)

:func:`rule_refs` lists the rule names a set of rules refers to. The recognizer and the Lark
writer both start from this AST.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deepseek_frontend.errors import RequestError

__all__ = ["Grammar", "parse_ebnf", "rule_refs"]


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
    """Parse the GBNF subset the grammar builders emit. Raises RequestError."""
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
    for name in rule_refs(rules):
        if name not in rules:
            raise RequestError(f"ebnf: rule {name!r} is used but not defined")
    return Grammar(rules)


def rule_refs(rules: Mapping[str, Any]) -> set[str]:
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
