"""A body read in pieces (``edge/body_stream.py``): pieces handed on as they arrive, 413 on the
declared length before anything is read or as soon as the pieces pass the limit, 408 when the
pieces stop coming, and the client's body-reader slot given back whatever happens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest
from starlette.requests import Request

from deepseek_frontend.edge.body_readers import BodyReaders
from deepseek_frontend.edge.body_stream import stream_body
from deepseek_frontend.errors import PayloadTooLargeError, RequestError, RequestTimeoutError


def _request(
    messages: Iterable[dict[str, Any]], headers: tuple[tuple[bytes, bytes], ...] = ()
) -> tuple[Request, list[int]]:
    pending = list(messages)
    reads: list[int] = []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        if not pending:
            await asyncio.sleep(3600)
        return pending.pop(0)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/files",
        "headers": list(headers),
        "client": ("10.0.0.1", 5),
    }
    return Request(scope, receive), reads


def _pieces(*parts: bytes) -> list[dict[str, Any]]:
    return [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]


async def _read(
    request: Request, readers: BodyReaders, max_bytes: int = 10, idle: float = 5.0
) -> list[bytes]:
    return [
        piece
        async for piece in stream_body(request, max_bytes=max_bytes, idle_timeout_s=idle, readers=readers)
    ]


def test_pieces_are_handed_on_and_the_slot_given_back() -> None:
    readers = BodyReaders()
    request, _ = _request(_pieces(b"abc", b"", b"defg"))
    assert asyncio.run(_read(request, readers)) == [b"abc", b"defg"]
    assert readers.active == 0 and readers.clients() == 0


def test_a_declared_length_over_the_limit_is_413_before_any_read() -> None:
    readers = BodyReaders()
    request, reads = _request(_pieces(b"x"), ((b"content-length", b"2147483648"),))
    with pytest.raises(PayloadTooLargeError, match="2147483648 bytes"):
        asyncio.run(_read(request, readers))
    assert reads == [] and readers.active == 0


def test_pieces_past_the_limit_are_413_at_once() -> None:
    readers = BodyReaders()
    request, reads = _request(_pieces(b"123456", b"789012", b"never read"))
    with pytest.raises(PayloadTooLargeError, match="exceeds the limit of 10 bytes"):
        asyncio.run(_read(request, readers))
    assert len(reads) == 2 and readers.active == 0


def test_a_stalled_body_is_408_and_a_client_gone_is_its_error() -> None:
    readers = BodyReaders()
    stalled, _ = _request([{"type": "http.request", "body": b"12", "more_body": True}])
    with pytest.raises(RequestTimeoutError, match="2 bytes received"):
        asyncio.run(_read(stalled, readers, idle=0.05))
    gone, _ = _request([{"type": "http.disconnect"}])
    with pytest.raises(RequestError, match="disconnected"):
        asyncio.run(_read(gone, readers))
    assert readers.active == 0 and readers.clients() == 0
