"""Cost of schema validation and grammar building per request, for small and agent-sized tool lists.

Usage::

    python benchmarks/bench_schemas.py              # 200 repetitions per row
    python benchmarks/bench_schemas.py --repeat 50

What runs, in process (no server): for tool lists of 1, 8 and 40 tools (each tool a nested
schema of the size agent clients send: a dozen properties, nested objects, arrays, enums, a
``$defs`` reference), it times

* ``check_json_schema`` on every tool the first time (cold: meta-schema validation) and again
  (warm: the per-schema cache that agent loops hit, since they resend the same tools each turn);
* ``build_tool_call_constraint`` (``tool_choice`` required, thinking mode) and the grammar's size;
* ``build_structured_output_constraint`` for one such schema in thinking mode.

The table prints the median milliseconds per request for each.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable
from typing import Any

from deepseek_frontend.api import schemas as schema_module
from deepseek_frontend.api.schemas import check_json_schema
from deepseek_frontend.parsing.constraints import (
    build_structured_output_constraint,
    build_tool_call_constraint,
)


def agent_schema(i: int) -> dict[str, Any]:
    """A tool schema of the size coding agents declare (distinct per ``i``: no accidental cache hits)."""
    return {
        "type": "object",
        "$defs": {
            "Range": {
                "type": "object",
                "properties": {"start": {"type": "integer"}, "end": {"type": "integer"}},
                "required": ["start", "end"],
            }
        },
        "properties": {
            f"path_{i}": {"type": "string", "description": "absolute path"},
            "mode": {"type": "string", "enum": ["read", "write", "append"]},
            "range": {"$ref": "#/$defs/Range"},
            "encoding": {"type": ["string", "null"]},
            "recursive": {"type": "boolean"},
            "limit": {"type": "integer", "minimum": 1},
            "patterns": {"type": "array", "items": {"type": "string"}},
            "edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "old": {"type": "string"},
                        "new": {"type": "string"},
                        "count": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                    },
                    "required": ["old", "new"],
                },
            },
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "timeout": {"type": "number"},
            "note": {"type": "string"},
            "dry_run": {"type": "boolean"},
        },
        "required": [f"path_{i}", "mode"],
    }


def tools(n: int) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": f"tool_{i}", "parameters": agent_schema(i)}}
        for i in range(n)
    ]


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    print(
        "| tools | validate cold (ms) | validate warm (ms) | tool grammar (ms) | grammar KiB | "
        "structured output grammar (ms) |\n| --- | --- | --- | --- | --- | --- |"
    )
    for n in (1, 8, 40):
        declared = tools(n)
        cold = median_ms(lambda d=declared: validate(d, cold=True), max(args.repeat // 10, 5))
        validate(declared, cold=False)
        warm = median_ms(lambda d=declared: validate(d, cold=False), args.repeat)
        grammar = build_tool_call_constraint("deepseek_v4", declared, "required", thinking=True).value
        build = median_ms(lambda d=declared: required_grammar(d), args.repeat)
        structured = median_ms(
            lambda: build_structured_output_constraint(agent_schema(0), thinking=True), args.repeat
        )
        size = len(grammar.encode()) / 1024
        print(f"| {n} | {cold:.2f} | {warm:.3f} | {build:.2f} | {size:.1f} | {structured:.2f} |")


def validate(declared: list[dict[str, Any]], *, cold: bool) -> None:
    """Validate every tool's parameters; ``cold`` empties the per-schema cache first."""
    if cold:
        schema_module._cache.clear()
    for i, tool in enumerate(declared):
        params = tool["function"]["parameters"]
        check_json_schema(copy.deepcopy(params) if cold else params, f"tools[{i}]", object_root=True)


def required_grammar(declared: list[dict[str, Any]]) -> object:
    return build_tool_call_constraint("deepseek_v4", declared, "required", thinking=True)


if __name__ == "__main__":
    main()
