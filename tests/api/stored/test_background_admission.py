"""Background responses count in the model's admission (``--max-concurrent-requests``): each
holds its request's slot while it generates, shows in the admission gauge, and a request past the
limit waits for a slot to free. A real ``serve`` with a limit of 2, driven by the openai SDK."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.support.servers import Server

from .conftest import API_KEY, MODEL, sdk, start_stored

DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def limited() -> Iterator[Server]:
    with start_stored(
        "--sim-itl-ms", "20", "--max-concurrent-requests", "2", "--queue-timeout", "60"
    ) as server:
        yield server


def _gauge(server: Server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {API_KEY}"}).text
    values = [
        float(m.group(1))
        for m in re.finditer(rf"^deepseek_frontend_admission_{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    ]
    assert values, f"no admission_{name} gauge"
    return sum(values)


def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _long(client: openai.OpenAI) -> str:
    return client.responses.create(
        model=MODEL, input="Write 300 words about the sea", background=True, max_output_tokens=3000
    ).id


def test_background_responses_hold_admission_slots_while_they_generate(limited: Server) -> None:
    client = sdk(limited)
    running = [_long(client), _long(client)]
    _until(
        lambda: all(client.responses.retrieve(r).status == "in_progress" for r in running), "both generate"
    )
    assert _gauge(limited, "active") == 2  # the requests were answered; their generations hold the slots

    third: list[str] = []
    waiter = threading.Thread(target=lambda: third.append(_long(client)))
    waiter.start()
    _until(lambda: _gauge(limited, "queued") == 1, "the third request waits for a slot")
    assert waiter.is_alive() and not third  # not refused, not run past the limit: waiting
    client.responses.cancel(running[0])  # a slot frees
    waiter.join(DEADLINE_S)
    assert third and client.responses.retrieve(third[0]).status in ("queued", "in_progress")
    assert _gauge(limited, "active") == 2
    for response_id in (running[1], third[0]):
        client.responses.cancel(response_id)
    _until(lambda: _gauge(limited, "active") == 0, "every slot given back")
    assert _gauge(limited, "rejected_total") == 0
