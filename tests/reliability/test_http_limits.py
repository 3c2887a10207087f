"""The HTTP layer's limits: slow clients are closed, connections are bounded, parser errors are JSON.

One frontend with short read deadlines, a small connection limit and an API key; raw sockets play
the hostile clients (slowloris headers and bodies, connection floods, malformed requests).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.reliability.conftest import frontend_for
from tests.support.servers import Server
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)

KEY = "sk-reliability-key-123"
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 60


@pytest.fixture(scope="module")
def frontend(fake_worker: Server) -> Iterator[Server]:
    server = frontend_for(
        fake_worker,
        "--header-timeout",
        str(HEADER_TIMEOUT_S),
        "--body-timeout",
        str(BODY_TIMEOUT_S),
        "--max-connections",
        str(MAX_CONNECTIONS),
        "--api-key",
        KEY,
    )
    try:
        yield server
    finally:
        server.stop()


def address(server: Server) -> tuple[str, int]:
    parts = urlsplit(server.url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """Everything the server sends until it closes (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def json_body(response: bytes) -> dict:
    return json.loads(response.partition(b"\r\n\r\n")[2])


def open_fds(server: Server) -> int:
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def authorized_chat(server: Server) -> httpx.Response:
    return httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "still serving"}], "max_tokens": 4},
        headers={"authorization": f"Bearer {KEY}"},
        timeout=30,
    )


def test_slowloris_headers_are_closed_with_a_408_and_others_are_served(frontend: Server) -> None:
    baseline = open_fds(frontend)
    socks = [socket.create_connection(address(frontend)) for _ in range(40)]
    stop = threading.Event()
    answers: list[bytes] = [b""] * len(socks)

    def trickle(i: int, sock: socket.socket) -> None:
        # a byte every 0.2 s: the head would never complete on its own
        sock.settimeout(0.2)
        data = b""
        try:
            for byte in b"GET /live HTTP/1.1\r\nhost: slow\r\nx-padding: " + b"x" * 1000:
                if stop.is_set():
                    return
                sock.send(bytes([byte]))
                try:
                    chunk = sock.recv(4096)
                except TimeoutError:
                    continue
                data += chunk
                if not chunk or data.endswith(b"}"):
                    break
        except OSError:  # the server closed the connection: what we are waiting for
            pass
        answers[i] = data + read_all(sock, 2)

    started = time.monotonic()
    threads = [threading.Thread(target=trickle, args=(i, s), daemon=True) for i, s in enumerate(socks)]
    for t in threads:
        t.start()
    try:
        # meanwhile a normal client is served
        assert authorized_chat(frontend).status_code == 200
        for t in threads:
            t.join(HEADER_TIMEOUT_S + 15)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        for s in socks:
            s.close()
    assert elapsed < HEADER_TIMEOUT_S + 15
    for answer in answers:
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert json_body(answer)["error"]["code"] == "request_timeout"
    wait_until(lambda: open_fds(frontend) <= baseline + 2, "the slow connections' descriptors are freed")


