"""Property-based fuzzing of every request field of the five APIs against the real app.

The app is ``server.app.create_app`` with its in-process simulated engine, an API key and a SQLite
store, driven by Starlette's TestClient. Each endpoint gets a few hundred hostile requests
(tests/api/fuzzing.py: its base bodies with fields changed to wrong types, wrong values, huge numbers,
NULs, odd Unicode, deep nesting; odd ids and list cursors in URLs), derandomized so every run sends
the same ones. Whatever comes in:

* nothing answers 5xx, and no stream carries an internal error;
* every error body has its API's shape -- OpenAI's ``{"error": {"message", "type", "param",
  "code"}}`` on the OpenAI routes, Anthropic's ``{"type": "error", "error": {"type", "message"}}``
  on ``/v1/messages``;
* every 400 names what is wrong (its message is not empty).

Hypothesis was chosen over schemathesis: the server publishes no OpenAPI description, and the
interesting inputs are the ones an OpenAPI description would rule out (wrong types everywhere).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.fleet.store_config import StateOptions
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer
from tests.api import fuzzing
from tests.api.fuzzing import ODD_IDS, hostile_bodies

pytestmark = pytest.mark.timeout(600)

KEY = "fuzz-key"
#: examples per endpoint: enough to reach every field a few times with every kind of value
EXAMPLES = 250
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=(Phase.explicit, Phase.generate, Phase.shrink),
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def client(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    folder = Path(tempfile.mkdtemp(prefix="dsfe-fuzz-"))
    config = ServerConfig(
        ModelConfig(served_model_name=fuzzing.MODEL, context_length=16384),
        server=ServerOptions(
            api_key=KEY,
            max_body_bytes=2_000_000,
            state=StateOptions(url=f"sqlite:///{folder / 'state.sqlite3'}"),
        ),
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer), raise_server_exceptions=False) as c:
        c.headers["Authorization"] = f"Bearer {KEY}"
        yield c


def check_openai_error(body: Any) -> None:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str), error
    assert error["param"] is None or isinstance(error["param"], str), error


def check_anthropic_error(body: Any) -> None:
    assert isinstance(body, dict) and body.get("type") == "error" and set(body) == {"type", "error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"type", "message"}, error
    assert isinstance(error["type"], str) and isinstance(error["message"], str) and error["message"], error


def check_answer(r: Any, anthropic: bool = False) -> None:
    """No 5xx, no internal error inside a stream, and an error in the API's shape."""
    assert r.status_code < 500, (r.status_code, r.text[:2000])
    assert "internal server error" not in r.text, r.text[:2000]
    if r.status_code >= 400:
        body = orjson.loads(r.content)
        (check_anthropic_error if anthropic else check_openai_error)(body)


def post(client: TestClient, path: str, raw: bytes, anthropic: bool = False) -> None:
    headers = {"content-type": "application/json"}
    if anthropic:
        headers["anthropic-version"] = "2023-06-01"
    r = client.post(path, content=raw, headers=headers)
    check_answer(r, anthropic)


#: one value of each JSON type (and the shapes that broke handlers before: an object where a
#: string is looked up in a table, a number past every integer type, nesting past orjson's limit)
EACH_TYPE: list[Any] = [
    {},
    [],
    "",
    "\x00",
    -1,
    10**30,
    1e308,
    None,
    True,
    [{}],
    {"a": {}},
    fuzzing.nested(300),
]
SWEPT = {
    "/v1/chat/completions": (fuzzing.CHAT_BASES, fuzzing.CHAT_EXTRA),
    "/v1/completions": (fuzzing.COMPLETION_BASES, fuzzing.COMPLETION_EXTRA),
    "/v1/messages": (fuzzing.MESSAGES_BASES, fuzzing.MESSAGES_EXTRA),
    "/v1/responses": (fuzzing.RESPONSES_BASES, fuzzing.RESPONSES_EXTRA),
    "/v1/conversations": (fuzzing.CONVERSATION_BASES, fuzzing.CONVERSATION_EXTRA),
}


@pytest.mark.parametrize("endpoint", list(SWEPT))
def test_every_field_with_a_value_of_each_json_type(client: TestClient, endpoint: str) -> None:
    """Deterministic sweep: every field of every base body, one at a time, set to each of
    :data:`EACH_TYPE` -- a 400 naming something, or a success; never a 5xx."""
    bases, extra = SWEPT[endpoint]
    anthropic = endpoint == "/v1/messages"
    sent = 0
    for base in bases:
        for path in sorted({*fuzzing.paths(base), *extra}, key=repr):
            for value in EACH_TYPE:
                post(client, endpoint, fuzzing.encode(fuzzing.with_value(base, path, value)), anthropic)
                sent += 1
    assert sent > 100


