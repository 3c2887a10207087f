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
