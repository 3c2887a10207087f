"""The EBNF grammars of this package rewritten in llguidance's Lark syntax.

:func:`to_lark` writes a GBNF grammar (as :mod:`deepseek_frontend.parsing.constraints` builds
it) in Lark, with the tokenizer's ``</think>`` as the special token llguidance sees rather than a
quoted literal it cannot match. The language is otherwise the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from deepseek_frontend.parsing.ebnf_parser import parse_ebnf, rule_refs
from deepseek_frontend.parsing.ebnf_text import THINK_END

__all__ = ["to_lark"]


def to_lark(grammar: str, special_tokens: Sequence[str] = (THINK_END,)) -> str:
    """``grammar`` (EBNF as this package builds it) in llguidance's Lark syntax, special tokens as tokens.

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
        return rule_refs({"_": node})

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
