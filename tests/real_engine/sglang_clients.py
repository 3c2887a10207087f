"""Client-side helpers of the real-SGLang tests: ``serve --engine sglang`` in front of the servers of
:mod:`tests.real_engine.sglang_servers`, the wire shapes a client reads back, and bounded waits on a
server's own state (its Prometheus ``/metrics``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.real_engine.sglang_servers import SGLANG_CONTEXT_LENGTH
from tests.support.servers import Server, start_frontend

#: a DeepSeek-V4 name: the frontend renders V4 prompts with the bundled tokenizer
SERVED_MODEL = "deepseek-v4-flash"
TIMEOUT = httpx.Timeout(120.0)
#: DeepSeek-V4's tool-call markup; a client must never see it (the frontend parses it into tool calls)
DSML = "｜DSML｜"
#: output tokens of an ordinary request: a few chunks at ~9 ms a token on CPU
MAX_TOKENS = 12
#: the ordinary request's question
QUESTION = "Tell me about the sea, in a few words."


def sglang_frontend(*flags: str) -> Server:
    """``deepseek-frontend serve --engine sglang`` with ``flags`` (``--worker URL``, or ``--prefill-worker P
    --decode-worker D``, plus any others). Stateless: the default store is the user's SQLite file, which
    another checkout of the frontend on the same machine may have migrated to a newer schema."""
    return start_frontend(
        "--engine",
        "sglang",
        *flags,
        "--served-model-name",
        SERVED_MODEL,
        "--context-length",
        str(SGLANG_CONTEXT_LENGTH),
        "--state-store",
        "none",
    )


def sse_data(text: str) -> list[dict[str, Any]]:
    """The JSON ``data:`` payloads of an OpenAI-style stream, which must end with ``data: [DONE]``."""
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    assert data and data[-1] == "[DONE]", text[-2000:]
    return [json.loads(d) for d in data[:-1]]


def sse_typed(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``(event, data)`` of a stream whose events are named (Anthropic Messages, OpenAI Responses)."""
    events: list[tuple[str, dict[str, Any]]] = []
    name = ""
    for line in text.splitlines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            payload = json.loads(line[5:].strip())
            events.append((name or payload.get("type", ""), payload))
            name = ""
    return events


def metric(url: str, name: str, **labels: str) -> float:
    """The sum of the Prometheus samples ``name`` at ``url``/metrics whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10.0).text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.1)
