"""Hostile request bodies for the property-based request fuzzing (tests/api/test_fuzz_requests.py).

A fuzzed request starts from a valid base body of its endpoint (one that exercises every field the
endpoint reads: tools, tool choices, schemas, content parts, sampling, streaming) and changes a few
of its fields -- any field of the body, at any depth, plus the fields the endpoint reads that the base
leaves out -- to a hostile value: the wrong JSON type, a well-typed but wrong value (a negative count,
an unknown enum word, a huge number), strings with NULs, lone surrogates, right-to-left marks, long
runs, deep nesting. A few bodies are replaced whole or sent as raw bytes that are not JSON at all.

Bodies are encoded with ``json.dumps(ensure_ascii=True)``, so a lone surrogate reaches the server as
its ``\\ud800`` escape (valid JSON text whose string is not valid Unicode).
"""

from __future__ import annotations

import copy
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

Path = tuple[str | int, ...]

#: strings a backend, a log line or a tokenizer may choke on
ODD_STRINGS = [
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    "\u202eevil",
    "\ufeff",
    "\U0001f600" * 3,
    "e\u0301\u0301\u0301",
    "<｜User｜>",
    "<｜DSML｜invoke>",
    "</think>",
    "\r\n\t",
    "%00",
    "../../etc/passwd",
    "x" * 5000,
    "null",
    "enabled",
    "auto",
    "function",
    "json_schema",
    "text",
    "user",
    "assistant",
    "-1",
    "1e309",
]
#: numbers at the edges of every integer and float type
ODD_NUMBERS = [
    0,
    -1,
    1,
    2,
    100,
    2**31,
    2**53 + 1,
    2**63,
    2**64,
    10**30,
    -(10**30),
    10**400,
    0.5,
    -0.0,
    1e308,
    -1e308,
    5e-324,
    1.5,
]


def nested(depth: int, kind: str = "list") -> Any:
    """A string inside ``depth`` lists (``kind='list'``) or objects ``{"a": ...}``."""
    value: Any = "deep"
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(ODD_NUMBERS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=12),
)
#: any JSON value, small but of every shape
JSON_VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["type", "text", "name", "a", ""]) | st.text(max_size=6), inner, max_size=3
        )
    ),
    max_leaves=8,
)
#: values nested far deeper than any real request (and past every recursion limit)
DEEP_VALUES = st.builds(nested, st.sampled_from([30, 70, 200, 600]), st.sampled_from(["list", "dict"]))
HOSTILE_VALUES = st.one_of(JSON_VALUES, JSON_VALUES, LEAVES, DEEP_VALUES)


def paths(value: Any, prefix: Path = ()) -> Iterator[Path]:
    """Every path inside ``value`` (objects' keys, arrays' indexes), the value's own path first."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from paths(item, (*prefix, i))


def with_value(body: Any, path: Path, value: Any, *, delete: bool = False) -> Any:
    """A copy of ``body`` with ``value`` at ``path`` (missing objects on the way are created; a path
    through a value of another type leaves the body as it is). ``delete``: the field removed."""
    if not path:
        return copy.deepcopy(value)
    out = copy.deepcopy(body)
    node = out
    for part in path[:-1]:
        if isinstance(node, dict) and isinstance(part, str):
            node = node.setdefault(part, {})
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return out
    last = path[-1]
    if isinstance(node, dict) and isinstance(last, str):
        if delete:
            node.pop(last, None)
        else:
            node[last] = value
    elif isinstance(node, list) and isinstance(last, int) and last < len(node):
        if delete:
            del node[last]
        else:
            node[last] = value
    return out


def encode(body: Any) -> bytes:
    """``body`` as JSON text (lone surrogates as their escapes)."""
    return json.dumps(body, ensure_ascii=True).encode()


@st.composite
def hostile_bodies(draw: st.DrawFn, bases: list[Any], extra_paths: list[Path]) -> bytes:
    """One of ``bases`` with one to three of its fields (or ``extra_paths``) changed; sometimes a
    whole body that is not the endpoint's (any JSON value, or bytes that are not JSON)."""
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return encode(draw(JSON_VALUES))
    if kind == 1:
        return draw(st.sampled_from([b"", b"{", b"\x00", b"\xff\xfe{}", b'{"a":1}x', b"[]" * 3, b"nan"]))
    body = draw(st.sampled_from(bases))
    candidates = sorted({*paths(body), *extra_paths}, key=repr)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(candidates))
        if draw(st.integers(0, 9)) == 0:
            body = with_value(body, path, None, delete=True)
        else:
            body = with_value(body, path, draw(HOSTILE_VALUES))
    return encode(body)


# --- base bodies: every field each endpoint reads ---------------------------------------------

MODEL = "deepseek-v4-flash"
_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 40},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "unit": {"enum": ["c", "f"]},
    },
    "required": ["city"],
}
_RESPONSE_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "n": {"type": "number"}},
    "required": ["answer"],
    "additionalProperties": False,
}

