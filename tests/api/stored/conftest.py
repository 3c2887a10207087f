"""`serve` processes with a stored state (SQLite in a temporary folder, or a real PostgreSQL), driven
through the official openai SDK."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.postgres import postgres_server
from tests.support.servers import Server, start_frontend

__all__ = ["postgres_server"]  # the session fixture, for test_replicas

API_KEY = "state-test-key"
MODEL = "deepseek-v4-flash"


def start_stored(*extra: str, state_url: str | None = None) -> Server:
    """A frontend keeping its state at ``state_url`` (default: a SQLite file in a fresh folder)."""
    if state_url is None:
        state_url = "sqlite:///" + str(Path(tempfile.mkdtemp(prefix="dsfe-state-")) / "state.sqlite3")
    return start_frontend(
        "--api-key",
        API_KEY,
        "--model-alias",
        "gpt-*",
        "--context-length",
        "65536",
        "--state-store",
        state_url,
        *extra,
    )


@pytest.fixture(scope="module")
def stored_server() -> Iterator[Server]:
    with start_stored() as server:
        yield server


def sdk(server: Any, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture()
def client(stored_server: Server) -> openai.OpenAI:
    return sdk(stored_server)


#: the first turn of the two-turn conversation the stored-state tests chain
FIRST_TURN = "My name is Ada. Reply with exactly: noted"
SECOND_TURN = "What is my name?"


def assert_same_prompt_as_resent(client: openai.OpenAI, stored: Any, earlier_output: list[Any]) -> None:
    """``stored`` (a response continuing the first turn) read a prompt exactly as long as the same
    conversation resent whole by the client (``store: false``): the first turn, ``earlier_output``,
    then the second turn."""
    resent = client.responses.create(
        model=MODEL,
        store=False,
        input=[
            {"role": "user", "content": FIRST_TURN},
            *[item.model_dump(exclude_none=True) for item in earlier_output],
            {"role": "user", "content": SECOND_TURN},
        ],
    )
    assert stored.usage is not None and resent.usage is not None
    assert stored.usage.input_tokens == resent.usage.input_tokens
