"""Checking and deriving sentences of a GBNF grammar in-process: an Earley recognizer.

:func:`ebnf_accepts` says whether a text is a complete sentence of a grammar (the EBNF subset
:mod:`deepseek_frontend.parsing.ebnf_parser` reads); :func:`ebnf_example` derives a short
sentence. The simulated engine uses both to make its output satisfy the grammar it was given,
and tests use them to check that canonical calls are accepted and wrong ones rejected. Pure: no
I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from deepseek_frontend.errors import RequestError
from deepseek_frontend.parsing.ebnf_parser import Grammar, parse_ebnf

__all__ = ["ebnf_accepts", "ebnf_example"]


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
