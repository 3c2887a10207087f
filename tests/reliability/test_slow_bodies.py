"""Slow request bodies cost their sender, not the other clients (api/admission.py ``BodyReaders``).

A real ``serve`` with few request slots; raw sockets from other loopback addresses send
``POST /v1/chat/completions`` heads announcing 100,000 bytes and then trickle a byte a second. A
request holds no admission slot while its body arrives, so a legitimate client (another address)
is still answered 200 -- small and large bodies alike -- and the trickling addresses are refused
past their own reader limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from deepseek_frontend.edge.body_readers import BodyReaders
from tests.support.servers import Server, start_frontend
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

SLOTS = 16
PER_CLIENT = 8


@pytest.fixture(scope="module")
def frontend() -> Iterator[Server]:
    server = start_frontend(
        "--max-concurrent-requests", str(SLOTS), "--max-queued-requests", "8", "--queue-timeout", "2",
        "--max-body-readers-per-client", str(PER_CLIENT), "--body-timeout", "120",
        "--header-timeout", "120",
    )  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def _slow_body(url: str, source: str) -> socket.socket:
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=30, source_address=(source, 0))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100000\r\n\r\n{"
    )
    return sock


def _chat(url: str, text: str) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=60)


def _answer(data: bytes) -> tuple[bytes, dict] | None:
    """(status line, JSON body) of a whole response in ``data``, or None while it is incomplete."""
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head.lower())
    if not length or len(body) < int(length.group(1)):
        return None
    return head.split(b"\r\n", 1)[0], json.loads(body)


def test_slow_bodies_hold_no_request_slot_and_cost_their_own_address(frontend: Server) -> None:
    # three attacking addresses, each with many more slow bodies than the server has request slots
    attackers = [_slow_body(frontend.url, f"127.0.0.{2 + i % 3}") for i in range(3 * 4 * SLOTS)]
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(1.0):
            for sock in attackers:
                with contextlib.suppress(OSError):  # refused and closed by the server
                    sock.send(b" ")

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        received = {id(sock): b"" for sock in attackers}
        refused: list[dict] = []

        def past_their_limit_refused() -> bool:
            refused.clear()
            for sock in attackers:
                sock.settimeout(0.01)
                with contextlib.suppress(TimeoutError, OSError):
                    received[id(sock)] += sock.recv(65536)
                answer = _answer(received[id(sock)])
                if answer is not None:
                    assert answer[0].startswith(b"HTTP/1.1 429"), answer
                    refused.append(answer[1])
            # per address: PER_CLIENT read, PER_CLIENT waiting (refused after 2 s), the rest refused
            return len(refused) >= 3 * (4 * SLOTS - PER_CLIENT)

        wait_until(past_their_limit_refused, "the bodies past each address' limit are refused", timeout=60)
        assert all("client address" in r["error"]["message"] for r in refused), refused[:2]
        # meanwhile every legitimate request is served, small body or large
        for i in range(3 * SLOTS):
            response = _chat(frontend.url, f"hello {i}")
            assert response.status_code == 200, response.text
        # 360 KB: read in several parts, so it takes a reader slot of its own
        large = _chat(frontend.url, "words " * 60_000)
        assert large.status_code == 200, large.text
    finally:
        stop.set()
        trickler.join(5)
        for sock in attackers:
            sock.close()


def test_body_readers_bound_each_address_then_all_and_forget_idle_addresses() -> None:
    async def scenario() -> None:
        readers = BodyReaders(max_total=3, max_per_client=2, queue_timeout_s=0.05)
        assert await readers.enter("a") is None
        assert await readers.enter("a") is None
        # the third body of "a" waits in a's queue, then is refused: "b" is not affected
        refusal = await readers.enter("a")
        assert refusal is not None and refusal.status_code == 429 and "client address" in refusal.message
        assert await readers.enter("b") is None
        assert readers.active == 3
        # all three slots taken: "c" waits for one and gets it when "a" finishes a body
        waiting = asyncio.ensure_future(readers.enter("c"))
        await asyncio.sleep(0)
        readers.leave("a")
        assert await waiting is None
        for client in ("a", "b", "c"):
            readers.leave(client)
        assert readers.active == 0 and readers.clients() == 0
        assert readers.rejected == 1

    asyncio.run(scenario())
