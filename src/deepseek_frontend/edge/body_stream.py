"""A request body read in pieces, for routes whose bodies are too large to hold (file uploads).

Most routes get their whole body before admission (``edge/body.receive_body``). An upload of
hundreds of megabytes must not be held whole: :func:`stream_body` hands its pieces to the handler
as they arrive -- each as large as the HTTP server buffers (uvicorn pauses reading past 64 KiB), so
memory stays bounded whatever the body's size -- and enforces the same limits on the way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.requests import Request

from deepseek_frontend.errors import PayloadTooLargeError, RequestError, RequestTimeoutError
from deepseek_frontend.pipeline.offload import CURRENT_TURN, release_current_turn

if TYPE_CHECKING:
    from .body_readers import BodyReaders

__all__ = ["check_declared_length", "stream_body"]


def check_declared_length(request: Request, max_bytes: int) -> None:
    """A 413 at once when the body's declared ``Content-Length`` is over ``max_bytes`` (nothing of
    it has been read: the client learns before it sends gigabytes)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(f"request body is {declared} bytes; the limit is {max_bytes}")


async def stream_body(
    request: Request, *, max_bytes: int, idle_timeout_s: float, readers: BodyReaders | None
) -> AsyncIterator[bytes]:
    """``request``'s body, piece by piece, as it arrives.

    Raises ``PayloadTooLargeError`` (413) past ``max_bytes`` -- on the declared length before
    anything is read, else as soon as the pieces pass it --, ``RequestTimeoutError`` (408) when no
    piece arrives for ``idle_timeout_s`` seconds (0: no deadline; a deadline on the whole body
    would cut off a large upload on a slow link, a deadline between pieces only a stalled one),
    ``RequestError`` when the client goes away, and ``OverloadedError`` (429) past the body-reader
    limits: the body holds a reader slot of its client address while it arrives, as slow bodies do.
    """
    check_declared_length(request, max_bytes)
    client = request.client.host if request.client is not None else ""
    # the body may take minutes: nobody waits for this request's loop turn meanwhile
    release_current_turn()
    CURRENT_TURN.set(None)
    if readers is not None:
        refusal = await readers.enter(client)
        if refusal is not None:
            raise refusal
    size = 0
    try:
        while True:
            try:
                async with asyncio.timeout(idle_timeout_s or None):
                    message = await request.receive()
            except TimeoutError:
                raise RequestTimeoutError(
                    f"no part of the request body arrived for {idle_timeout_s:g} s ({size} bytes received)"
                ) from None
            if message["type"] == "http.disconnect":
                raise RequestError("client disconnected while sending the body")
            part = message.get("body", b"")
            size += len(part)
            if size > max_bytes:
                raise PayloadTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
            if part:
                yield part
            if not message.get("more_body", False):
                return
    finally:
        if readers is not None:
            readers.leave(client)
