"""Schemas and tool lists every grammar test compiles: shared by the llguidance tests (main suite) and
the xgrammar tests (tests/real_engine/, run with the vLLM virtualenv's python).

Plain data and builders only (no pytest, no llguidance, no xgrammar imports), so both environments
can import it.
"""

from __future__ import annotations

import json
from typing import Any

from deepseek_frontend.engines.sim.model import _Hints, dsml_block, tool_arguments
from deepseek_frontend.parsing.constraints import (
    build_structured_output_constraint,
    build_tool_call_constraint,
)

NESTED_USER = {
    "type": "object",
    "properties": {
        "user": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            },
            "required": ["name", "age"],
        },
        "note": {"type": "string"},
    },
    "required": ["user"],
}

#: name -> parameters schema; every schema feature the grammar compiles (and some it falls back on)
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested_required": NESTED_USER,
    "types": {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "n": {"type": "number"},
            "b": {"type": "boolean"},
            "z": {"type": "null"},
            "maybe": {"type": ["integer", "null"]},
        },
        "required": ["s", "i", "n", "b", "z", "maybe"],
    },
    "enum_const": {
        "type": "object",
        "properties": {
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "level": {"enum": [1, 2, 3]},
            "mixed": {"enum": ["a", 1, None]},
            "version": {"const": "v1"},
            # quotes and backslashes must survive grammar-literal escaping
            "sep": {"enum": ["back\\slash", 'say "hi"', "tab\tnew\nline"]},
            "flags": {"const": {"x": [1, 2]}},
        },
        "required": ["unit", "level", "version", "sep"],
    },
    "arrays": {
        "type": "object",
        "properties": {
            "ids": {"type": "array", "items": {"type": "integer"}, "minItems": 1},
            "pair": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                    "required": ["x", "y"],
                },
            },
        },
        "required": ["ids", "pair"],
    },
    "any_of": {
        "type": "object",
        "properties": {
            "target": {
                "anyOf": [
                    {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
                    {"type": "string"},
                ]
            },
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
        "required": ["target"],
    },
    "refs_recursive": {
        "type": "object",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
                "required": ["value"],
            }
        },
        "properties": {"root": {"$ref": "#/$defs/Node"}},
        "required": ["root"],
    },
    "int_bounds": {
        "type": "object",
        "properties": {
            "small": {"type": "integer", "minimum": 1, "maximum": 5},
            "open": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3},
            "nonneg": {"type": "integer", "minimum": 0},
            "wide": {"type": "integer", "minimum": -1000, "maximum": 100000},
        },
        "required": ["small", "open", "nonneg", "wide"],
    },
    "map": {
        "type": "object",
        "properties": {"headers": {"type": "object", "additionalProperties": {"type": "string"}}},
        "required": ["headers"],
    },
    "all_of": {
        "type": "object",
        "properties": {
            "who": {
                "allOf": [
                    {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                    {"properties": {"email": {"type": "string", "format": "email"}}, "required": ["email"]},
                ]
            }
        },
        "required": ["who"],
    },
    "unenforced_keywords": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}$", "minLength": 3, "maxLength": 3},
            "score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.5},
            "deep": {"not": {"type": "string"}},
        },
        "required": ["code"],
    },
    "empty": {},
    "object_only": {"type": "object"},
    "deep": {
        "type": "object",
        "properties": {"d": json.loads('{"type": "object", "properties": {"x": ' * 30 + "{}" + "}}" * 30)},
        "required": ["d"],
    },
}

