"""In-process app: why a request failed is logged and counted (401 too); /v1/models in Anthropic's shape."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.fleet.config import ModelAlias, ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer

KEY = "clients-key"


@pytest.fixture(scope="module")
def client(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    config = ServerConfig(
        ModelConfig(
            served_model_name="deepseek-v4-flash",
            context_length=8192,
            model_aliases=(ModelAlias("claude-*", "deepseek-v4-flash"),),
        ),
        server=ServerOptions(api_key=KEY),
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as c:
        yield c


def done_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "request done"]


def requests_total(client: TestClient, endpoint: str, status: str) -> float:
    text = client.get("/metrics").text
    for line in text.splitlines():
        labels = f'endpoint="{endpoint}"' in line and f'status="{status}"' in line
        if "_requests_total{" in line and labels:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_401_is_logged_with_its_reason_and_counted(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    before = requests_total(client, "/v1/chat/completions", "401")
    with caplog.at_level(logging.INFO, logger="deepseek_frontend"):
        r = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "secret words"}]},
            headers={"Authorization": "Bearer wrong-key-123"},
        )
    assert r.status_code == 401
    lines = done_lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    line = lines[0]
    assert line.status == 401 and line.endpoint == "/v1/chat/completions"  # type: ignore[attr-defined]
    assert "Incorrect API key" in line.error  # type: ignore[attr-defined]
    everything = " ".join(str(v) for v in vars(line).values())
    assert "wrong-key-123" not in everything and "secret words" not in everything
    assert requests_total(client, "/v1/chat/completions", "401") == before + 1


def test_a_401_on_an_unknown_path_is_counted_under_other(client: TestClient) -> None:
    before = requests_total(client, "other", "401")
    assert client.get("/no/such/path").status_code == 401
    assert requests_total(client, "other", "401") == before + 1


def test_a_400_logs_the_message_that_names_the_field(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="deepseek_frontend"):
        r = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "private text"}], "temperature": 7},
            headers={"Authorization": f"Bearer {KEY}"},
        )
    assert r.status_code == 400
    (line,) = done_lines(caplog)
    assert line.status == 400 and "temperature" in line.error  # type: ignore[attr-defined]
    assert "private text" not in line.error  # type: ignore[attr-defined]


def test_models_list_has_the_anthropic_shape_for_anthropic_clients(client: TestClient) -> None:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    page = client.get("/v1/models", headers=headers).json()
    assert page["has_more"] is False and page["first_id"] == page["last_id"] == "deepseek-v4-flash"
    (model,) = page["data"]
    assert model["type"] == "model" and model["id"] == model["display_name"] == "deepseek-v4-flash"
    assert model["created_at"].endswith("Z")
    one = client.get("/v1/models/claude-opus-4-1", headers=headers).json()
    assert one == {**one, "type": "model", "id": "claude-opus-4-1", "display_name": "claude-opus-4-1"}


def test_models_list_keeps_the_openai_shape_for_openai_clients(client: TestClient) -> None:
    page = client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert page["object"] == "list" and page["data"][0]["object"] == "model"
    assert "type" not in page["data"][0]


def test_a_dropped_hosted_tool_is_logged_and_reported(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    body = {
        "model": "deepseek-v4-flash",
        "input": "Reply with exactly: ok",
        "tools": [{"type": "web_search"}, {"type": "code_interpreter", "container": {"type": "auto"}}],
    }
    with caplog.at_level(logging.INFO, logger="deepseek_frontend"):
        r = client.post("/v1/responses", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    warnings = r.json()["warnings"]
    assert len(warnings) == 2 and "tools[0]" in warnings[0] and "code_interpreter" in warnings[1]
    logged = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert any("web_search" in m and "code_interpreter" in m for m in logged)
