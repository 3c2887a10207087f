"""A request's body: read before the request is admitted, then parsed as a JSON object.

* :func:`receive_body` -- reads the whole body before admission (413 past the size limit, 408 past
  the body timeout, a reader slot while it is still arriving).
* :func:`read_json` -- the body as a JSON object (400 for invalid JSON), after the request takes
  its loop turn for the prompt work (urgent for a follow-up of a recent conversation).
* :func:`parse_json_object` -- bytes to a JSON object, with the 400 naming where they came from.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request

from deepseek_frontend.errors import PayloadTooLargeError, RequestError, RequestTimeoutError
from deepseek_frontend.pipeline.offload import CURRENT_TURN, release_current_turn

from .context import get_state
from .turns import WARM_KEY

#: seconds a client may take to send its whole request body (32 MiB at 1 MB/s takes 32 s)
BODY_TIMEOUT_S = 60.0


#: where :func:`receive_body` leaves a body it read (``request.state``)
BODY_ATTR = "received_body"
#: where :func:`~.route.api_route` leaves a body it parsed to find the model it names (``request.state``)
PARSED_ATTR = "parsed_body"


def _body_limits(request: Request, max_bytes: int | None, timeout_s: float | None) -> tuple[int, float]:
    config = get_state(request).config
    if max_bytes is None:
        max_bytes = int(getattr(config, "max_body_bytes", 32 * 1024 * 1024))
    if timeout_s is None:
        timeout_s = getattr(getattr(config, "limits", None), "body_timeout", BODY_TIMEOUT_S)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(f"request body is {declared} bytes; the limit is {max_bytes}")
    return max_bytes, timeout_s or 0.0


async def receive_body(request: Request, max_bytes: int | None = None) -> None:
    """Read ``request``'s whole body before it is admitted; :func:`read_json` then parses it.

    A body that is complete at its first read takes nothing; one still arriving takes a reader
    slot (:class:`~deepseek_frontend.edge.body_readers.BodyReaders`: per client address, then in all)
    until it is in, so a slow body never holds an admission slot. Raises ``OverloadedError``
    (429) past the reader limits, ``PayloadTooLargeError`` (413), ``RequestTimeoutError`` (408)
    after the server's ``body_timeout``, ``RequestError`` if the client goes away.
    """
    max_bytes, timeout_s = _body_limits(request, max_bytes, None)
    readers = get_state(request).body_readers
    client = request.client.host if request.client is not None else ""
    parts: list[bytes] = []
    size = 0
    reading = False
    # A client may send its body slowly: nobody else waits for this request's loop turn meanwhile.
    release_current_turn()
    CURRENT_TURN.set(None)
    try:
        async with asyncio.timeout(timeout_s or None):
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    raise RequestError("client disconnected while sending the body")
                part = message.get("body", b"")
                size += len(part)
                if size > max_bytes:
                    raise PayloadTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
                parts.append(part)
                if not message.get("more_body", False):
                    break
                if readers is not None and not reading:
                    refusal = await readers.enter(client)
                    if refusal is not None:
                        raise refusal
                    reading = True
    except TimeoutError:
        raise RequestTimeoutError(
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes received)"
        ) from None
    finally:
        if reading and readers is not None:
            readers.leave(client)
    setattr(request.state, BODY_ATTR, b"".join(parts))


async def read_json(request: Request, max_bytes: int, timeout_s: float | None = None) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises ``PayloadTooLargeError`` past ``max_bytes`` (checked on Content-Length
    first, then while reading, so a lying client cannot make us buffer more),
    ``RequestTimeoutError`` (408, and the connection is closed) when the body has not
    arrived within ``timeout_s`` seconds (default: the server's ``body_timeout``, else
    :data:`BODY_TIMEOUT_S`) -- a client trickling its body must not hold a request slot
    forever -- and ``RequestError`` for invalid JSON or a non-object body.
    """
    body: bytes | None = getattr(request.state, BODY_ATTR, None)
    if body is None:  # not read before admission (a route outside api_route, a test)
        max_bytes, timeout_s = _body_limits(request, max_bytes, timeout_s)
        body = await _read_stream(request, max_bytes, timeout_s)
    elif len(body) > max_bytes:
        raise PayloadTooLargeError(f"request body is {len(body)} bytes; the limit is {max_bytes}")
    state = get_state(request)
    turns = getattr(state.pipeline, "turns", None)
    if turns is not None:
        # Parsing, validating and preparing the prompt run on the event loop in turns, from here
        # until the request waits on the engine (ChatPipeline.start gives the turn up): a burst
        # queues here instead of running thousands of such steps in one loop iteration while
        # /live and everyone else wait. A follow-up of a recent conversation goes first.
        urgent = request.scope.get(WARM_KEY)
        if urgent is None:  # not judged by the HTTP protocol (a test client, another server)
            heads = state.recent_heads
            urgent = heads.seen_before(body) if heads is not None else False
        CURRENT_TURN.set(await turns.take(urgent))
    parsed = getattr(request.state, PARSED_ATTR, None)  # parsed already to route it (api_route)
    return parsed if parsed is not None else parse_json_object(body)


async def _read_stream(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    parts: list[bytes] = []
    size = 0
    # A client may send its body slowly: nobody else waits for this request's loop turn meanwhile.
    release_current_turn()
    CURRENT_TURN.set(None)
    try:
        async with asyncio.timeout(timeout_s or None):
            async for part in request.stream():
                size += len(part)
                if size > max_bytes:
                    raise PayloadTooLargeError(f"request body exceeds the limit of {max_bytes} bytes")
                parts.append(part)
    except ClientDisconnect:
        raise RequestError("client disconnected while sending the body") from None
    except TimeoutError:
        raise RequestTimeoutError(
            f"the request body did not arrive within {timeout_s:g} s ({size} bytes received)"
        ) from None
    return b"".join(parts)


def parse_json_object(raw: bytes, where: str = "request body") -> dict[str, Any]:
    """``raw`` as a JSON object; a ``RequestError`` naming ``where`` if empty, not JSON or not an object."""
    if not raw:
        raise RequestError(f"{where} is empty; expected a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(f"{where} must be a JSON object, got {type(data).__name__}")
    return data
