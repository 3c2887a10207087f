"""The load generators' streaming client: one request over raw HTTP/1.1 on its own connection.

An :class:`asyncio.Protocol` with no HTTP or SSE parsing, so the client stays cheap next to the
server it measures: it stamps when the first chunk arrives and keeps only the tail of the body,
where the last ``completion_tokens`` and ``[DONE]`` are.
"""

from __future__ import annotations

import asyncio
import re
import time

__all__ = ["KeepAliveStream", "StreamClient"]

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":(\d+)')


class StreamClient(asyncio.Protocol):
    """Sends ``request`` once connected; ``done`` resolves to (completion tokens, seconds from the
    connection to the first chunk) when the server closes the connection after ``[DONE]``.

    ``first_marker``: the bytes that begin the first chunk (``b"data:"`` skips the response
    headers of an SSE stream; ``b""`` stamps the first bytes received). ``tail_bytes``: how much
    of the body's end is kept. ``tokens_required``: a stream that reports no ``completion_tokens``
    is an error; otherwise it counts 0 tokens (a stream asked for no usage).
    """

    def __init__(
        self,
        request: bytes,
        done: asyncio.Future[tuple[int, float]],
        *,
        first_marker: bytes = b"data:",
        tail_bytes: int = 4096,
        tokens_required: bool = False,
    ) -> None:
        self.request = request
        self.done = done
        self.first_marker = first_marker
        self.tail_bytes = tail_bytes
        self.tokens_required = tokens_required
        self.tail = b""
        self.started = 0.0
        self.first = 0.0
        #: the usage chunk's ``prompt_tokens`` once the stream has ended (0 without one)
        self.prompt_tokens = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.started = time.perf_counter()
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        # the marker may straddle two reads, hence the look at tail + data
        if not self.first and (self.first_marker in data or self.first_marker in self.tail + data):
            self.first = time.perf_counter() - self.started
        self.tail = (self.tail + data)[-self.tail_bytes :]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done.done():
            return
        matches = _COMPLETION_TOKENS.findall(self.tail)
        prompt = _PROMPT_TOKENS.findall(self.tail)
        self.prompt_tokens = int(prompt[-1]) if prompt else 0
        if b"[DONE]" not in self.tail or (self.tokens_required and not matches):
            self.done.set_exception(RuntimeError(f"stream did not complete: {self.tail[-300:]!r}"))
        else:
            self.done.set_result((int(matches[-1]) if matches else 0, self.first))


class KeepAliveStream(asyncio.Protocol):
    """One agent's HTTP/1.1 keep-alive connection: one streamed request at a time, done at the
    chunked body's last chunk. Like ``StreamClient``, no HTTP or SSE parsing beyond the tail."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[tuple[float, bytes]] | None = None
        self.head = b""
        self.tail = b""
        self.started = 0.0
        self.first = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    async def send(self, request: bytes) -> tuple[float, bytes]:
        """(seconds from writing ``request`` to the first SSE bytes, the response's tail)."""
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.head = self.tail = b""
        self.first = 0.0
        self.started = time.perf_counter()
        self.transport.write(request)
        return await self.done

    def data_received(self, data: bytes) -> None:
        if self.done is None or self.done.done():
            return
        if len(self.head) < 12:
            self.head += data[:12]
            if len(self.head) >= 12 and not self.head.startswith(b"HTTP/1.1 200"):
                self.done.set_exception(RuntimeError(f"not a 200: {(self.head + data)[:600]!r}"))
                return
        if not self.first and b"data:" in self.tail[-8:] + data:
            self.first = time.perf_counter() - self.started
        self.tail = (self.tail + data)[-4096:]
        if self.tail.endswith(b"\r\n0\r\n\r\n") and b"[DONE]" in self.tail:
            self.done.set_result((self.first, self.tail))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(RuntimeError(f"connection lost mid-stream: {self.tail[-300:]!r}"))
