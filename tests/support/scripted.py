"""An in-process app over the scripted engine, for failure tests of any protocol.

:func:`scripted_client` runs the real app (Starlette's ``TestClient``, no sockets) over a
:class:`~tests.support.engine.ScriptedEngine` that yields the given engine chunks and then raises
the given error: a failure before the first token (no chunks) or mid-stream (some chunks first).
:func:`scripted_stream` sends one streamed request to it; :func:`named_events` parses an
``event:`` / ``data:`` SSE body (Anthropic, Responses).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from starlette.testclient import TestClient

from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.generation import EngineChunk
from deepseek_frontend.server.app import create_app
from deepseek_frontend.tokenization import PromptTokenizer
from tests.support.engine import ALL_CONSTRAINTS, ScriptedEngine

#: the served model name of :func:`scripted_client`'s app
MODEL = "deepseek-v4-flash"


@contextmanager
def scripted_client(
    tokenizer: PromptTokenizer, texts: list[str], error: Exception | None
) -> Iterator[TestClient]:
    """A started ``TestClient`` for the app over a backend that sends one engine chunk per text of
    ``texts`` (tokenized), then raises ``error``; closed on exit."""
    chunks = [EngineChunk(token_ids=tokenizer.encode_text(text), prompt_tokens=5) for text in texts]
    engine = ScriptedEngine(tokenizer, chunks=chunks, error=error, constraints=ALL_CONSTRAINTS)
    app = create_app(ServerConfig(ModelConfig(served_model_name=MODEL)), tokenizer=tokenizer, backend=engine)
    with TestClient(app) as client:
        yield client


def scripted_stream(
    tokenizer: PromptTokenizer, texts: list[str], error: Exception | None, path: str, body: dict[str, Any]
) -> tuple[int, list[tuple[str, dict[str, Any]]]]:
    """The status and :func:`named_events` of one streamed ``POST path`` to :func:`scripted_client`'s app."""
    with (
        scripted_client(tokenizer, texts, error) as client,
        client.stream("POST", path, json=body) as response,
    ):
        return response.status_code, named_events(response.read().decode())


def named_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, JSON payload)`` for each event of an ``event:`` / ``data:`` SSE body."""
    events = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], orjson.loads(fields["data"])))
    return events
