"""A client that leaves mid-stream aborts the engine request (both /v1/messages and /v1/responses).

Crosses the real process boundary: a slow ``sim-engine`` (SGLang protocol) behind
the frontend; the sim counts aborts at ``/sim/stats``. Both protocols are checked
here so one pair of processes serves both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.servers import Server, start_frontend, start_sim_engine
from tests.support.waiting import wait_until

KEY = "disconnect-key"


@pytest.fixture(scope="module")
def slow_stack() -> Iterator[tuple[Server, Server]]:
    engine = start_sim_engine("--itl-ms", "20")
    try:
        frontend = start_frontend(
            "--engine", "sglang", "--worker", engine.url, "--api-key", KEY, "--model-alias", "claude-*"
        )
    except Exception:
        engine.stop()
        raise
    yield engine, frontend
    frontend.stop()
    engine.stop()


def aborted(engine: Server) -> int:
    return int(httpx.get(engine.url + "/sim/stats", timeout=5).json()["aborted"])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {
                "model": "claude-x",
                "max_tokens": 2000,
                "stream": True,
                "messages": [{"role": "user", "content": "write 500 words"}],
            },
        ),
        ("/v1/responses", {"model": "claude-x", "stream": True, "input": "write 500 words"}),
    ],
)
def test_leaving_mid_stream_aborts_the_engine_request(
    slow_stack: tuple[Any, Any], path: str, body: dict[str, Any]
) -> None:
    engine, frontend = slow_stack
    before = aborted(engine)
    headers = {"x-api-key": KEY}
    with httpx.stream("POST", frontend.url + path, json=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        for received, _ in enumerate(response.iter_raw(), start=1):
            if received >= 3:
                break  # leave while the engine is still generating
    wait_until(lambda: aborted(engine) > before, "the engine request was aborted after the client left")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/messages",
            {
                "model": "claude-x",
                "max_tokens": 2000,
                "messages": [{"role": "user", "content": "write 500 words"}],
            },
        ),
        ("/v1/responses", {"model": "claude-x", "input": "write 500 words"}),
    ],
)
def test_leaving_while_a_non_streamed_answer_is_generated_aborts_the_engine_request(
    slow_stack: tuple[Any, Any], path: str, body: dict[str, Any]
) -> None:
    engine, frontend = slow_stack
    before = aborted(engine)
    # 500 words at 20 ms per token take seconds; the client gives up after 0.5 s.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            frontend.url + path, json=body, headers={"x-api-key": KEY}, timeout=httpx.Timeout(5, read=0.5)
        )
    wait_until(lambda: aborted(engine) > before, "the engine request was aborted after the client left")
