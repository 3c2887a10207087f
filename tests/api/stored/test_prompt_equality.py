"""previous_response_id and conversation render exactly the prompt of the resent conversation.

The app runs in-process with a SQLite store; the test reads the same database through a store of
its own, resolves the stateful body with the code the server runs (``resolve_stateful``), and
renders it and the body a client resending everything would send: the prompts are byte-equal.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from deepseek_frontend.api.adapters import to_chat_request
from deepseek_frontend.api.responses.convert import convert_responses_request
from deepseek_frontend.api.responses.stateful import resolve_stateful
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig, ServerOptions
from deepseek_frontend.fleet.store_config import StateOptions
from deepseek_frontend.formats.segments import join_segments
from deepseek_frontend.server.app import create_app
from deepseek_frontend.state import open_store_url, owner_key
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support import tools

KEY = "prompt-equality-key"


@pytest.fixture()
def app_client(prompt_tokenizer: PromptTokenizer, tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    url = f"sqlite:///{tmp_path}/state.sqlite3"
    config = ServerConfig(
        ModelConfig(served_model_name="deepseek-v4-flash"),
        server=ServerOptions(api_key=KEY, state=StateOptions(url=url)),
    )
    with TestClient(create_app(config, tokenizer=prompt_tokenizer)) as client:
        client.headers["Authorization"] = f"Bearer {KEY}"
        yield client, url


def _prompt(client: TestClient, body: dict[str, Any]) -> str:
    state = client.app.frontend  # type: ignore[attr-defined]
    converted = convert_responses_request(body)
    return join_segments(
        state.models.default.pipeline.renderer.render(to_chat_request(converted, state.config, "resp-test"))
    )


def _resolved(url: str, body: dict[str, Any]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        store = await open_store_url(url)
        try:
            return (await resolve_stateful(body, store, owner_key(KEY), True)).body
        finally:
            await store.close()

    return asyncio.run(main())


def test_a_tool_loop_continued_by_id_renders_the_resent_prompt(app_client: tuple[TestClient, str]) -> None:
    client, url = app_client
    first_input = [
        {"role": "developer", "content": "Use tools when they help."},
        {"role": "user", "content": "What's the weather in Paris?"},
    ]
    common = {"model": "deepseek-v4-flash", "tools": [tools.WEATHER.responses()]}
    first = client.post("/v1/responses", json={**common, "input": first_input}).json()
    calls = [item for item in first["output"] if item["type"] == "function_call"]
    assert calls and any(item["type"] == "reasoning" for item in first["output"])
    new_input = [{"type": "function_call_output", "call_id": calls[0]["call_id"], "output": '{"temp": 21}'}]
    chained = {**common, "previous_response_id": first["id"], "input": new_input}
    resent = {**common, "input": [*first_input, *first["output"], *new_input]}
    assert _prompt(client, _resolved(url, chained)) == _prompt(client, resent)
    # and the server answers the chained request from the same prompt: same prompt token count
    second = client.post("/v1/responses", json=chained).json()
    again = client.post("/v1/responses", json={**resent, "store": False}).json()
    assert second["usage"]["input_tokens"] == again["usage"]["input_tokens"]
    # a third turn chains two stored responses
    third_input = [{"role": "user", "content": "Thanks. And in Rome?"}]
    third = {**common, "previous_response_id": second["id"], "input": third_input}
    resent_third = {**common, "input": [*resent["input"], *second["output"], *third_input]}
    assert _prompt(client, _resolved(url, third)) == _prompt(client, resent_third)
