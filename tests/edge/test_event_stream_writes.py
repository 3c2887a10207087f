"""An event stream as ``serve`` writes it: body parts straight into uvicorn's transport as HTTP/1.1
chunks, the last events together with the end of the body.

Over raw sockets, so the chunked framing itself is checked: every event arrives whole and in order
(role, text, finish, usage, ``[DONE]``), the body ends with its terminating chunk, the keep-alive
connection serves the next request, and a client that stops reading holds the stream back (the
transport's flow control) without losing or reordering anything.
"""

from __future__ import annotations

import fcntl
import json
import socket
import struct
import termios
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tests.support.servers import Server, start_frontend
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def frontend() -> Iterator[Server]:
    server = start_frontend("--engine", "sim", "--state-store", "none")
    try:
        yield server
    finally:
        server.stop()


def _request(server: Server, max_tokens: int) -> bytes:
    host = urlsplit(server.url).netloc
    body = json.dumps(
        {
            "model": "deepseek-v4-flash",
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "thinking": {"type": "disabled"},
        }
    ).encode()
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class _ChunkedReader:
    """Reads one chunked HTTP/1.1 response at a time from a keep-alive socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self, deadline: float) -> None:
        self.sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = self.sock.recv(65536)
        if not data:
            raise AssertionError("the server closed the connection mid-response")
        self.buffer += data

    def _line(self, deadline: float) -> bytes:
        while b"\r\n" not in self.buffer:
            self._fill(deadline)
        line, _, self.buffer = self.buffer.partition(b"\r\n")
        return line

    def response(self, timeout: float = 60.0) -> tuple[bytes, list[bytes]]:
        """(the head, every chunk's data in order) of the next response."""
        deadline = time.monotonic() + timeout
        while b"\r\n\r\n" not in self.buffer:
            self._fill(deadline)
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert b"transfer-encoding: chunked" in head.lower(), head
        chunks = []
        while True:
            size = int(self._line(deadline), 16)
            while len(self.buffer) < size + 2:
                self._fill(deadline)
            data, self.buffer = self.buffer[:size], self.buffer[size:]
            assert self.buffer.startswith(b"\r\n"), "a chunk is not followed by CRLF"
            self.buffer = self.buffer[2:]
            if size == 0:
                return head, chunks
            chunks.append(data)


def _events(chunks: list[bytes]) -> list[str]:
    body = b"".join(chunks).decode()
    assert body.endswith("\n\n")
    events = body[:-2].split("\n\n")
    assert all(event.startswith("data: ") for event in events), events
    return [event[len("data: ") :] for event in events]


def _check_stream(events: list[str], max_tokens: int) -> None:
    assert events[-1] == "[DONE]"
    payloads = [json.loads(event) for event in events[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert payloads[-1]["usage"]["completion_tokens"] == max_tokens
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    text = [p["choices"][0]["delta"].get("content") for p in payloads[1:-2]]
    assert all(isinstance(piece, str) for piece in text) and "".join(text)


def test_a_stream_is_whole_chunked_events_and_the_connection_serves_the_next(frontend: Server) -> None:
    parts = urlsplit(frontend.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        reader = _ChunkedReader(sock)
        for max_tokens in (40, 7):  # two requests on one keep-alive connection
            sock.sendall(_request(frontend, max_tokens))
            head, chunks = reader.response()
            assert head.startswith(b"HTTP/1.1 200")
            _check_stream(_events(chunks), max_tokens)
            # the last events and the end of the body came together, after the text
            assert chunks[-1].endswith(b"data: [DONE]\n\n") and b'"usage"' in chunks[-1]


def test_a_client_that_stops_reading_holds_the_stream_back_and_loses_nothing(frontend: Server) -> None:
    """Megabytes of events to a client that reads nothing for a while: the server's writes wait for
    it (past the transport's high-water mark) and then go on, in order, to the end."""
    max_tokens = 40_000  # several MB of events: far more than the socket buffers hold
    parts = urlsplit(frontend.url)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
        sock.settimeout(30)
        sock.connect((parts.hostname, parts.port))
        sock.sendall(_request(frontend, max_tokens))
        # not reading until the client's own buffer is full: the server is then held back
        wait_until(lambda: _unread(sock) >= 2048, "the server wrote nothing", timeout=30)
        _, chunks = _ChunkedReader(sock).response()
    _check_stream(_events(chunks), max_tokens)


def _unread(sock: socket.socket) -> int:
    """Bytes received on ``sock`` that the client has not read yet."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
