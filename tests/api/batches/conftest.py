"""`serve` processes for the Batch API tests, driven through the official openai and anthropic SDKs.

Three API keys (a keys file): ``main`` and ``other`` without batch limits of their own, ``small``
with tight ones. The simulated engine answers in-process; ``--sim-itl-ms`` makes lines that write
many words slow enough to be cancelled, expired or cut by a kill mid-run.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.postgres import postgres_server
from tests.support.servers import Server, start_frontend

__all__ = ["postgres_server"]  # the session fixture, for the replica tests

MODEL = "deepseek-v4-flash"
MAIN_KEY = "batch-main-key"
OTHER_KEY = "batch-other-key"
SMALL_KEY = "batch-small-key"
#: the small key's limits (keys file)
SMALL_LINES = 3
SMALL_BYTES = 4000
#: seconds a runner's lease lasts in these tests (a killed process's lines run again this late)
LEASE_S = 2
FINAL = ("completed", "failed", "expired", "cancelled")
CHAT = "/v1/chat/completions"


def keys_file() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="dsfe-batch-keys-"))
    path = folder / "keys.json"
    path.write_text(
        json.dumps(
            [
                {"name": "main", "key": MAIN_KEY},
                {"name": "other", "key": OTHER_KEY},
                {
                    "name": "small",
                    "key": SMALL_KEY,
                    "batch_max_lines": SMALL_LINES,
                    "batch_max_bytes": SMALL_BYTES,
                    "max_active_batches": 1,
                },
            ]
        )
    )
    return path


def sqlite_url() -> str:
    return "sqlite:///" + str(Path(tempfile.mkdtemp(prefix="dsfe-batch-")) / "state.sqlite3")


def start_batch_server(*extra: str, state_url: str | None = None) -> Server:
    """A frontend keeping its state at ``state_url`` (default: a new SQLite file)."""
    return start_frontend(
        "--keys-file",
        str(keys_file()),
        "--context-length",
        "65536",
        "--state-store",
        state_url or sqlite_url(),
        "--batch-lease-timeout",
        str(LEASE_S),
        *extra,
    )


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One server for a module: two batch lines at once, 5 ms between tokens, 6 MB uploads."""
    with start_batch_server(
        "--batch-concurrency", "2", "--sim-itl-ms", "5", "--max-file-bytes", "6000000"
    ) as s:
        yield s


def oai(server: Server, key: str = MAIN_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def claude(server: Server, key: str = MAIN_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=60)


def line(custom_id: str, body: dict[str, Any], url: str = CHAT, **extra: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}


def chat(text: str, **body: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **body}


def jsonl(lines: list[Any]) -> bytes:
    return "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()


def upload(client: openai.OpenAI, lines: list[Any], name: str = "in.jsonl") -> Any:
    return client.files.create(file=(name, jsonl(lines)), purpose="batch")


def wait_batch(
    client: openai.OpenAI, batch_id: str, until: tuple[str, ...] = FINAL, timeout: float = 60
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in until:
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(
                f"batch {batch_id} is {batch.status}, not {until} (not within {timeout:g} s)"
            )
        time.sleep(0.05)


def wait_message_batch(client: anthropic.Anthropic, batch_id: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        if time.monotonic() > deadline:
            raise AssertionError(
                f"message batch {batch_id} is {batch.processing_status} (not within {timeout:g} s)"
            )
        time.sleep(0.05)


def results(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    """The JSON lines of an output or error file (none: no file)."""
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def in_flight(server: Server) -> int:
    """Engine requests the server's simulated engine is running now."""
    health = httpx.get(server.url + "/health", headers={"authorization": f"Bearer {MAIN_KEY}"}).json()
    return sum(worker["in_flight"] for worker in health["workers"])


_DONE = re.compile(r"request done .*endpoint=(/v1/\S+) status=(\d+)")


def completed_lines(*servers: Server, endpoint: str = CHAT) -> int:
    """Requests to ``endpoint`` the servers' logs say were answered 200 (batch lines included)."""
    count = 0
    for s in servers:
        for found in _DONE.finditer(s.log()):
            if found.group(1) == endpoint and found.group(2) == "200":
                count += 1
    return count
