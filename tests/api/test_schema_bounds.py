"""Schema bombs: a schema no output could meet within ``max_tokens`` is a 400 naming the keyword,
its path and the limit, before any engine sees it (api/schema_bounds.py) -- on every API that
carries a schema: OpenAI ``response_format`` and tool ``parameters``, Anthropic ``input_schema``,
Responses tools and ``text.format``. A real ``serve`` with its in-process simulated engine stays
live throughout.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from deepseek_frontend.api.schema_bounds import MAX_CHARS_PER_TOKEN, MAX_ENUM_VALUES, output_demands
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.servers import Server, start_frontend

pytestmark = pytest.mark.timeout(120)

MODEL = "deepseek-v4-flash"
BOMB = {"type": "array", "items": {"type": "integer"}, "minItems": 1_000_000_000}


@pytest.fixture(scope="module")
def client(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    with TestClient(
        create_app(ServerConfig(ModelConfig(served_model_name=MODEL)), tokenizer=prompt_tokenizer)
    ) as c:
        yield c


def answer_format(schema: Any, max_tokens: int | None = 200) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def refused(r: httpx.Response, param: str, *words: str) -> str:
    assert r.status_code == 400, r.text
    body = r.json()
    error = body["error"]
    assert error.get("param", param) == param, error
    message = str(error["message"])
    assert message.startswith(param), message
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize(
    ("schema", "where", "words"),
    [
        (BOMB, "minItems", ["1000000000", "200 tokens"]),
        ({"type": "string", "minLength": 1e12}, "minLength", ["200 tokens"]),
        ({"type": "object", "minProperties": 10**8}, "minProperties", ["200 tokens"]),
        (
            {"type": "array", "contains": {"type": "string"}, "minContains": 10**7},
            "minContains",
            ["200 tokens"],
        ),
        ({"const": "x" * 30_000}, "const", ["200 tokens"]),
        # each level is small; together they are 200 x 200 strings of 100 characters
        (
            {
                "type": "array",
                "minItems": 200,
                "items": {"type": "array", "minItems": 200, "items": {"type": "string", "minLength": 100}},
            },
            "minItems",
            ["200 tokens"],
        ),
        (
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1e20}}},
            "properties.n.minimum",
            ["16 digits"],
        ),
        ({"enum": list(range(MAX_ENUM_VALUES + 1))}, "enum", [str(MAX_ENUM_VALUES)]),
    ],
)
def test_a_response_format_no_output_could_meet_is_a_400_naming_keyword_path_and_limit(
    client: TestClient, schema: dict[str, Any], where: str, words: list[str]
) -> None:
    r = client.post("/v1/chat/completions", json=answer_format(schema))
    refused(r, f"response_format.json_schema.schema.{where}", *words)


def test_the_limit_is_max_tokens_times_the_longest_token(client: TestClient) -> None:
    """A schema that fits the request's limit is served; the same one under a smaller limit is not."""
    schema = {"type": "string", "minLength": 10 * MAX_CHARS_PER_TOKEN}
    ok = client.post("/v1/chat/completions", json=answer_format(schema, max_tokens=20))
    assert ok.status_code == 200, ok.text
    r = client.post("/v1/chat/completions", json=answer_format(schema, max_tokens=5))
    refused(r, "response_format.json_schema.schema.minLength", "5 tokens", str(5 * MAX_CHARS_PER_TOKEN))


def test_without_max_tokens_the_longest_context_is_the_limit(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", json=answer_format(BOMB, max_tokens=None))
    refused(r, "response_format.json_schema.schema.minItems", "1048576 tokens")


def test_a_grammar_that_multiplies_is_refused(client: TestClient) -> None:
    """anyOf branches merged with their siblings compile the siblings once per branch: nested, they
    multiply (here 4^8 subschemas) -- refused instead of compiled."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(8):
        schema = {
            "type": "object",
            "properties": {"x": schema},
            "anyOf": [{"required": ["x"]}, {"required": ["y"]}, {"minProperties": 1}, {"maxProperties": 3}],
        }
    r = client.post("/v1/chat/completions", json=answer_format(schema))
    refused(r, "response_format.json_schema.schema", "subschemas")


def test_tool_schemas_are_bounded_on_every_api(client: TestClient) -> None:
    params = {"type": "object", "properties": {"xs": BOMB}}
    chat = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
        },
    )
    refused(chat, "tools[0].function.parameters.properties.xs.minItems", "1048576 tokens")
    messages = client.post(
        "/v1/messages",
        json={
            "model": MODEL,
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": params}],
        },
    )
    assert messages.status_code == 400, messages.text
    error = messages.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("tools[0].input_schema.properties.xs.minItems")
    responses = client.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "hi",
            "store": False,
            "tools": [{"type": "function", "name": "f", "parameters": params}],
        },
    )
    refused(responses, "tools[0].parameters.properties.xs.minItems")
    text_format = client.post(
        "/v1/responses",
        json={
            "model": MODEL,
            "input": "hi",
            "store": False,
            "max_output_tokens": 100,
            "text": {
                "format": {
                    "type": "json_schema",
                    "name": "x",
                    "schema": {"type": "string", "minLength": 1e12},
                }
            },
        },
    )
    refused(text_format, "text.format.schema.minLength", "100 tokens")


def test_real_schemas_demand_little() -> None:
    """No false alarms: the listed demands of an agent-sized schema all fit a small max_tokens."""
    schema = {
        "type": "object",
        "properties": {
            "path": {"type": "string", "minLength": 1},
            "edits": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "properties": {"old": {"type": "string"}, "new": {"type": "string"}},
                    "required": ["old", "new"],
                },
            },
            "mode": {"enum": ["a", "b"]},
            "count": {"type": "integer", "minimum": 1, "maximum": 10},
        },
        "required": ["path", "edits"],
    }
    demands = output_demands(schema)
    assert isinstance(demands, tuple)
    assert all(d.chars <= 16 * MAX_CHARS_PER_TOKEN for d in demands)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def serve() -> Iterator[Server]:
    with start_frontend() as server:
        yield server


def test_the_reported_schema_bomb_is_answered_at_once_and_serve_stays_live(serve: Server) -> None:
    """The report: minItems 1e9 on serve with its in-process simulated engine never answered and
    /live stopped answering; minLength 1e12 answered 500 MemoryError."""
    with httpx.Client(base_url=serve.url, timeout=60) as http:
        r = http.post("/v1/chat/completions", json=answer_format(BOMB, max_tokens=None))
        refused(r, "response_format.json_schema.schema.minItems")
        r = http.post("/v1/chat/completions", json=answer_format({"type": "string", "minLength": 1e12}))
        refused(r, "response_format.json_schema.schema.minLength")
        assert http.get("/live").status_code == 200
        # a schema within the limits is still answered, in the schema
        ok = http.post(
            "/v1/chat/completions",
            json=answer_format({"type": "array", "items": {"type": "integer"}, "minItems": 3}),
        )
        assert ok.status_code == 200, ok.text
