"""JSON Schema validation of the schemas clients send: tool parameters and structured-output formats.

Every schema a request carries -- OpenAI ``tools[i].function.parameters`` and
``response_format.json_schema.schema``, Anthropic ``tools[i].input_schema``, Responses
``tools[i].parameters`` and ``text.format.schema`` -- passes :func:`check_json_schema`
before anything (the prompt's tool section, a decoding grammar, the simulated engine) reads
it. Invalid schemas are the client's error: :class:`~deepseek_frontend.errors.RequestError`
(HTTP 400 in each API's own shape) whose ``param`` is the path of the offending field inside
the request, e.g. ``tools[0].function.parameters.properties`` for ``"properties": 3``.

What is checked:

* the value is a JSON object and valid against the JSON Schema draft 2020-12 meta-schema
  (the dialect OpenAI's and Anthropic's structured outputs use; checked with ``jsonschema``);
* it is at most :data:`MAX_SCHEMA_DEPTH` levels deep (deeper schemas would exhaust the
  recursion of every schema tool downstream, ours and the engines');
* every local ``$ref`` (``#/...``) points at a schema inside the same document (a dangling
  pointer has no meaning; remote references are allowed and get a generic grammar);
* for tool parameters (``object_root=True``): the root describes an object (no ``type``, or
  ``"object"``), since DSML tool arguments are always a JSON object;
* what it demands of the output fits (api/schema_bounds.py): no count or length (``minItems``,
  ``minLength``, ``minProperties``, ``minContains``, ``required``, ``const``, ``enum``, integer
  bounds) needs more characters than ``max_tokens`` tokens can hold, no integer bound forces more
  digits than the decoding grammar writes, no enum is past its size limit;
* its decoding grammar stays within :data:`~deepseek_frontend.parsing.schema_grammar.MAX_GRAMMAR_WORK`
  schema nodes and :data:`~deepseek_frontend.parsing.schema_grammar.MAX_GRAMMAR_CHARS` characters
  (``anyOf``, ``type`` lists and ``$ref`` with siblings multiply each other).

Results are cached by the schema's canonical JSON: agent clients resend the same tool list
on every turn of a conversation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import orjson

from deepseek_frontend.errors import RequestError
from deepseek_frontend.parsing.constraints import resolve_local_ref
from deepseek_frontend.parsing.schema_grammar import GrammarTooLargeError, SchemaCompiler

from .schema_bounds import MAX_OUTPUT_TOKENS, Demand, check_output_budget, json_path, output_demands
from .validation import check_object

__all__ = ["MAX_SCHEMA_DEPTH", "check_json_schema", "json_path", "resolve_local_ref"]

#: deepest nesting of objects/arrays a schema may have (OpenAI's structured outputs allow 10 levels
#: of schema nesting; this is far above any real tool schema and far below any recursion limit)
MAX_SCHEMA_DEPTH = 64
_CACHE_SIZE = 512
_Problem = tuple[tuple[str | int, ...], str]
#: canonical schema JSON (+ object_root) -> (relative path parts, message) when invalid, else the
#: schema's demands on the output (api/schema_bounds.py)
_cache: OrderedDict[tuple[bytes, bool], _Problem | tuple[Demand, ...]] = OrderedDict()


def check_json_schema(
    value: Any,
    path: str,
    *,
    object_root: bool = False,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """``value`` as a dict when it is a valid JSON schema; else RequestError naming the field path.

    ``path`` is where the schema sits in the request (``"tools[0].function.parameters"``);
    error ``param`` values extend it to the offending field. ``object_root`` demands that the
    schema describe an object (tool parameters). ``max_tokens``: the request's output limit, which
    a value of the schema must fit in (a response format's); None: the longest output any model
    can write (:data:`~.schema_bounds.MAX_OUTPUT_TOKENS`: tool parameters, since a declared tool
    need not be called, and a response format without a limit).
    """
    schema = dict(check_object(value, path))
    try:
        key = (orjson.dumps(schema, option=orjson.OPT_SORT_KEYS), object_root)
    except (TypeError, orjson.JSONEncodeError):
        # only reachable for nesting past orjson's own limit of 254 levels
        raise RequestError(
            f"{path}: schema is nested more than {MAX_SCHEMA_DEPTH} levels deep", param=path
        ) from None
    if key in _cache:
        _cache.move_to_end(key)
        problem = _cache[key]
    else:
        problem = _find_problem(schema, object_root)
        _cache[key] = problem
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    if problem and not isinstance(problem[0], Demand):
        parts, message = problem  # type: ignore[misc]
        where = json_path(path, parts)
        raise RequestError(f"{where}: {message}", param=where)
    if max_tokens is None:
        check_output_budget(problem, path, MAX_OUTPUT_TOKENS, "the longest context of a model")  # type: ignore[arg-type]
    else:
        check_output_budget(problem, path, max_tokens, "the request's output limit")  # type: ignore[arg-type]
    return schema


def _find_problem(schema: dict[str, Any], object_root: bool) -> _Problem | tuple[Demand, ...]:
    """The first problem of ``schema`` as (path parts inside it, message), or its demands on the
    output when it has none."""
    problem = _find_invalid(schema, object_root)
    if problem is not None:
        return problem
    demands = output_demands(schema)
    if demands and not isinstance(demands[0], Demand):
        return demands  # type: ignore[return-value]
    try:
        SchemaCompiler().value(schema, schema)
    except GrammarTooLargeError as exc:
        return (), exc.message
    except RecursionError:
        return (), f"schema is nested more than {MAX_SCHEMA_DEPTH} levels deep"
    return demands  # type: ignore[return-value]


def _find_invalid(schema: dict[str, Any], object_root: bool) -> _Problem | None:
    """The first way ``schema`` is no valid schema, as (path parts inside it, message), or None."""
    problem = _structure_problem(schema)
    if problem is not None:
        return problem
    from jsonschema.exceptions import best_match

    error = best_match(_meta_validator().iter_errors(schema))
    if error is not None:
        return tuple(error.absolute_path), f"invalid JSON schema (draft 2020-12): {error.message}"
    problem = _ref_problem(schema)
    if problem is not None:
        return problem
    if object_root:
        typ = schema.get("type")
        if typ is not None and typ != "object" and not (isinstance(typ, list) and typ == ["object"]):
            return ("type",), (
                f"tool parameters must be a JSON schema of type 'object' (tool arguments are a JSON "
                f"object), got type {typ!r}"
            )
    return None


@lru_cache(maxsize=1)
def _meta_validator() -> Any:
    """A validator for the draft 2020-12 meta-schema, built once (``jsonschema`` imported late: ~50 ms).

    The official meta-schema is seven vocabulary documents joined by ``allOf`` whose subschema
    positions point back with ``$dynamicRef: "#meta"``; ``jsonschema`` resolves those dynamically
    at every node, about 7 ms for one agent-sized tool schema. Here the same vocabularies (from
    ``jsonschema``'s own bundled copies) are merged into one document whose subschema positions
    are ``$ref: "#"``: the same constraints on every keyword, resolved statically, ~3x faster.
    tests/api/test_schemas.py checks it against the official meta-schema on a corpus.
    """
    from jsonschema import Draft202012Validator
    from jsonschema_specifications import REGISTRY

    def static(node: Any) -> Any:
        if isinstance(node, dict):
            if node.get("$dynamicRef") == "#meta":
                return {"$ref": "#"}
            return {k: static(v) for k, v in node.items() if k != "$dynamicAnchor"}
        if isinstance(node, list):
            return [static(v) for v in node]
        return node

    official = Draft202012Validator.META_SCHEMA
    merged: dict[str, Any] = {"type": ["object", "boolean"], "properties": {}, "$defs": {}}
    for part in official["allOf"]:
        vocabulary = static(REGISTRY.contents(f"https://json-schema.org/draft/2020-12/{part['$ref']}"))
        merged["properties"].update(vocabulary.get("properties", {}))
        merged["$defs"].update(vocabulary.get("$defs", {}))
    # the official document's own (deprecated-keyword) properties
    merged["properties"].update(static(official.get("properties", {})))
    return Draft202012Validator(merged)


def _structure_problem(schema: Any) -> tuple[tuple[str | int, ...], str] | None:
    """Depth check, iteratively (a recursive walk would itself overflow on hostile input)."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(schema, ())]
    while stack:
        node, parts = stack.pop()
        if len(parts) > MAX_SCHEMA_DEPTH:
            return parts[:MAX_SCHEMA_DEPTH], f"schema is nested more than {MAX_SCHEMA_DEPTH} levels deep"
        if isinstance(node, Mapping):
            stack.extend((v, (*parts, k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, (*parts, i)) for i, v in enumerate(node))
    return None


#: keywords whose values are not schemas: a "$ref" key inside them is data, not a reference
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
#: keywords whose values map names to schemas
_NAME_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties", "dependentSchemas"})


def _ref_problem(schema: dict[str, Any]) -> tuple[tuple[str | int, ...], str] | None:
    """A local ``$ref`` that does not resolve, as (its path, message); None when all resolve."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(schema, ())]
    while stack:
        node, parts = stack.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#") and resolve_local_ref(schema, ref) is None:
                return (*parts, "$ref"), f"$ref {ref!r} does not point at a schema in this document"
            # under "properties" / "$defs" the keys are names, so a property called "enum" is a schema
            names = bool(parts) and parts[-1] in _NAME_MAPS
            for k, v in node.items():
                if names or k not in _DATA_KEYWORDS:
                    stack.append((v, (*parts, k)))
        elif isinstance(node, list):
            stack.extend((v, (*parts, i)) for i, v in enumerate(node))
    return None
