"""api/schemas.py: client JSON schemas are checked before anything is built from them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from deepseek_frontend.api.schemas import MAX_SCHEMA_DEPTH, _meta_validator, check_json_schema
from deepseek_frontend.errors import RequestError
from tests.engines.grammar_cases import SCHEMAS

#: schemas whose validity the fast meta-schema must judge exactly as the official one does
CORPUS: list[Any] = [
    *SCHEMAS.values(),
    {"type": []},
    {"type": ["string", "string"]},
    {"type": "strng"},
    {"enum": "x"},
    {"enum": []},
    {"minLength": -1},
    {"maxItems": 1.5},
    {"multipleOf": 0},
    {"items": [{"type": "string"}]},
    {"prefixItems": [{"type": "string"}], "items": False},
    {"$defs": {"a": 1}},
    {"$defs": {"a": {"$ref": 3}}},
    {"properties": {"a": 5}},
    {"properties": {"a": {"properties": {"b": {"type": "nope"}}}}},
    {"pattern": 3},
    {"patternProperties": {"^a": {"type": "string"}}},
    {"additionalProperties": "no"},
    {"required": ["a", "a"]},
    {"required": "a"},
    {"dependencies": 1},
    {"dependentRequired": {"a": [1]}},
    {"$schema": 3},
    {"anyOf": []},
    {"anyOf": [{"type": "integer"}, 3]},
    {"not": {"not": {"type": "oops"}}},
    {"if": {"const": 1}, "then": {"minimum": "x"}},
    {"unevaluatedProperties": {"type": "string"}},
    {"contentMediaType": 3},
    {"deprecated": "yes"},
    {"x-custom": {"type": 3}},
]


@pytest.mark.parametrize("schema", CORPUS, ids=[json.dumps(s)[:40] for s in CORPUS])
def test_fast_meta_schema_agrees_with_the_official_one(schema: Any) -> None:
    official = Draft202012Validator(Draft202012Validator.META_SCHEMA).is_valid(schema)
    assert _meta_validator().is_valid(schema) == official


def test_valid_schemas_come_back_as_dicts() -> None:
    for schema in SCHEMAS.values():
        assert check_json_schema(schema, "tools[0].function.parameters", object_root=True) == schema


@pytest.mark.parametrize(
    ("schema", "param"),
    [
        ({"type": "object", "properties": 3}, "p.properties"),
        ({"type": "object", "properties": {"a": {"items": {"type": 7}}}}, "p.properties.a.items.type"),
        ({"type": "object", "required": ["a", 2]}, "p.required[1]"),
        ({"anyOf": [{"type": "object"}, {"minimum": "x"}]}, "p.anyOf[1].minimum"),
        ({"properties": {"a": {"$ref": "#/$defs/none"}}}, "p.properties.a.$ref"),
        ({"properties": {"enum": {"$ref": "#/nope"}}}, "p.properties.enum.$ref"),
        ("not a schema", "p"),
    ],
)
def test_invalid_schemas_name_the_offending_field(schema: Any, param: str) -> None:
    with pytest.raises(RequestError) as info:
        check_json_schema(schema, "p")
    assert info.value.param == param
    assert info.value.message.startswith(param + ":")


def test_data_keywords_are_not_searched_for_references() -> None:
    """A ``$ref`` key inside ``enum`` / ``const`` / ``default`` is data, not a pointer."""
    schema = {"enum": [{"$ref": "#/x"}], "default": {"$ref": "#/y"}, "const": {"$ref": "#/z"}}
    assert check_json_schema(schema, "p") == schema


def test_tool_parameters_must_describe_an_object() -> None:
    for ok in ({}, {"type": "object"}, {"type": ["object"]}, {"properties": {}}):
        check_json_schema(ok, "tools[0].parameters", object_root=True)
    with pytest.raises(RequestError) as info:
        check_json_schema({"type": "array"}, "tools[0].parameters", object_root=True)
    assert info.value.param == "tools[0].parameters.type"
    # a response format may be any schema
    assert check_json_schema({"type": "array"}, "text.format.schema") == {"type": "array"}


def test_hostile_nesting_is_a_400_not_a_recursion_error() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH + 10):
        deep = {"type": "array", "items": deep}
    with pytest.raises(RequestError, match="nested more than"):
        check_json_schema(deep, "response_format.json_schema.schema")
