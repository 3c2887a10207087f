"""Ids a store cannot hold: a NUL (PostgreSQL's text refuses U+0000) or an id past the length limit,
in a URL path, a list cursor or a body, is a 400 naming the field -- the same on SQLite and on a
real PostgreSQL, where it answered 500 (``CharacterNotInRepertoireError``). Text with a NUL inside
a stored item is JSON-escaped and stored as it came.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.api.validation import MAX_ID_CHARS
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.fleet.store_config import StateOptions
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.postgres import create_database, postgres_server

__all__ = ["postgres_server"]

pytestmark = pytest.mark.timeout(300)

MODEL = "deepseek-v4-flash"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def client(request: pytest.FixtureRequest, prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    if request.param == "sqlite":
        url = f"sqlite:///{Path(tempfile.mkdtemp(prefix='dsfe-ids-')) / 'state.sqlite3'}"
    else:
        url = create_database(request.getfixturevalue("postgres_server"))
    config = ServerConfig(
        ModelConfig(served_model_name=MODEL), server=ServerOptions(state=StateOptions(url=url))
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as c:
        yield c


@pytest.fixture(scope="module")
def stored(client: TestClient) -> dict[str, str]:
    conv = client.post(
        "/v1/conversations", json={"items": [{"type": "message", "role": "user", "content": "hi"}]}
    )
    assert conv.status_code == 200, conv.text
    resp = client.post("/v1/responses", json={"model": MODEL, "input": "hi", "max_output_tokens": 8})
    assert resp.status_code == 200, resp.text
    return {"conv": conv.json()["id"], "resp": resp.json()["id"]}


def refused(r: Any, param: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    body = r.json()
    error = body["error"]
    if body.get("type") == "error":  # Anthropic's shape (/v1/messages/batches): no param field
        assert error["type"] == "invalid_request_error" and error["message"].startswith(param), error
        return
    assert error["param"] == param and error["message"].startswith(param), error


URLS = [
    ("GET", "/v1/responses/a%00b", "response_id"),
    ("DELETE", "/v1/responses/a%00b", "response_id"),
    ("POST", "/v1/responses/a%00b/cancel", "response_id"),
    ("GET", "/v1/responses/{resp}/input_items?after=a%00b", "after"),
    ("GET", "/v1/responses/{resp}/input_items?before=%00", "before"),
    ("GET", "/v1/conversations/c%00", "conversation_id"),
    ("DELETE", "/v1/conversations/c%00", "conversation_id"),
    ("GET", "/v1/conversations/{conv}/items?after=%00", "after"),
    ("GET", "/v1/conversations/{conv}/items/i%00", "item_id"),
    ("DELETE", "/v1/conversations/{conv}/items/i%00", "item_id"),
    ("GET", "/v1/responses/" + "r" * (MAX_ID_CHARS + 1), "response_id"),
    ("GET", "/v1/files/f%00", "file_id"),
    ("DELETE", "/v1/files/f%00", "file_id"),
    ("GET", "/v1/files/f%00/content", "file_id"),
    ("GET", "/v1/files?after=%00", "after"),
    ("GET", "/v1/files?purpose=batch%00", "purpose"),
    ("GET", "/v1/batches/b%00", "batch_id"),
    ("POST", "/v1/batches/b%00/cancel", "batch_id"),
    ("GET", "/v1/batches?after=b%00", "after"),
    ("GET", "/v1/messages/batches/b%00", "batch_id"),
    ("GET", "/v1/messages/batches?after_id=%00", "after_id"),
    ("GET", "/v1/messages/batches?before_id=%00", "before_id"),
]


@pytest.mark.parametrize(("method", "url", "param"), URLS)
def test_a_nul_in_a_path_id_or_a_cursor_is_a_400_naming_it(
    client: TestClient, stored: dict[str, str], method: str, url: str, param: str
) -> None:
    refused(client.request(method, url.format(**stored)), param)


BODIES = [
    (
        "/v1/responses",
        {"model": MODEL, "input": "hi", "previous_response_id": "r\x00"},
        "previous_response_id",
    ),
    ("/v1/responses", {"model": MODEL, "input": "hi", "conversation": "c\x00"}, "conversation"),
    ("/v1/responses", {"model": MODEL, "input": "hi", "conversation": {"id": "c\x00"}}, "conversation.id"),
    ("/v1/responses", {"model": MODEL, "input": [{"type": "item_reference", "id": "m\x00"}]}, "input[0].id"),
    (
        "/v1/responses",
        {"model": MODEL, "input": [{"type": "message", "role": "user", "content": "hi", "id": "m\x00"}]},
        "input[0].id",
    ),
    (
        "/v1/conversations",
        {"items": [{"type": "message", "role": "user", "content": "hi", "id": "m\x00"}]},
        "items[0].id",
    ),
    ("/v1/conversations", {"items": [{"type": "item_reference", "id": "m\x00"}]}, "items[0].id"),
    (
        "/v1/conversations",
        {"items": [{"type": "message", "role": "user", "content": "hi", "id": "m" * (MAX_ID_CHARS + 1)}]},
        "items[0].id",
    ),
    ("/v1/conversations/{conv}", {"metadata": {}}, None),
    (
        "/v1/batches",
        {"input_file_id": "file\x00", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        "input_file_id",
    ),
    (
        "/v1/conversations/{conv}/items",
        {"items": [{"type": "message", "role": "user", "content": "x", "id": "\x00"}]},
        "items[0].id",
    ),
]


@pytest.mark.parametrize(("path", "body", "param"), BODIES)
def test_a_nul_in_an_id_of_a_body_is_a_400_naming_it(
    client: TestClient, stored: dict[str, str], path: str, body: dict[str, Any], param: str | None
) -> None:
    r = client.post(
        path.format(**stored), content=json.dumps(body), headers={"content-type": "application/json"}
    )
    if param is None:
        assert r.status_code == 200, r.text
    else:
        refused(r, param)


def test_text_with_a_nul_is_stored_and_read_back_as_it_came(client: TestClient) -> None:
    conv = client.post(
        "/v1/conversations",
        json={
            "metadata": {"k": "v\x00w"},
            "items": [{"type": "message", "role": "user", "content": "a\x00b"}],
        },
    )
    assert conv.status_code == 200, conv.text
    assert conv.json()["metadata"] == {"k": "v\x00w"}
    items = client.get(f"/v1/conversations/{conv.json()['id']}/items")
    assert items.status_code == 200, items.text
    assert items.json()["data"][0]["content"][0]["text"] == "a\x00b"
    resp = client.post(
        "/v1/responses", json={"model": MODEL, "input": "hi\x00 there", "max_output_tokens": 30}
    )
    assert resp.status_code == 200, resp.text
    again = client.get(f"/v1/responses/{resp.json()['id']}/input_items")
    assert again.json()["data"][0]["content"][0]["text"] == "hi\x00 there"
