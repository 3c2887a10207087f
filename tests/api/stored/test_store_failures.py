"""A state store that fails is the server's fault, answered in each API's shape: 503 with
``Retry-After`` (OpenAI's and Anthropic's error objects), the Responses ``error`` event at the end
of a stored stream (never a silent cut, never ``response.completed`` for a response that was not
stored), and the request counted as a 503, not as a client that went away (499).

Real failures: SQLite's "database or disk is full" (``PRAGMA max_page_count`` pins the file at its
size) and a PostgreSQL server stopped under a running app.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.fleet.store_config import StateOptions
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.postgres import PostgresServer, create_database, start_postgres
from tests.support.scripted import named_events

MODEL = "deepseek-v4-flash"
#: an input large enough that storing it needs new pages of the file
LARGE = "word " * 20_000


def _app(tokenizer: PromptTokenizer, url: str) -> TestClient:
    config = ServerConfig(
        ModelConfig(served_model_name=MODEL), server=ServerOptions(state=StateOptions(url=url))
    )
    return TestClient(create_app(config, tokenizer=tokenizer))


def _requests_counted(client: TestClient, endpoint: str) -> dict[str, float]:
    """``status/error_type`` -> count of the finished-requests counter for ``endpoint``."""
    found = {}
    for line in client.get("/metrics").text.splitlines():
        match = re.match(r"deepseek_frontend_requests_total\{(.*)\} (\S+)", line)
        if match and f'endpoint="{endpoint}"' in match.group(1):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            found[f"{labels['status']}/{labels['error_type']}"] = float(match.group(2))
    return found


def _assert_openai_503(response: Any) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["type"] == "service_unavailable" and error["code"] == "store_unavailable"


@pytest.fixture()
def full_disk(prompt_tokenizer: PromptTokenizer, tmp_path: Path) -> Iterator[TestClient]:
    """An app whose SQLite file cannot grow any more: SQLite answers "database or disk is full"."""
    with _app(prompt_tokenizer, f"sqlite:///{tmp_path}/state.sqlite3") as client:
        store = client.app.frontend.store  # type: ignore[attr-defined]

        async def fill() -> None:
            conn = store._conn
            await store._run(lambda: conn.execute("PRAGMA max_page_count = 1"))  # clamped to its size

        client.portal.call(fill)  # type: ignore[union-attr]
        yield client


def test_a_full_disk_is_a_503_in_openai_shape(full_disk: TestClient) -> None:
    client = full_disk
    _assert_openai_503(client.post("/v1/responses", json={"model": MODEL, "input": LARGE}))
    _assert_openai_503(client.post("/v1/conversations", json={"items": [{"role": "user", "content": LARGE}]}))
    # a request that stores nothing is served
    assert (
        client.post("/v1/responses", json={"model": MODEL, "input": "hi", "store": False}).status_code == 200
    )


def test_a_stored_stream_whose_write_fails_ends_with_an_error_event_counted_as_503(
    full_disk: TestClient,
) -> None:
    client = full_disk
    with client.stream(
        "POST", "/v1/responses", json={"model": MODEL, "input": LARGE, "stream": True}
    ) as response:
        assert response.status_code == 200
        events = named_events(response.read().decode())
    names = [name for name, _ in events]
    assert names[0] == "response.created" and names[-1] == "error"
    assert "response.completed" not in names  # never announced: it was not stored
    error = events[-1][1]
    assert error["code"] == "store_unavailable" and "full" in error["message"]
    counted = _requests_counted(client, "/v1/responses")
    assert counted.get("503/service_unavailable") == 1
    assert not any(key.startswith("499") for key in counted)


@pytest.fixture()
def doomed_postgres() -> Iterator[PostgresServer]:
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


def test_postgres_down_is_a_503_in_each_apis_shape(
    prompt_tokenizer: PromptTokenizer, doomed_postgres: PostgresServer
) -> None:
    with _app(prompt_tokenizer, create_database(doomed_postgres)) as client:
        stored = client.post("/v1/responses", json={"model": MODEL, "input": "hi"})
        assert stored.status_code == 200
        doomed_postgres.stop()
        _assert_openai_503(client.get(f"/v1/responses/{stored.json()['id']}"))
        _assert_openai_503(client.post("/v1/responses", json={"model": MODEL, "input": "hi"}))
        # Anthropic: a tool loop's turn whose reasoning is looked up in the store
        anthropic = client.post(
            "/v1/messages",
            json={
                "model": MODEL,
                "max_tokens": 64,
                "messages": [
                    {"role": "user", "content": "What is the weather?"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "Let me look."},
                            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}},
                        ],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sun"}],
                    },
                ],
                "tools": [{"name": "weather", "input_schema": {"type": "object"}}],
            },
        )
        assert anthropic.status_code == 503, anthropic.text
        assert int(anthropic.headers["retry-after"]) >= 1
        assert anthropic.json()["type"] == "error"
        assert anthropic.json()["error"]["type"] == "overloaded_error"
        with client.stream(
            "POST", "/v1/responses", json={"model": MODEL, "input": "hi", "stream": True}
        ) as streamed:
            events = named_events(streamed.read().decode())
        assert events[-1][0] == "error" and "response.completed" not in [name for name, _ in events]
