"""``background: true``: queued at once, polled to its end, cancelled with the engine request aborted."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.servers import Server

from .conftest import API_KEY, MODEL, sdk, start_stored

#: seconds a polled status may take to change (a bound, not an expectation)
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def slow_server() -> Iterator[Server]:
    """20 ms per simulated token: a long answer is still running when the test looks."""
    with start_stored("--sim-itl-ms", "20") as server:
        yield server


def _wait_for(client: openai.OpenAI, response_id: str, statuses: set[str]) -> openai.types.responses.Response:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        response = client.responses.retrieve(response_id)
        if response.status in statuses or time.monotonic() > deadline:
            return response
        time.sleep(0.02)


def _engine_in_flight(server: Server) -> int:
    health = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    return sum(worker["in_flight"] for worker in health["workers"])


def test_a_background_response_is_queued_then_completed(client: openai.OpenAI) -> None:
    queued = client.responses.create(model=MODEL, input="Say hello", background=True)
    assert queued.background is True and queued.status in ("queued", "in_progress") and queued.output == []
    done = _wait_for(client, queued.id, {"completed", "incomplete", "failed", "cancelled"})
    assert done.status == "completed" and done.output_text and done.usage is not None
    assert done.id == queued.id and done.created_at == queued.created_at
    assert [item.type for item in client.responses.input_items.list(done.id).data] == ["message"]
    follow_up = client.responses.create(model=MODEL, previous_response_id=done.id, input="Again")
    assert follow_up.status == "completed"


def test_cancel_stops_the_engine_request(slow_server: Server) -> None:
    client = sdk(slow_server)
    queued = client.responses.create(
        model=MODEL, input="Write 300 words about the sea", background=True, max_output_tokens=3000
    )
    running = _wait_for(client, queued.id, {"in_progress", "completed", "failed"})
    assert running.status == "in_progress"
    assert _engine_in_flight(slow_server) == 1
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert _engine_in_flight(slow_server) == 0  # the engine request was aborted, not left running
    assert client.responses.retrieve(queued.id).status == "cancelled"
    assert client.responses.cancel(queued.id).status == "cancelled"  # cancelling again: as it is


def test_only_background_responses_can_be_cancelled(client: openai.OpenAI) -> None:
    response = client.responses.create(model=MODEL, input="Say hello")
    with pytest.raises(openai.BadRequestError):
        client.responses.cancel(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_" + "0" * 48)


def test_background_needs_store(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", background=True, store=False)
    assert err.value.body is not None and err.value.body["param"] == "background"  # type: ignore[index]
