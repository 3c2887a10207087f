"""Writing GBNF text: quoted literals, "text without a stop string", and the shared rules.

Every grammar this package builds is EBNF in the GBNF dialect (SGLang's ``ebnf`` field, vLLM's
``structured_outputs.grammar``; xgrammar and llguidance both compile it). This module owns the
pieces of that text every grammar shares: :func:`lit` quotes a literal, :func:`text_without`
spells free text that cannot contain a closing tag, :data:`THINK_RULE` is the free reasoning
closed by ``</think>`` and :data:`JSON_RULES` is generic JSON with bounded whitespace and digits.
"""

from __future__ import annotations

__all__ = ["JSON_RULES", "MAX_INT_DIGITS", "THINK_END", "THINK_RULE", "lit", "text_without"]

THINK_END = "</think>"


def lit(text: str) -> str:
    """A GBNF double-quoted literal."""
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + out.replace("\t", "\\t") + '"'


def _cls_char(ch: str) -> str:
    if ch in "\\]^-[":
        return "\\" + ch
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, ch)


def text_without(stop: str) -> str:
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
    prefixes = [lit(rest[:k]) for k in range(1, len(rest))]
    bare_run = f"{lit(head)} ({' | '.join(prefixes)})?" if prefixes else lit(head)
    # runs followed by a character that breaks the match
    broken = [f"[^{_cls_char(rest[0])}{_cls_char(head)}]"]
    broken += [f"{lit(rest[:k])} [^{_cls_char(rest[k])}{_cls_char(head)}]" for k in range(1, len(rest))]
    return f"({plain} | ({bare_run})* {lit(head)} ({' | '.join(broken)}))* ({bare_run})*"


#: free reasoning closed by ``</think>``, one rule: llguidance lexes a rule made of terminals as
#: one greedy lexeme, and a separate text lexeme could swallow ``</think`` and then get stuck
THINK_RULE = f"think ::= {text_without(THINK_END)} {lit(THINK_END)}"

#: generic JSON. ``ws`` is at most one space: exactly what ``json.dumps`` writes after ``,`` and
#: ``:`` (DeepSeek's encoder and most models) or nothing (compact JSON); unbounded whitespace
#: lets a constrained model pad forever, which random-weight and weak models do.
JSON_RULES = r"""
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


def _digit_rules(longest: int) -> list[str]:
    """``digits-N ::= ( [0-9] digits-(N-1) )?``: up to N digits, one flat rule per count (no nesting)."""
    rules = ["digits-1 ::= [0-9]?"]
    rules += [f"digits-{n} ::= ( [0-9] digits-{n - 1} )?" for n in range(2, longest + 1)]
    return rules


JSON_RULES = "\n".join([JSON_RULES, *_digit_rules(MAX_INT_DIGITS - 1)])
