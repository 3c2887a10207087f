"""End to end: no engine rid the frontend sends is a prefix of another live one on the worker.

SGLang aborts every live request whose rid *starts with* the aborted one (``/abort_request``, and a
client closing an unfinished stream; ``managers/scheduler.py``), and the ``sim-engine`` worker does
the same. With ``n`` choices each choice runs as its own engine request; when one choice meets a stop
string the frontend closes its stream, which aborts it on the worker -- and, were choice 1's rid a
prefix of choice 10's, choices 10 to 15 with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from tests.support.servers import Server, start_frontend, start_sim_engine

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Write 300 words about lighthouses."}]


@pytest.fixture(scope="module")
def frontend() -> Iterator[tuple[Server, Server]]:
    # 10 ms a token: every choice is still decoding when the first one meets its stop string
    with (
        start_sim_engine("--itl-ms", "10") as worker,
        start_frontend("--worker", worker.url, "--health-check-interval", "300") as server,
    ):
        yield server, worker


def choices(server: Server, **extra: object) -> list[dict[str, object]]:
    body = {
        "model": "deepseek-v4-flash",
        "messages": MESSAGES,
        "n": 16,
        "seed": 7,
        "max_tokens": 80,
        "chat_template_kwargs": {"thinking": False},
        **extra,
    }
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return sorted(response.json()["choices"], key=lambda c: c["index"])  # type: ignore[no-any-return]


def test_sixteen_choices_with_a_stop_string_each_end_as_they_would_alone(
    frontend: tuple[Server, Server],
) -> None:
    server, worker = frontend
    plain = choices(server)
    texts = [str(c["message"]["content"]) for c in plain]  # type: ignore[index]
    # the simulated model writes a word cycle, each choice (its own seed) starting elsewhere in it:
    # choice 1 meets the stop string at once, choices 10-15 only after several words
    stop = re.findall(r"[a-z]{4,}", texts[1])[0]
    assert all(texts[i].index(stop) > 0 for i in range(10, 16))
    stopped = choices(server, stop=[stop])
    for i in (1, *range(10, 16)):
        content = stopped[i]["message"]["content"]  # type: ignore[index]
        assert (content, stopped[i]["finish_reason"]) == (texts[i][: texts[i].index(stop)], "stop"), i
    # each choice's stream was closed at its stop, which the worker took as that choice's abort
    aborted = httpx.get(worker.url + "/sim/stats", timeout=10).json()["aborted_ids"]
    assert any(re.search(r"\.c1~$", rid) for rid in aborted), aborted
