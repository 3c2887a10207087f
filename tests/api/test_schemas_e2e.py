"""Client JSON schemas end to end: validated on every API, enforced in every mode, never a 500.

Real HTTP all the way: the official ``openai`` / ``anthropic`` clients -> ``serve --engine sglang``
-> a ``sim-engine`` process. One engine has a grammar backend (xgrammar, SGLang's default); one is
launched as the recipe's SGLang without one (``--grammar-backend none``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pydantic
import pytest

from tests.support.servers import Server, start_frontend, start_sim_engine

API_KEY = "schema-key"
MODEL = "deepseek-v4-flash"

USER_SCHEMA = {
    "type": "object",
    "properties": {
        "user": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0},
                "roles": {"type": "array", "items": {"enum": ["admin", "dev"]}, "minItems": 1},
            },
            "required": ["name", "age", "roles"],
        },
        "notify": {"type": "boolean"},
    },
    "required": ["user"],
}
REF_SCHEMA = {
    "type": "object",
    "$defs": {
        "Point": {
            "type": "object",
            "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
            "required": ["x", "y"],
        }
    },
    "properties": {"start": {"$ref": "#/$defs/Point"}, "end": {"$ref": "#/$defs/Point"}},
    "required": ["start", "end"],
}


def _frontend(engine: Server) -> Server:
    return start_frontend("--engine", "sglang", "--worker", engine.url, "--api-key", API_KEY)


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, Server]]:
    started: list[Server] = []
    try:
        grammar_engine = start_sim_engine()
        started.append(grammar_engine)
        bare_engine = start_sim_engine("--grammar-backend", "none")
        started.append(bare_engine)
        grammar = _frontend(grammar_engine)
        started.append(grammar)
        bare = _frontend(bare_engine)
        started.append(bare)
        yield {"grammar": grammar, "bare": bare}
    finally:
        for server in reversed(started):
            server.stop()


@pytest.fixture(scope="module")
def oai(servers: dict[str, Server]) -> openai.OpenAI:
    return openai.OpenAI(base_url=servers["grammar"].url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def bare_oai(servers: dict[str, Server]) -> openai.OpenAI:
    return openai.OpenAI(base_url=servers["bare"].url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(servers: dict[str, Server]) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=servers["grammar"].url, api_key=API_KEY, max_retries=0, timeout=60)


def function_tool(name: str, parameters: Any = None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name, "description": f"the {name} tool"}
    if parameters is not None:
        fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def post(server: Server, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}", "x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


# --------------------------------------------------------------------------- invalid schemas: 400 + path

BAD_SCHEMAS = [
    pytest.param({"type": "object", "properties": 3}, ".properties", id="properties-int"),
    pytest.param({"type": "object", "properties": ["a"]}, ".properties", id="properties-list"),
    pytest.param({"type": "object", "properties": "a"}, ".properties", id="properties-string"),
    pytest.param({"type": "object", "required": "a"}, ".required", id="required-string"),
    pytest.param({"type": "object", "required": [1]}, ".required[0]", id="required-int-item"),
    pytest.param(
        {"type": "object", "properties": {"a": {"type": "strng"}}}, ".properties.a.type", id="bad-type-name"
    ),
    pytest.param(
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing"}}},
        ".properties.a.$ref",
        id="dangling-ref",
    ),
]


@pytest.mark.parametrize(("schema", "suffix"), BAD_SCHEMAS)
@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_openai_chat_invalid_tool_schema_is_a_400_naming_the_path(
    servers: dict[str, Server], schema: dict, suffix: str, tool_choice: str
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "call the tool"}],
        "tools": [function_tool("ok", {"type": "object"}), function_tool("broken", schema)],
        "tool_choice": tool_choice,
    }
    response = post(servers["grammar"], "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "tools[1].function.parameters" + suffix
    assert error["message"].startswith(error["param"])


@pytest.mark.parametrize(("schema", "suffix"), BAD_SCHEMAS)
def test_anthropic_invalid_input_schema_is_a_400_naming_the_path(
    servers: dict[str, Server], schema: dict, suffix: str
) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 200,
        "messages": [{"role": "user", "content": "call the tool"}],
        "tools": [{"name": "broken", "input_schema": schema}],
        "tool_choice": {"type": "tool", "name": "broken"},
    }
    response = post(servers["grammar"], "/v1/messages", body)
    assert response.status_code == 400, response.text
    payload = response.json()
    assert payload["type"] == "error"
    assert payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["message"].startswith("tools[0].input_schema" + suffix + ":")


@pytest.mark.parametrize(("schema", "suffix"), BAD_SCHEMAS)
def test_responses_invalid_tool_and_format_schemas_are_400s_naming_the_path(
    servers: dict[str, Server], schema: dict, suffix: str
) -> None:
    tool = {"type": "function", "name": "broken", "parameters": schema}
    response = post(
        servers["grammar"],
        "/v1/responses",
        {"model": MODEL, "input": "call it", "tools": [tool], "tool_choice": "required"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tools[0].parameters" + suffix
    fmt = {"type": "json_schema", "name": "out", "schema": schema}
    response = post(
        servers["grammar"], "/v1/responses", {"model": MODEL, "input": "hi", "text": {"format": fmt}}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "text.format.schema" + suffix


def test_openai_response_format_schema_is_validated(servers: dict[str, Server]) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 1}}}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "response_format": fmt}
    response = post(servers["grammar"], "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "response_format.json_schema.schema.properties"


def test_tool_parameters_must_describe_an_object(servers: dict[str, Server]) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [function_tool("s", {"type": "string"})],
    }
    response = post(servers["grammar"], "/v1/chat/completions", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "tools[0].function.parameters.type"


# --------------------------------------------------------------------------- schemas that must work


@pytest.mark.parametrize("thinking", [True, False])
def test_function_tool_without_parameters_is_called_with_empty_arguments(
    oai: openai.OpenAI, thinking: bool
) -> None:
    completion = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Use the tool."}],
        tools=[function_tool("ping")],  # type: ignore[list-item]
        tool_choice="required",
        extra_body={"thinking": {"type": "enabled" if thinking else "disabled"}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.function.name == "ping"
    assert call.function.arguments == "{}"
    assert not choice.message.content


def test_anthropic_empty_input_schema_tool_is_forced_and_called(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=MODEL,
        max_tokens=300,
        messages=[{"role": "user", "content": "Use the tool."}],
        tools=[{"name": "ping", "description": "ping", "input_schema": {}}],  # type: ignore[typeddict-item]
        tool_choice={"type": "tool", "name": "ping"},
    )
    [block] = [b for b in message.content if b.type == "tool_use"]
    assert block.name == "ping" and block.input == {}
    assert message.stop_reason == "tool_use"


@pytest.mark.parametrize("schema", [USER_SCHEMA, REF_SCHEMA], ids=["nested", "ref-defs"])
@pytest.mark.parametrize("thinking", [True, False])
def test_required_call_arguments_are_valid_against_nested_and_ref_schemas(
    oai: openai.OpenAI, schema: dict, thinking: bool
) -> None:
    completion = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Please do it."}],
        tools=[function_tool("act", schema)],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "act"}},
        extra_body={"thinking": {"type": "enabled" if thinking else "disabled"}},
    )
    [call] = completion.choices[0].message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), schema)
    assert completion.choices[0].message.content in (None, "")


def test_anthropic_tool_forced_json_is_schema_valid(claude: anthropic.Anthropic) -> None:
    """The structured-output idiom of Anthropic clients: force a tool whose input is the answer."""
    message = claude.messages.create(
        model=MODEL,
        max_tokens=500,
        messages=[{"role": "user", "content": "Extract the user."}],
        tools=[{"name": "record_user", "description": "record", "input_schema": USER_SCHEMA}],  # type: ignore[typeddict-item]
        tool_choice={"type": "tool", "name": "record_user"},
    )
    [block] = [b for b in message.content if b.type == "tool_use"]
    jsonschema.validate(block.input, USER_SCHEMA)


# --------------------------------------------------------------------------- structured output helpers


class Address(pydantic.BaseModel):
    city: str
    zip_code: str


class Person(pydantic.BaseModel):
    name: str
    age: int
    tags: list[str]
    address: Address


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_completions_parse_gets_a_valid_object_in_both_modes(oai: openai.OpenAI, thinking: bool) -> None:
    completion = oai.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a person living in Lisbon."}],
        response_format=Person,
        extra_body={"thinking": {"type": "enabled" if thinking else "disabled"}},
    )
    message = completion.choices[0].message
    assert isinstance(message.parsed, Person)
    assert message.parsed.address.city
    if thinking:
        assert getattr(message, "reasoning_content", None), "reasoning stays free before the JSON"


def test_responses_parse_with_text_format_gets_a_valid_object(oai: openai.OpenAI) -> None:
    response = oai.responses.parse(model=MODEL, input="Describe a person.", text_format=Person)
    assert isinstance(response.output_parsed, Person)


def test_json_object_mode_returns_a_json_object(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)


# --------------------------------------------------------------------------- a worker without grammar backend


@pytest.mark.parametrize("thinking", [True, False])
def test_structured_output_on_a_grammarless_worker_is_a_400_saying_why(
    bare_oai: openai.OpenAI, thinking: bool
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        bare_oai.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe a person."}],
            response_format=Person,
            extra_body={"thinking": {"type": "enabled" if thinking else "disabled"}},
        )
    assert "constrained decoding" in str(info.value)
    assert info.value.body["param"] == "response_format"  # type: ignore[index]


def test_required_tool_call_on_a_grammarless_worker_uses_the_preopened_block(bare_oai: openai.OpenAI) -> None:
    completion = bare_oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello there."}],
        tools=[function_tool("act", USER_SCHEMA)],  # type: ignore[list-item]
        tool_choice="required",
        extra_body={"thinking": {"type": "disabled"}},
    )
    [call] = completion.choices[0].message.tool_calls or []
    assert call.function.name == "act"
    jsonschema.validate(json.loads(call.function.arguments), USER_SCHEMA)
    with pytest.raises(openai.BadRequestError) as info:
        bare_oai.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hello there."}],
            tools=[function_tool("act", USER_SCHEMA)],  # type: ignore[list-item]
            tool_choice="required",
        )
    assert "thinking" in str(info.value)
