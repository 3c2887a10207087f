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
follows the property's schema recursively. EOS after the block is the engine's business.
DeepSeek-V3.2 spells the block ``function_calls``, V4.1 `` calls`` (and its element names after
a space); everything else is shared.

:func:`build_structured_output_constraint` is the JSON answer of ``response_format``: in thinking
mode ``think`` then the value, so the reasoning stays free. Schemas must have passed
:func:`deepseek_frontend.api.schemas.check_json_schema` first.

This module assembles the constraints and is where callers import every public name from; the
pieces live beside it in :mod:`deepseek_frontend.parsing`:

* ``tool_choice`` -- :func:`normalize_tool`, :func:`resolve_tool_choice`: the allowed tools.
* ``ebnf_text`` -- GBNF literals, text without a closing tag, the shared ``think`` and JSON rules.
* ``schema_grammar`` -- JSON Schema to rules (nested objects, arrays, enums, local ``$ref``;
  what has no grammar is :data:`UNENFORCED_KEYWORDS`, listed in docs/parsing.md).
* ``tool_call_grammar`` -- the DSML calls block per family (:data:`BLOCK_NAMES`).
* ``lark_grammar`` -- :func:`to_lark`: the same grammar in llguidance's Lark syntax, with
  ``</think>`` as the special token llguidance sees.
* ``ebnf_parser`` / ``ebnf_recognizer`` -- :func:`parse_ebnf` reads the EBNF subset written
  here; :func:`ebnf_accepts` (an Earley recognizer) and :func:`ebnf_example` check and derive
  its sentences in-process, for the simulated engine and the tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from deepseek_frontend.errors import RequestError
from deepseek_frontend.generation import DecodingConstraint
from deepseek_frontend.parsing.ebnf_parser import Grammar, parse_ebnf
from deepseek_frontend.parsing.ebnf_recognizer import ebnf_accepts, ebnf_example
from deepseek_frontend.parsing.ebnf_text import JSON_RULES, THINK_RULE
from deepseek_frontend.parsing.lark_grammar import to_lark
from deepseek_frontend.parsing.schema_grammar import (
    MAX_GRAMMAR_DEPTH,
    UNENFORCED_KEYWORDS,
    SchemaCompiler,
    resolve_local_ref,
)
from deepseek_frontend.parsing.tool_call_grammar import BLOCK_NAMES, block_rules
from deepseek_frontend.parsing.tool_choice import normalize_tool, resolve_tool_choice

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


def build_tool_call_constraint(
    family: str, tools: Sequence[Mapping[str, Any]], tool_choice: Any, *, thinking: bool
) -> DecodingConstraint:
    """An ``ebnf`` constraint forcing at least one DSML call to an allowed tool.

    ``family`` picks the block spelling (:data:`BLOCK_NAMES`); ``tool_choice`` is
    ``"required"``/``"any"`` or a named choice (see :func:`resolve_tool_choice`);
    ``thinking`` says the prompt ended with ``<think>``, so the output starts with
    reasoning closed by ``</think>``. The calls block starts right at the answer: no
    whitespace before it (it would come back as ``content`` of spaces). Every parameter's
    value follows its JSON schema recursively (see :class:`SchemaCompiler`). The tool
    schemas must have passed :func:`deepseek_frontend.api.schemas.check_json_schema`.
    Raises :class:`RequestError` when the choice or the tools cannot be turned into a grammar.
    """
    normalized = [normalize_tool(t) for t in tools]
    allowed = resolve_tool_choice(tool_choice, [n for n, _ in normalized])
    compiler = SchemaCompiler()
    rules = [f"root ::= {'think ' if thinking else ''}block"]
    rules.extend(block_rules(family, normalized, allowed, compiler))
    rules.extend(f"{n} ::= {e}" for n, e in compiler.rules.items())
    if thinking:
        rules.append(THINK_RULE)
    rules.append(JSON_RULES)
    return DecodingConstraint(kind="ebnf", value="\n".join(rules) + "\n")


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
    compiler = SchemaCompiler()
    value = compiler.value(schema, schema) if schema is not None else "json-object"
    answer = f"( {value} | block )" if tools else value
    rules = [f"root ::= {'think ' if thinking else ''}{answer}"]
    if tools:
        normalized = [normalize_tool(t) for t in tools]
        rules.extend(block_rules(family or "", normalized, [n for n, _ in normalized], compiler))
    rules.extend(f"{n} ::= {e}" for n, e in compiler.rules.items())
    if thinking:
        rules.append(THINK_RULE)
    rules.append(JSON_RULES)
    return DecodingConstraint(kind="ebnf", value="\n".join(rules) + "\n")