def test_a_thinking_type_of_the_wrong_json_type_is_a_400_naming_it(client: TestClient) -> None:
    for kind in ({}, [], 1, None):
        r = client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": kind}},
        )
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "thinking.type"
    r = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "thinking": 3}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking", r.text


def test_a_body_nested_past_the_limit_is_a_400_naming_the_path(client: TestClient) -> None:
    """Stored bodies are encoded again (orjson stops at 254 levels): nesting is bounded up front."""
    body = {**fuzzing.CONVERSATION_BASES[0], "metadata": {"k": fuzzing.nested(200, "dict")}}
    r = client.post(
        "/v1/conversations", content=fuzzing.encode(body), headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith("metadata.k.a.a") and "128 levels" in error["message"], error


@FUZZ
@given(raw=hostile_bodies(fuzzing.CHAT_BASES, fuzzing.CHAT_EXTRA))
def test_chat_completions(client: TestClient, raw: bytes) -> None:
    post(client, "/v1/chat/completions", raw)


@FUZZ
@given(raw=hostile_bodies(fuzzing.COMPLETION_BASES, fuzzing.COMPLETION_EXTRA))
def test_completions(client: TestClient, raw: bytes) -> None:
    post(client, "/v1/completions", raw)


@FUZZ
@given(raw=hostile_bodies(fuzzing.MESSAGES_BASES, fuzzing.MESSAGES_EXTRA), count=st.booleans())
def test_messages(client: TestClient, raw: bytes, count: bool) -> None:
    post(client, "/v1/messages/count_tokens" if count else "/v1/messages", raw, anthropic=True)


@FUZZ
@given(raw=hostile_bodies(fuzzing.RESPONSES_BASES, fuzzing.RESPONSES_EXTRA))
def test_responses(client: TestClient, raw: bytes) -> None:
    post(client, "/v1/responses", raw)


@pytest.fixture(scope="module")
def conversation(client: TestClient) -> str:
    r = client.post("/v1/conversations", json=fuzzing.CONVERSATION_BASES[0])
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


@FUZZ
@given(raw=hostile_bodies(fuzzing.CONVERSATION_BASES, fuzzing.CONVERSATION_EXTRA), where=st.integers(0, 2))
def test_conversations(client: TestClient, conversation: str, raw: bytes, where: int) -> None:
    path = (
        "/v1/conversations",
        f"/v1/conversations/{conversation}/items",
        f"/v1/conversations/{conversation}",
    )
    post(client, path[where], raw)


@FUZZ
@given(
    object_id=ODD_IDS,
    cursor=st.one_of(st.none(), ODD_IDS),
    limit=st.one_of(
        st.none(), st.sampled_from(["0", "-1", "101", "1e3", "x", "%00", "99999999999999999999"])
    ),
    order=st.one_of(st.none(), st.sampled_from(["asc", "desc", "%00", "sideways"])),
    which=st.integers(0, 12),
)
def test_stored_object_urls(
    client: TestClient,
    conversation: str,
    object_id: str,
    cursor: str | None,
    limit: str | None,
    order: str | None,
    which: int,
) -> None:
    """Ids in paths and list cursors of the stored responses, conversations, files and batches."""
    oid = object_id
    query = "&".join(
        f"{name}={value}"
        for name, value in (
            ("after", cursor),
            ("before", cursor if which % 2 else None),
            ("limit", limit),
            ("order", order),
        )
        if value is not None
    )
    conv = conversation if which % 3 else oid
    requests = [
        ("GET", f"/v1/responses/{oid}"),
        ("DELETE", f"/v1/responses/{oid}"),
        ("GET", f"/v1/responses/{oid}/input_items?{query}"),
        ("POST", f"/v1/responses/{oid}/cancel"),
        ("GET", f"/v1/conversations/{conv}/items?{query}"),
        ("GET", f"/v1/conversations/{conv}/items/{oid}"),
        ("DELETE", f"/v1/conversations/{oid}"),
        ("GET", f"/v1/files/{oid}"),
        ("GET", f"/v1/files?after={oid}&purpose={oid}"),
        ("GET", f"/v1/batches/{oid}"),
        ("GET", f"/v1/batches?{query}"),
        ("GET", f"/v1/messages/batches/{oid}"),
        ("GET", f"/v1/messages/batches?after_id={oid}"),
    ]
    method, url = requests[which]
    r = client.request(method, url)
    check_answer(r, anthropic=url.startswith("/v1/messages"))
