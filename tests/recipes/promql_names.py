"""What a PromQL expression names: metric selectors with their label matchers, and grouping labels.

Not a full PromQL parser: enough to check a dashboard's or a rule file's queries against the names a
``/metrics`` scrape exports. It tokenizes the expression, checks that brackets balance and that every
function called is a PromQL function, and reads each selector ``name{label op "value", ...}`` and each
``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` label list. Grafana variables
(``$model``, ``$__rate_interval``) may appear in strings and range brackets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"""\s+|(?P<str>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')"""
    r"""|(?P<range>\[[^\[\]]*\])"""
    r"""|(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?(?:ms|[smhdwy])?)"""
    r"""|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)"""
    r"""|(?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=,(){}])"""
)
GROUPING = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset"})
FUNCTIONS = frozenset(
    {
        "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
        "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv",
        "histogram_quantile", "histogram_count", "histogram_sum", "histogram_fraction",
        "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
        "last_over_time", "quantile_over_time", "present_over_time", "absent", "absent_over_time",
        "abs", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max", "vector", "scalar",
        "label_replace", "label_join", "time", "timestamp", "changes", "resets", "sort", "sort_desc",
    }
)  # fmt: skip


@dataclass
class Selector:
    """``metric{label op "value", ...}``: the metric name ('' for ``{...}`` alone) and its matchers as
    (label, operator, value without quotes)."""

    metric: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        return [label for label, _, _ in self.matchers]

    def matchers_of(self, label: str) -> list[tuple[str, str]]:
        """(operator, value) of this selector's matchers on ``label``."""
        return [(op, value) for name, op, value in self.matchers if name == label]


@dataclass
class Names:
    """``selectors``: every metric selector; ``grouping``: labels of by/on/... lists."""

    selectors: list[Selector] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


class PromQLError(ValueError):
    """The expression does not tokenize, its brackets do not balance, or it calls an unknown function."""


def _tokens(expr: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None or match.end() == pos:
            raise PromQLError(f"unexpected {expr[pos : pos + 20]!r} at {pos}")
        pos = match.end()
        if match.lastgroup is not None:
            out.append((match.lastgroup, match.group()))
    return out


def _unquote(text: str) -> str:
    """A PromQL string literal's value (the escapes a label value needs: quotes and backslashes)."""
    return re.sub(r"\\(.)", r"\1", text[1:-1])


def names(expr: str) -> Names:
    """The metric selectors and grouping labels of ``expr`` (raises PromQLError when it is malformed)."""
    toks = _tokens(expr)
    stack: list[str] = []
    for kind, text in toks:
        if kind == "op" and text in "({":
            stack.append(text)
        elif kind == "op" and text in ")}" and (not stack or stack.pop() != {")": "(", "}": "{"}[text]):
            raise PromQLError(f"unbalanced {text!r} in {expr!r}")
    if stack:
        raise PromQLError(f"unclosed {stack[-1]!r} in {expr!r}")
    found = Names()
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1][1] if i + 1 < len(toks) else ""
        if kind == "ident" and text in GROUPING:
            if following == "(":
                i += 2
                while toks[i][1] != ")":
                    if toks[i][0] == "ident":
                        found.grouping.add(toks[i][1])
                    i += 1
            i += 1
        elif kind == "ident" and text in KEYWORDS:
            i += 1
        elif kind == "ident" and (following == "(" or following in GROUPING):
            # a call, or an aggregation with its grouping first: ``sum by (le) (...)``
            if text not in FUNCTIONS:
                raise PromQLError(f"unknown function {text!r} in {expr!r}")
            i += 1
        elif kind == "ident" or (kind == "op" and text == "{"):
            metric = text if kind == "ident" else ""
            i += 1 if kind == "ident" else 0
            selector = Selector(metric)
            if i < len(toks) and toks[i][1] == "{":
                i += 1
                while toks[i][1] != "}":
                    name, op, value = toks[i], toks[i + 1], toks[i + 2]
                    if name[0] != "ident" or op[1] not in ("=", "!=", "=~", "!~") or value[0] != "str":
                        raise PromQLError(f"bad label matcher near {name[1]!r} in {expr!r}")
                    selector.matchers.append((name[1], op[1], _unquote(value[1])))
                    i += 3
                    if toks[i][1] == ",":
                        i += 1
                i += 1
            found.selectors.append(selector)
        else:
            i += 1
    return found