#: (schema name, arguments that violate it) -- each must be rejected by every grammar library
INVALID_ARGUMENTS: list[tuple[str, dict[str, Any]]] = [
    ("nested_required", {"user": {}}),
    ("nested_required", {"user": {"name": "a"}}),
    ("nested_required", {"user": {"name": "a", "age": "3"}}),
    ("nested_required", {"user": {"name": "a", "age": 3, "tags": [1]}}),
    ("nested_required", {"user": {"name": "a", "age": 3, "tags": ["a", "b", "c", "d"]}}),
    ("nested_required", {"user": {"name": "a", "age": 3, "extra": 1}}),
    ("nested_required", {"note": "no user"}),
    ("types", {"s": "x", "i": 1.5, "n": 1, "b": True, "z": None, "maybe": None}),
    ("types", {"s": "x", "i": 1, "n": 1, "b": "true", "z": None, "maybe": None}),
    ("enum_const", {"unit": "kelvin", "level": 1, "version": "v1", "sep": "back\\slash"}),
    ("enum_const", {"unit": "celsius", "level": 4, "version": "v1", "sep": "back\\slash"}),
    ("enum_const", {"unit": "celsius", "level": 1, "version": "v2", "sep": "back\\slash"}),
    ("enum_const", {"unit": "celsius", "level": 1, "version": "v1", "sep": "back/slash"}),
    ("arrays", {"ids": [], "pair": [1, 2]}),
    ("arrays", {"ids": [1], "pair": [1, 2, 3]}),
    ("arrays", {"ids": [1], "pair": [1, 2], "points": [{"x": 1}]}),
    ("types", {"s": "x", "i": 12345678901234567, "n": 1, "b": True, "z": None, "maybe": None}),
    ("int_bounds", {"small": 0, "open": 1, "nonneg": 0, "wide": 0}),
    ("int_bounds", {"small": 6, "open": 1, "nonneg": 0, "wide": 0}),
    ("int_bounds", {"small": 1, "open": 3, "nonneg": 0, "wide": 0}),
    ("int_bounds", {"small": 1, "open": 1, "nonneg": -1, "wide": 0}),
    ("int_bounds", {"small": 1, "open": 1, "nonneg": 0, "wide": 1000000}),
    ("any_of", {"target": {"name": "x"}}),
    ("refs_recursive", {"root": {"value": 1, "children": [{"children": []}]}}),
    ("map", {"headers": {"a": 1}}),
    ("all_of", {"who": {"name": "a"}}),
]


def tool(name: str, parameters: dict[str, Any] | None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def all_tools() -> list[dict[str, Any]]:
    """One tool per schema, plus a tool without ``parameters`` (valid in OpenAI's API)."""
    return [tool(name, schema) for name, schema in SCHEMAS.items()] + [tool("no_parameters", None)]


def call_text(
    name: str, arguments: dict[str, Any], schema: dict[str, Any], *, block: str = "tool_calls"
) -> str:
    """A DSML calls block as a constrained model writes it (starting right at the answer)."""
    return dsml_block(block, [(name, arguments, schema)]).lstrip("\n")


def valid_arguments(schema: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Schema-valid arguments, as the simulated engine writes them."""
    return tool_arguments(schema, _Hints("Paris", "example topic", seed))


def every_grammar() -> dict[str, str]:
    """Every kind of grammar the frontend builds, by a readable id."""
    tools = all_tools()
    out: dict[str, str] = {}
    for family in ("deepseek_v4", "deepseek_v32"):
        for thinking in (False, True):
            mode = "thinking" if thinking else "chat"
            out[f"{family}-required-{mode}"] = build_tool_call_constraint(
                family, tools, "required", thinking=thinking
            ).value
    for name in SCHEMAS:
        named = {"type": "function", "function": {"name": name}}
        out[f"named-{name}"] = build_tool_call_constraint("deepseek_v4", tools, named, thinking=True).value
        out[f"structured-{name}"] = build_structured_output_constraint(SCHEMAS[name], thinking=True).value
    out["structured-json-object"] = build_structured_output_constraint(None, thinking=True).value
    out["structured-with-tools"] = build_structured_output_constraint(
        NESTED_USER, thinking=False, family="deepseek_v4", tools=tools
    ).value
    return out
