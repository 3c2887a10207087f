"""One rule for credentials, on every route (edge/auth.py ``presented_key``; docs/serving.md, "API keys").

A key comes in ``Authorization: Bearer KEY`` or ``x-api-key: KEY``; a header repeated with the same
value counts once. Ambiguous or malformed credentials are a 401 naming why -- never is one silently
preferred over another. Before: the last ``Authorization`` won, the first ``x-api-key`` won, and an
empty ``Bearer`` beat a correct ``x-api-key``. The same rule decides the owner of stored objects and
whether ``/health`` shows its details.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.edge.auth import AmbiguousCredentialsError, presented_key
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.fleet.store_config import StateOptions
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer

KEY = "sk-right"
OTHER = "sk-other"
MODEL = "deepseek-v4-flash"


def headers(*pairs: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode(), value.encode()) for name, value in pairs]


@pytest.mark.parametrize(
    "pairs",
    [
        [("authorization", f"Bearer {KEY}")],
        [("authorization", f"bearer   {KEY} ")],
        [("x-api-key", KEY)],
        [("authorization", f"Bearer {KEY}"), ("authorization", f"Bearer {KEY}")],
        [("x-api-key", KEY), ("x-api-key", KEY)],
        [("authorization", f"Bearer {KEY}"), ("x-api-key", KEY)],
    ],
)
def test_one_key_however_it_is_sent(pairs: list[tuple[str, str]]) -> None:
    assert presented_key(headers(*pairs)) == KEY.encode()


def test_no_credential_header_presents_none() -> None:
    assert presented_key(headers(("content-type", "application/json"))) is None


AMBIGUOUS = {
    "empty bearer": [("authorization", "Bearer "), ("x-api-key", KEY)],
    "bare bearer": [("authorization", "Bearer")],
    "basic scheme": [("authorization", "Basic dXNlcjpwYXNz"), ("x-api-key", KEY)],
    "token with a space": [("authorization", f"Bearer {KEY} extra")],
    "two authorization keys": [("authorization", f"Bearer {OTHER}"), ("authorization", f"Bearer {KEY}")],
    "two x-api-keys": [("x-api-key", KEY), ("x-api-key", OTHER)],
    "competing headers": [("authorization", f"Bearer {OTHER}"), ("x-api-key", KEY)],
    "empty x-api-key": [("authorization", f"Bearer {KEY}"), ("x-api-key", "")],
}


@pytest.mark.parametrize("case", list(AMBIGUOUS))
def test_ambiguous_or_malformed_credentials_name_the_problem(case: str) -> None:
    with pytest.raises(AmbiguousCredentialsError):
        presented_key(headers(*AMBIGUOUS[case]))


@pytest.fixture(scope="module")
def client(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    folder = Path(tempfile.mkdtemp(prefix="dsfe-auth-"))
    config = ServerConfig(
        ModelConfig(served_model_name=MODEL),
        server=ServerOptions(
            api_keys=(KEY, OTHER), state=StateOptions(url=f"sqlite:///{folder / 'state.sqlite3'}")
        ),
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as c:
        yield c


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
ROUTES = [
    ("POST", "/v1/chat/completions", CHAT),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 4}),
    ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 4, **CHAT}),
    ("POST", "/v1/messages/count_tokens", {"model": MODEL, **CHAT}),
    ("POST", "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 4}),
    ("POST", "/v1/conversations", {}),
    ("GET", "/v1/models", None),
    ("GET", "/v1/responses/resp_x", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
@pytest.mark.parametrize("case", list(AMBIGUOUS))
def test_every_route_answers_ambiguous_credentials_with_a_401_naming_them(
    client: TestClient, method: str, path: str, body: object, case: str
) -> None:
    r = client.request(method, path, json=body, headers=AMBIGUOUS[case])
    assert r.status_code == 401, (case, r.status_code, r.text)
    payload = r.json()
    message = payload["error"]["message"]
    assert "Incorrect API key" not in message and "Missing API key" not in message, message
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error" and payload["error"]["type"] == "authentication_error"


def test_either_header_alone_or_both_with_the_same_key_is_served(client: TestClient) -> None:
    for sent in (
        [("authorization", f"Bearer {KEY}")],
        [("x-api-key", KEY)],
        [("authorization", f"Bearer {KEY}"), ("x-api-key", KEY)],
    ):
        r = client.post("/v1/chat/completions", json=CHAT, headers=sent)
        assert r.status_code == 200, (sent, r.text)


def test_stored_objects_belong_to_the_one_key_presented(client: TestClient) -> None:
    """The owner is read by the same rule: a conversation made with x-api-key is found with the same
    key as a Bearer token, and not with another key."""
    made = client.post("/v1/conversations", json={}, headers={"x-api-key": KEY})
    assert made.status_code == 200, made.text
    conv = made.json()["id"]
    mine = client.get(f"/v1/conversations/{conv}", headers={"authorization": f"Bearer {KEY}"})
    assert mine.status_code == 200, mine.text
    theirs = client.get(f"/v1/conversations/{conv}", headers={"x-api-key": OTHER})
    assert theirs.status_code == 404


def test_health_shows_details_only_to_one_valid_key(client: TestClient) -> None:
    assert "models" in client.get("/health", headers={"x-api-key": KEY}).json()
    for case in ("empty bearer", "competing headers"):
        r = client.get("/health", headers=AMBIGUOUS[case])
        assert r.status_code == 200 and set(r.json()) == {"status"}, (case, r.text)
