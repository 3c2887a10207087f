"""Every /v1/messages error has Anthropic's shape, including those answered before the handler
runs: a model the key may not use or that does not exist (edge/route.py ``_route``), no or a wrong
key (edge/auth.py), a body that is not JSON, a method or path that does not exist."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.fleet.config_file import Fleet
from deepseek_frontend.keys.tenants import TenantTable
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer

KEY = "sk-alice"
ALLOWED = "deepseek-v4-flash"
FORBIDDEN = "deepseek-v4-other"


@pytest.fixture(scope="module")
def client(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    tenants = TenantTable.from_entries([{"name": "alice", "key": KEY, "models": [ALLOWED]}], where="keys")
    fleet = Fleet(
        (
            ServerConfig(ModelConfig(served_model_name=ALLOWED)),
            ServerConfig(ModelConfig(served_model_name=FORBIDDEN)),
        ),
        tenants,
    )
    config = fleet.models[0]
    with TestClient(create_app(config, fleet=fleet, tokenizer=prompt_tokenizer)) as c:
        yield c


def anthropic_error(r: Any, status: int, error_type: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body) == {"type", "error"}, body
    assert body["error"]["type"] == error_type and set(body["error"]) == {"type", "message"}, body
    return str(body["error"]["message"])


def message(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize("model", [FORBIDDEN, "no-such-model"])
def test_a_forbidden_or_unknown_model_is_an_anthropic_404(client: TestClient, path: str, model: str) -> None:
    r = client.post(path, json=message(model), headers={"x-api-key": KEY})
    text = anthropic_error(r, 404, "not_found_error")
    assert FORBIDDEN not in text.replace(repr(model), "")  # a forbidden model is not disclosed


def test_errors_before_the_handler_are_anthropic_shaped(client: TestClient) -> None:
    anthropic_error(client.post("/v1/messages", json=message(ALLOWED)), 401, "authentication_error")
    anthropic_error(
        client.post("/v1/messages", json=message(ALLOWED), headers={"x-api-key": "sk-wrong"}),
        401,
        "authentication_error",
    )
    anthropic_error(
        client.post("/v1/messages", content=b"{not json", headers={"x-api-key": KEY}),
        400,
        "invalid_request_error",
    )
    anthropic_error(client.get("/v1/messages", headers={"x-api-key": KEY}), 405, "invalid_request_error")
    anthropic_error(
        client.post("/v1/messages/nope", json={}, headers={"x-api-key": KEY}), 404, "not_found_error"
    )
    served = client.post("/v1/messages", json=message(ALLOWED), headers={"x-api-key": KEY})
    assert served.status_code == 200, served.text