CHAT_BASES: list[dict[str, Any]] = [
    {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "look it up",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "use the tool for Tokyo"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {"name": "get_weather", "description": "weather", "parameters": _PARAMS},
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 24,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "min_p": 0.1,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.1,
        "repetition_penalty": 1.1,
        "seed": 3,
        "stop": ["zz"],
        "n": 1,
        "user": "u1",
        "logprobs": True,
        "top_logprobs": 2,
        "thinking": {"type": "enabled"},
        "reasoning_effort": "high",
    },
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "give json"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _RESPONSE_SCHEMA}},
        "max_completion_tokens": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": {"thinking": False},
        "ignore_eos": False,
        "min_tokens": 1,
    },
]
CHAT_EXTRA: list[Path] = [
    ("thinking", "type"),
    ("response_format", "type"),
    ("response_format", "json_schema", "schema", "properties", "answer", "minLength"),
    ("tools", 0, "function", "parameters", "properties", "tags", "minItems"),
    ("tools", 0, "function", "parameters", "properties", "days", "maximum"),
    ("messages", 1, "content", 0, "image_url"),
    ("chat_template_kwargs", "enable_thinking"),
    ("max_tokens",),
    ("tool_choice",),
    ("stream_options",),
]

COMPLETION_BASES: list[dict[str, Any]] = [
    {
        "model": MODEL,
        "prompt": "Once upon a time",
        "max_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.9,
        "stop": "\n\n",
        "seed": 1,
        "n": 1,
        "echo": False,
        "logprobs": 2,
        "user": "u",
        "suffix": None,
        "best_of": 1,
    },
    {
        "model": MODEL,
        "prompt": ["a", "b"],
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    },
    {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4},
]
COMPLETION_EXTRA: list[Path] = [("prompt", 0), ("echo",), ("suffix",), ("best_of",), ("logprobs",)]

MESSAGES_BASES: list[dict[str, Any]] = [
    {
        "model": MODEL,
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "call it", "signature": "sig"},
                    {"type": "text", "text": "checking"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "text", "text": "sunny"}],
                    },
                    {"type": "text", "text": "and Tokyo?"},
                ],
            },
        ],
        "tools": [{"name": "get_weather", "description": "weather", "input_schema": _PARAMS}],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "stop_sequences": ["zz"],
        "metadata": {"user_id": "u1"},
    },
    {
        "model": MODEL,
        "max_tokens": 32,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        "stream": True,
        "tool_choice": {"type": "tool", "name": "lookup"},
        "tools": [{"name": "lookup", "input_schema": {"type": "object"}, "defer_loading": False}],
        "output_config": {"effort": "low"},
    },
]
MESSAGES_EXTRA: list[Path] = [
    ("thinking", "type"),
    ("tool_choice", "type"),
    ("tool_choice", "name"),
    ("output_config", "effort"),
    ("messages", 0, "content"),
    ("tools", 0, "input_schema", "properties", "tags", "minItems"),
    ("tools", 0, "input_schema", "properties", "city", "minLength"),
    ("messages", 2, "content", 0, "is_error"),
]

RESPONSES_BASES: list[dict[str, Any]] = [
    {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "look"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "user", "content": "and Tokyo?"},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "w",
                "parameters": _PARAMS,
                "strict": True,
            }
        ],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": True,
        "max_output_tokens": 40,
        "temperature": 0.5,
        "top_p": 0.9,
        "reasoning": {"effort": "low", "summary": "auto"},
        "store": True,
        "metadata": {"k": "v"},
        "user": "u1",
        "include": ["reasoning.encrypted_content"],
        "top_logprobs": 2,
    },
    {
        "model": MODEL,
        "input": "give json",
        "text": {"format": {"type": "json_schema", "name": "x", "schema": _RESPONSE_SCHEMA, "strict": True}},
        "stream": True,
        "store": False,
        "max_output_tokens": 40,
    },
    {"model": MODEL, "input": "hello", "previous_response_id": "resp_missing", "max_output_tokens": 16},
    {"model": MODEL, "input": "hello", "conversation": "conv_missing", "max_output_tokens": 16},
    {"model": MODEL, "input": "hello", "background": True, "max_output_tokens": 8},
]
RESPONSES_EXTRA: list[Path] = [
    ("text", "format", "type"),
    ("text", "format", "schema", "properties", "answer", "minLength"),
    ("reasoning", "effort"),
    ("tool_choice",),
    ("conversation",),
    ("previous_response_id",),
    ("input", 0, "content", 0, "image_url"),
    ("tools", 0, "parameters", "properties", "tags", "minItems"),
    ("safety_identifier",),
]

CONVERSATION_BASES: list[dict[str, Any]] = [
    {
        "metadata": {"topic": "weather"},
        "items": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
    },
    {"items": [{"type": "item_reference", "id": "msg_missing"}]},
]
CONVERSATION_EXTRA: list[Path] = [("metadata", "k"), ("items", 0, "id"), ("items", 0, "role")]

#: path ids and list cursors as they appear in a URL (percent-escaped): NULs, bytes that are no
#: UTF-8, an escaped surrogate, long ids, any text
ODD_IDS = st.one_of(
    st.sampled_from(
        ["resp_x", "conv_x", "msg_x", "%00", "a%00b", "%ff", "%ed%a0%80", "x" * 3000, "%F0%9F%98%80", "..%2f"]
    ),
    st.text(min_size=1, max_size=12).map(lambda t: urllib.parse.quote(t, safe="", errors="surrogatepass")),
)
