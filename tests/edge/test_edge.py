"""The request edge: the API shape of errors answered before a handler, the request context a
handler gets, and the process's background tasks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.api.anthropic.routes import ANTHROPIC
from deepseek_frontend.edge.background import BackgroundTasks
from deepseek_frontend.edge.errors import OPENAI, shape_for
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer

KEY = "edge-key"


@pytest.fixture(scope="module")
def client(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    config = ServerConfig(
        ModelConfig(served_model_name="deepseek-v4-flash", context_length=8192),
        server=ServerOptions(api_key=KEY),
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as c:
        yield c


def test_paths_take_the_shape_of_the_api_they_belong_to() -> None:
    shapes = (("/v1/messages", ANTHROPIC),)
    assert shape_for("/v1/messages", shapes) is ANTHROPIC
    assert shape_for("/v1/messages/count_tokens", shapes) is ANTHROPIC
    assert shape_for("/v1/chat/completions", shapes) is OPENAI
    assert shape_for("/v1/nothing-here", shapes) is OPENAI


def test_a_missing_key_is_refused_in_the_shape_of_the_api_asked(client: TestClient) -> None:
    anthropic = client.post("/v1/messages", json={"model": "deepseek-v4-flash", "max_tokens": 5})
    assert anthropic.status_code == 401
    assert anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "authentication_error"
    openai = client.post("/v1/chat/completions", json={"messages": []})
    assert openai.status_code == 401
    assert openai.json()["error"]["type"] == "authentication_error" and "type" not in openai.json()


def test_an_unknown_route_is_answered_in_the_shape_of_its_api(client: TestClient) -> None:
    headers = {"x-api-key": KEY}
    anthropic = client.get("/v1/messages/nothing-here", headers=headers)
    assert anthropic.status_code in (404, 405) and anthropic.json()["type"] == "error"
    openai = client.get("/v1/nothing-here", headers=headers)
    assert openai.status_code == 404 and openai.json()["error"]["type"] == "not_found_error"


def test_every_answer_carries_the_request_id_and_an_error_one_too(client: TestClient) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    ok = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}, headers=headers
    )
    bad = client.post("/v1/chat/completions", json={"messages": "not a list"}, headers=headers)
    assert ok.status_code == 200 and ok.headers["x-request-id"].startswith("chatcmpl-")
    assert bad.status_code == 400 and bad.headers["x-request-id"].startswith("chatcmpl-")
    assert ok.headers["x-request-id"] != bad.headers["x-request-id"]
    assert ok.json()["id"] == ok.headers["x-request-id"]


def test_background_tasks_are_found_by_key_cancelled_and_stopped_at_shutdown() -> None:
    async def scenario() -> tuple[bool, bool, list[str], bool]:
        tasks = BackgroundTasks()
        seen: list[str] = []

        async def work(name: str) -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                seen.append(f"{name}:{'shutdown' if tasks.closing else 'cancelled'}")
                raise

        tasks.start("a", work("a"))
        tasks.start("b", work("b"))
        await asyncio.sleep(0)
        cancelled = await tasks.cancel("a")
        unknown = await tasks.cancel("nothing")
        await tasks.aclose()
        return cancelled, unknown, seen, not tasks.tasks

    cancelled, unknown, seen, empty = asyncio.run(scenario())
    assert cancelled is True and unknown is False
    assert seen == ["a:cancelled", "b:shutdown"]
    assert empty
