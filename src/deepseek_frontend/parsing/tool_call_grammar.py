"""The DSML calls block as grammar rules, spelled per model family.

:func:`block_rules` writes ``block`` (one calls block of at least one call to an allowed tool),
one ``invoke-N`` rule per allowed tool and ``param-text``. A parameter whose schema admits
strings gets the raw form (``string="true"``, free text or its literal enum / const values), one
admitting anything else the JSON form (``string="false"``, the value compiled by
:class:`~deepseek_frontend.parsing.schema_grammar.SchemaCompiler`); parameters appear in schema
property order and the required ones must appear. :data:`BLOCK_NAMES` is the only thing that
differs between families: DeepSeek-V3.2 spells the block ``function_calls``, V4.1 `` calls``
(and its element names after a space).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deepseek_frontend.errors import RequestError
from deepseek_frontend.parsing.ebnf_text import lit, text_without
from deepseek_frontend.parsing.schema_grammar import (
    MAX_GRAMMAR_DEPTH,
    SchemaCompiler,
    resolve_local_ref,
    string_kind,
)

__all__ = ["BLOCK_NAMES", "block_rules"]

#: the DSML block name per family; V4.1 also writes its element names after a space
#: (``<｜DSML｜ calls>``, ``<｜DSML｜ invoke``, ``<｜DSML｜ parameter``)
BLOCK_NAMES: dict[str, str] = {
    "deepseek_v4": "tool_calls",
    "deepseek_v41": " calls",
    "deepseek_v32": "function_calls",
}
_DSML = "｜DSML｜"


def _raw_string_expr(schema: Any, root: Mapping[str, Any]) -> str:
    """The raw (``string="true"``) text of a string parameter: literal enum/const values or free text."""
    for _ in range(MAX_GRAMMAR_DEPTH):
        if isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
            schema = resolve_local_ref(root, schema["$ref"])
    if isinstance(schema, Mapping):
        if isinstance(schema.get("const"), str):
            return lit(schema["const"])
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and any(isinstance(v, str) for v in enum):
            return "(" + " | ".join(lit(v) for v in enum if isinstance(v, str)) + ")"
    return "param-text"


def block_rules(
    family: str,
    normalized: Sequence[tuple[str, dict[str, Any]]],
    allowed: Sequence[str],
    compiler: SchemaCompiler,
) -> list[str]:
    """Rules ``block`` (one DSML calls block of calls to ``allowed`` tools), ``invoke-*``, ``param-text``."""
    if family not in BLOCK_NAMES:
        raise RequestError(f"no tool-call grammar for model family {family!r}", param="tool_choice")
    block = BLOCK_NAMES[family]
    space = " " if block.startswith(" ") else ""
    invoke, parameter = f"{space}invoke", f"{space}parameter"
    rules = [f"block ::= {lit(f'<{_DSML}{block}>' + chr(10))} invoke+ {lit(f'</{_DSML}{block}>')}"]
    invoke_alts: list[str] = []
    close_param = lit(f"</{_DSML}{parameter}>" + "\n")
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
            kind = string_kind(pschema, params)
            forms: list[str] = []
            if kind != "never":
                # its own rule, closing tag included: llguidance lexes a rule made only of terminals
                # as one lexeme; a free-text lexeme followed by a separate closing-tag lexeme would
                # greedily swallow a prefix of the tag and fail
                opening = lit(f'<{_DSML}{parameter} name="{pname}" string="true">')
                raw = f"{opening} {_raw_string_expr(pschema, params)} {close_param}"
                forms.append(compiler.add("raw", raw) if kind == "maybe" else raw)
            if kind != "only":
                opening = lit(f'<{_DSML}{parameter} name="{pname}" string="false">')
                forms.append(f"{opening} {compiler.value(pschema, params)} {close_param}")
            param_rule = compiler.add("param", " | ".join(forms))
            parts.append(param_rule if pname in required else f"{param_rule}?")
        opening = lit(f'<{_DSML}{invoke} name="{name}">\n')
        closing = lit(f"</{_DSML}{invoke}>\n")
        rules.append(" ".join((f"{rule} ::=", opening, *parts, closing)))
    rules.insert(1, "invoke ::= " + " | ".join(invoke_alts))
    rules.append(f"param-text ::= {text_without(f'</{_DSML}{parameter}>')}")
    return rules
