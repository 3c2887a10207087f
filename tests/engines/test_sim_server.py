"""The sim server's ``/generate`` over ASGI: what a client reads, message by message.

Called as the HTTP server calls it (scope, receive, send), so each body write is seen as sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import orjson

from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import ZERO_DELAY_BATCH, build_sim_app

from .conftest import prompt_ids


def generate(app: Any, body: bytes, path: str = "/generate", method: str = "POST") -> list[bytes]:
    """The body writes of one request (by default ``POST /generate`` with ``body``)."""
    writes: list[bytes] = []
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            writes.append(message["body"])

    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
    asyncio.run(app(scope, receive, send))
    return writes


def events(write: bytes) -> list[dict[str, Any]]:
    return [json.loads(e[6:]) for e in write.decode().split("\n\n") if e.startswith("data: {")]


def test_with_no_delay_the_first_token_is_written_alone_and_the_rest_in_batches(
    prompt_tokenizer: Any,
) -> None:
    app = build_sim_app(SimulatedEngine(prompt_tokenizer))
    body = {
        "input_ids": prompt_ids("Write a long story"),
        "sampling_params": {"max_new_tokens": 40, "ignore_eos": True},
        "stream": True,
    }
    writes = generate(app, orjson.dumps(body))
    assert [len(events(w)) for w in writes[:2]] == [1, ZERO_DELAY_BATCH]
    assert sum(len(e["output_ids"]) for w in writes for e in events(w)) == 40


def test_follow_ups_read_through_the_prompt_memo_answer_as_read_whole(prompt_tokenizer: Any) -> None:
    """Compact bodies (the frontend's) take the memo's path; spaced ones (json.dumps) the full parse:
    the same conversation's follow-ups get the same answers, prompt and cached token counts."""
    history = prompt_ids("Summarise the notes. " + "The frontend streams tokens. " * 300)
    answers: dict[str, list[Any]] = {}
    for style in ("compact", "spaced"):
        app = build_sim_app(SimulatedEngine(prompt_tokenizer))
        answers[style] = []
        for turn in range(4):
            ids = history + prompt_ids(f"Follow-up {turn}?")[1:]  # the same head, a new last turn
            body = {"rid": f"r{turn}", "input_ids": ids, "sampling_params": {"max_new_tokens": 8}}
            raw = orjson.dumps(body) if style == "compact" else json.dumps(body).encode()
            (write,) = generate(app, raw)
            answer = json.loads(write)
            answers[style].append((answer["output_ids"], answer["meta_info"]))
        stats = json.loads(b"".join(generate(app, b"", "/sim/stats", "GET")))
        # compact: the first read whole, the next three past the history; spaced: never the memo's
        expected = (3, 1) if style == "compact" else (0, 0)
        assert (stats["prompts_reused"], stats["prompts_read_whole"]) == expected
    assert answers["compact"] == answers["spaced"]
    assert answers["compact"][-1][1]["cached_tokens"] > len(history) // 2  # the history was cached
