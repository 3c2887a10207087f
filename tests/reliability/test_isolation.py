"""One huge prompt never stalls the server for anyone else.

A 20 MB prompt (under the 32 MiB body limit, under the 1M-token context by the cheap length bound,
so it really is rendered and tokenized: tens of seconds on this machine) is sent; while the
server prepares it -- on its offload threads, as ``deepseek_frontend_offload_pending`` shows --
``/live`` and small chat requests keep answering in under 100 ms.

And a prompt that the cheap bound already proves too long is refused at once, before any
tokenization, without filling the prompt caches.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from tests.reliability.conftest import frontend_for
from tests.support.metrics import samples
from tests.support.servers import Server
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

BOUND_S = 0.1
WORST_S = 1.5
PROBES = 20


@pytest.fixture(scope="module")
def frontend(fake_worker: Server) -> Iterator[Server]:
    server = frontend_for(fake_worker, "--context-length", "1048576")
    try:
        yield server
    finally:
        server.stop()


def metric(url: str, name: str) -> float:
    family, _, labels = name.partition("{")
    found = samples(httpx.get(url + "/metrics", timeout=10).text, family)
    key = "{" + labels if labels else ""
    assert key in found, name
    return found[key]


def send_and_abandon(url: str, body: bytes, sent: threading.Event, stop: threading.Event) -> None:
    """POST ``body`` on a raw socket and keep the connection open until ``stop`` (never read)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=120) as sock:
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode()
        sock.sendall(head + body)
        sent.set()
        stop.wait(120)


def test_live_and_small_requests_answer_fast_while_a_20_mb_prompt_is_prepared(
    frontend: Server, healthy_worker: Server
) -> None:
    # Words of varied shape, so the tokenizer has real work (no long runs of one repeated piece).
    text = " ".join(f"word{i % 9973} {i * 7919 % 104729}" for i in range(1_500_000))[: 20 * 1024 * 1024]
    body = orjson.dumps({"messages": [{"role": "user", "content": text}], "max_tokens": 4})
    assert 19 * 1024 * 1024 < len(body) < 32 * 1024 * 1024

    sent, stop = threading.Event(), threading.Event()
    sender = threading.Thread(target=send_and_abandon, args=(frontend.url, body, sent, stop), daemon=True)
    sender.start()
    try:
        assert sent.wait(60), "the 20 MB body could not be sent"
        wait_until(
            lambda: metric(frontend.url, "deepseek_frontend_offload_pending") >= 1,
            "the huge prompt is being prepared off the event loop",
            timeout=60,
        )
        small = {"messages": [{"role": "user", "content": "a small request"}], "max_tokens": 4}
        live_times: list[float] = []
        chat_times: list[float] = []
        with httpx.Client(base_url=frontend.url, timeout=10) as client:
            for _ in range(PROBES):
                started = time.perf_counter()
                assert client.get("/live").status_code == 200
                live_times.append(time.perf_counter() - started)
                started = time.perf_counter()
                assert client.post("/v1/chat/completions", json=small).status_code == 200
                chat_times.append(time.perf_counter() - started)
        # the huge prompt was still being prepared the whole time
        assert metric(frontend.url, "deepseek_frontend_offload_pending") >= 1
        live_times.sort()
        chat_times.sort()
        # The median must hold the 100 ms target; the slowest probe may meet the OS scheduler of a
        # shared, overloaded 2-core machine (see test_burst.py), so it only has to stay under
        # WORST_S -- the failure this guards against stalled the server for a minute.
        assert live_times[PROBES // 2] < BOUND_S and live_times[-1] < WORST_S, live_times
        assert chat_times[PROBES // 2] < BOUND_S and chat_times[-1] < WORST_S, chat_times
    finally:
        stop.set()
        sender.join(10)


def test_a_prompt_provably_over_the_context_is_refused_before_tokenization(
    fake_worker: Server, healthy_worker: Server
) -> None:
    # 10,000-token context: 2 MB of text is at least 2,000,000 / 128 = 15,625 tokens
    server = frontend_for(fake_worker, "--context-length", "10000")
    try:
        text = "x" * (2 * 1024 * 1024)
        started = time.perf_counter()
        r = httpx.post(
            server.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": text}]},
            timeout=60,
        )
        elapsed = time.perf_counter() - started
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and "at least" in error["message"]
        # nothing was tokenized, and nothing was cached for it
        assert metric(server.url, "deepseek_frontend_tokenization_seconds_count") == 0
        assert metric(server.url, 'deepseek_frontend_cache_entries{cache="run"}') == 0
        assert elapsed < 5, elapsed
    finally:
        server.stop()
