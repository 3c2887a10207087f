"""Engine failures as Anthropic clients see them: an error status before the first token,
an ``event: error`` with Anthropic's error body after it.

The app runs in-process (Starlette's TestClient) over a scripted engine backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from deepseek_frontend.api.app import create_app
from deepseek_frontend.api.config import ServerConfig
from deepseek_frontend.engines.base import EngineChunk, GenerateRequest
from deepseek_frontend.errors import EngineStreamError, NoHealthyWorkerError
from deepseek_frontend.tokenization import PromptTokenizer


class ScriptedBackend:
    """Yields ``chunks`` then raises ``error`` (if any)."""

    def __init__(self, chunks: list[EngineChunk], error: Exception | None) -> None:
        self.chunks = chunks
        self.error = error

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        for chunk in self.chunks:
            yield chunk
        if self.error is not None:
            raise self.error

    def supports_constraint(self, kind: str) -> bool:
        return True


@pytest.fixture()
def make_client(prompt_tokenizer: PromptTokenizer) -> Iterator[Any]:
    clients: list[TestClient] = []

    def make(chunks: list[EngineChunk], error: Exception | None) -> TestClient:
        config = ServerConfig(served_model_name="deepseek-v4-flash")
        app = create_app(config, tokenizer=prompt_tokenizer, backend=ScriptedBackend(chunks, error))
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


BODY = {"model": "deepseek-v4-flash", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((lines["event"], orjson.loads(lines["data"])))
    return events


def test_failure_before_the_first_token_is_an_overloaded_error_status(make_client: Any) -> None:
    client = make_client([], NoHealthyWorkerError("no healthy worker"))
    response = client.post("/v1/messages", json={**BODY, "stream": True})
    assert response.status_code == 503
    assert response.json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "no healthy worker"},
    }


def test_failure_mid_stream_ends_the_stream_with_an_error_event(
    make_client: Any, prompt_tokenizer: PromptTokenizer
) -> None:
    ids = prompt_tokenizer.encode_text("Thinking about it")
    client = make_client([EngineChunk(token_ids=ids, prompt_tokens=5)], EngineStreamError("worker died"))
    with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200
        events = sse_events(response.read().decode())
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert "content_block_delta" in names and "message_stop" not in names
    name, payload = events[-1]
    assert name == "error" and payload["type"] == "error"
    assert payload["error"]["type"] == "api_error" and payload["error"]["message"]
