"""The load generators' streaming client: one request over raw HTTP/1.1 on its own connection.

An :class:`asyncio.Protocol` with no HTTP or SSE parsing, so the client stays cheap next to the
server it measures: it stamps when the first chunk arrives and keeps only the tail of the body,
where the last ``completion_tokens`` and ``[DONE]`` are.
"""

from __future__ import annotations

import asyncio
import re
import time

__all__ = ["StreamClient"]

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')


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
        if b"[DONE]" not in self.tail or (self.tokens_required and not matches):
            self.done.set_exception(RuntimeError(f"stream did not complete: {self.tail[-300:]!r}"))
        else:
            self.done.set_result((int(matches[-1]) if matches else 0, self.first))
