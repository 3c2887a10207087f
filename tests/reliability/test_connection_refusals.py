"""Past ``--max-connections``: every refusal is an HTTP answer, and the probes stay answerable.

Real sockets against a real ``serve``: idle connections take every slot, then new clients must read
a whole ``503`` with ``Retry-After`` (not a TCP reset that destroys it), while ``GET /live`` and
``GET /health`` are answered -- from the reserved slots of the public port, and always on the
``--probe-port`` listener, whatever the flood on the public port.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import resource
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.servers import Server, start_frontend
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(180)

MAX_CONNECTIONS = 50


@pytest.fixture(scope="module")
def frontend() -> Iterator[Server]:
    # a long header deadline: the idle connections below keep their slots for the whole test
    server = start_frontend(
        "--max-connections", str(MAX_CONNECTIONS), "--header-timeout", "120", "--probe-port", "0"
    )  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _probe_url(server: Server) -> str:
    match = re.search(r"probes on (http://[0-9.]+:\d+)", server.log())
    assert match, server.log()
    return match.group(1)


def _exchange(url: str, path: str) -> bytes:
    """Connect, send ``GET path`` at once, read until the server closes. Raises what the socket raises."""
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def _body(answer: bytes) -> dict:
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


def _hold(url: str, count: int) -> list[socket.socket]:
    return [socket.create_connection(_address(url)) for _ in range(count)]


@pytest.fixture(autouse=True)
def _room_for_sockets() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard or (soft < hard and hard == resource.RLIM_INFINITY):
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))


def test_connections_past_the_limit_read_a_503_with_retry_after_never_a_reset(frontend: Server) -> None:
    held = _hold(frontend.url, MAX_CONNECTIONS + 10)  # every slot, and 10 more waiting past the limit
    try:
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            outcomes = list(pool.map(lambda _: _try(frontend.url, "/v1/models"), range(40)))
        errors = [o for o in outcomes if isinstance(o, Exception)]
        assert not errors, f"{len(errors)} of 40 requests failed: {errors[:3]}"
        for answer in outcomes:
            assert isinstance(answer, bytes)
            assert _status(answer) == 503, answer[:300]
            head = answer.split(b"\r\n\r\n", 1)[0].lower()
            assert b"retry-after: 1" in head and b"connection: close" in head
            assert _body(answer)["error"]["type"] == "service_unavailable"
        # the idle ones past the limit get theirs too, once their moment to send a request is over
        for sock in held[MAX_CONNECTIONS:]:
            sock.settimeout(30)
            assert sock.recv(65536).startswith(b"HTTP/1.1 503")
    finally:
        for sock in held:
            sock.close()
    wait_until(
        lambda: _status(_exchange(frontend.url, "/v1/models")) == 200, "the server serves again", timeout=30
    )


def _try(url: str, path: str) -> bytes | Exception:
    try:
        return _exchange(url, path)
    except OSError as exc:  # ConnectionResetError among them: what the refusal must never be
        return exc


def test_probes_are_answered_while_a_flood_holds_every_connection(frontend: Server) -> None:
    probe = _probe_url(frontend)
    held = _hold(frontend.url, MAX_CONNECTIONS)
    try:
        # the public port's reserved slots answer the probes, not other requests
        for path in ("/live", "/health"):
            assert _status(_exchange(frontend.url, path)) == 200
        assert _status(_exchange(frontend.url, "/v1/models")) == 503
        # a flood: far more idle connections than the slots past the limit
        held += _hold(frontend.url, 1000)
        for _ in range(20):
            for path in ("/live", "/health"):
                answer = _exchange(probe, path)
                assert _status(answer) == 200, answer[:300]
        assert _body(_exchange(probe, "/health"))["status"] == "ok"
        assert "deepseek_frontend" in _exchange(probe, "/metrics").decode()
        # the probe port serves nothing else
        assert _status(_exchange(probe, "/v1/models")) == 404
        # and once the flood's idle connections have had their moment, the public port answers probes again
        wait_until(
            lambda: _status(_exchange(frontend.url, "/live")) == 200,
            "/live on the public port is answered during the flood",
            timeout=30,
        )
    finally:
        for sock in held:
            sock.close()
    assert httpx.get(frontend.url + "/v1/models", timeout=30).status_code == 200