def test_a_body_sent_too_slowly_gets_a_408_and_a_closed_connection(frontend: Server) -> None:
    with socket.create_connection(address(frontend)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"authorization: Bearer {KEY}\r\ncontent-length: 1000\r\n\r\n".encode()
            + b'{"messages": '
        )
        started = time.monotonic()
        answer = read_all(sock, BODY_TIMEOUT_S + 10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"connection: close" in answer.lower()
    assert json_body(answer)["error"]["code"] == "request_timeout"
    assert time.monotonic() - started < BODY_TIMEOUT_S + 10


def test_connections_beyond_the_limit_get_a_503_at_once(frontend: Server) -> None:
    held = [socket.create_connection(address(frontend)) for _ in range(MAX_CONNECTIONS)]
    try:
        # every limit slot is taken by an idle connection (the header deadline has not passed yet)
        extra = socket.create_connection(address(frontend))
        answer = read_all(extra, 5)
        extra.close()
        assert answer.startswith(b"HTTP/1.1 503"), answer[:200]
        assert b"retry-after: 1" in answer.lower()
        assert json_body(answer)["error"]["type"] == "service_unavailable"
    finally:
        for sock in held:
            sock.close()
    wait_until(lambda: authorized_chat(frontend).status_code == 200, "the server serves again", timeout=15)


@pytest.mark.parametrize(
    ("request_bytes", "shape"),
    [
        (b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-bad: a\x00b\r\n\r\n", "openai"),
        (b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-bad: a\x00b\r\n\r\n", "anthropic"),
        (b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n", "openai"),
        (b"NOT-HTTP\x01\x02\r\n\r\n", "openai"),
    ],
    ids=["nul-in-header", "nul-in-header-anthropic", "100kb-url", "garbage"],
)
def test_requests_the_http_parser_rejects_get_a_json_400_in_the_apis_shape(
    frontend: Server, request_bytes: bytes, shape: str
) -> None:
    with socket.create_connection(address(frontend)) as sock:
        sock.sendall(request_bytes)
        answer = read_all(sock, 10)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"content-type: application/json" in answer.lower()
    body = json_body(answer)
    if shape == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error"


def test_health_shows_only_up_or_down_without_the_key(frontend: Server, fake_worker: Server) -> None:
    anonymous = httpx.get(frontend.url + "/health", timeout=10)
    assert anonymous.status_code == 200
    assert anonymous.json() == {"status": "ok"}
    assert fake_worker.url not in anonymous.text
    detailed = httpx.get(frontend.url + "/health", headers={"x-api-key": KEY}, timeout=10)
    assert detailed.json()["workers"][0]["url"] == fake_worker.url


def test_auth_failures_are_logged_without_the_key(frontend: Server) -> None:
    wrong = "sk-wrong-key-should-not-be-logged"
    r = httpx.post(
        frontend.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}]},
        headers={"authorization": f"Bearer {wrong}"},
        timeout=10,
    )
    assert r.status_code == 401
    wait_until(lambda: "status=401" in frontend.log(), "the refusal is logged")
    assert wrong not in frontend.log() and KEY not in frontend.log()


def exchange(server: Server, payload: bytes, timeout: float = 10.0) -> bytes:
    """Send ``payload`` on a fresh connection and read until the server closes it."""
    with socket.create_connection(address(server), timeout=timeout) as sock:
        sock.sendall(payload)
        return read_all(sock, timeout)


def test_live_keeps_http_semantics_on_every_kind_of_connection(
    frontend: Server,
) -> None:
    # keep-alive: /live, then a keyed request on the same connection is still served
    live = b"GET /live HTTP/1.1\r\nhost: probe\r\n\r\n"
    models = f"GET /v1/models HTTP/1.1\r\nhost: probe\r\nauthorization: Bearer {KEY}\r\n".encode()
    answer = exchange(frontend, live + models + b"connection: close\r\n\r\n")
    first, _, rest = answer.partition(b"HTTP/1.1 ")[2].partition(b"HTTP/1.1 ")
    head, _, body = first.partition(b"\r\n\r\n")
    assert head.startswith(b"200 OK") and b"connection: close" not in head.lower(), head
    assert b"content-type: application/json" in head.lower() and b"date: " in head.lower()
    assert json.loads(body) == {"status": "ok"}
    assert rest.startswith(b"200") and b'"object":"list"' in rest.replace(b" ", b""), rest[:300]

    # the connection asks to close, and HTTP/1.0: answered, then closed (read_all returns)
    for request in (
        b"GET /live?x=1 HTTP/1.1\r\nhost: p\r\nconnection: close\r\n\r\n",
        b"GET /live HTTP/1.0\r\n\r\n",
    ):
        answer = exchange(frontend, request)
        assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b'{"status":"ok"}'), answer

    # HEAD: the head without the body
    answer = exchange(frontend, b"HEAD /live HTTP/1.1\r\nhost: p\r\nconnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"\r\n\r\n"), answer
    assert b"content-length: 15" in answer.lower()

    # pipelined behind a request still being answered: answered after it, in order
    health = b"GET /health HTTP/1.1\r\nhost: p\r\n\r\n"
    answer = exchange(frontend, health + b"GET /live HTTP/1.1\r\nhost: p\r\nconnection: close\r\n\r\n")
    answers = answer.split(b"HTTP/1.1 200 OK")
    assert len(answers) == 3 and answers[2].endswith(b'{"status":"ok"}'), answer

    # any other method is the application's: 405
    answer = exchange(
        frontend, b"POST /live HTTP/1.1\r\nhost: p\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    assert answer.startswith(b"HTTP/1.1 405"), answer
