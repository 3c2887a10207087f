"""A request's body: read before the request is admitted, then parsed as a JSON object.

* :func:`receive_body` -- reads the whole body before admission (413 past the size limit, 408 past
  the body timeout, a reader slot while it is still arriving).
* :func:`take_prompt_turn` -- the loop turn a request's prompt work runs in (urgent for a follow-up
  of a recent conversation), taken before its body is parsed.
* :func:`parse_json_object` -- bytes to a JSON object, with the 400 naming where they came from.

The handler reads its parsed body through its ``RequestContext`` (``edge/request.py``), which
puts these together.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request

from deepseek_frontend.errors import PayloadTooLargeError, RequestError, RequestTimeoutError
from deepseek_frontend.pipeline.offload import CURRENT_TURN, LoopTurns, release_current_turn

from .memory import LARGE_BODY_BYTES
from .turns import WARM_KEY

if TYPE_CHECKING:
    from .body_readers import BodyReaders
    from .turns import RecentHeads

#: seconds a client may take to send its whole request body (32 MiB at 1 MB/s takes 32 s)
BODY_TIMEOUT_S = 60.0


async def receive_body(
    request: Request, *, max_bytes: int, timeout_s: float, readers: BodyReaders | None
) -> bytes:
    """``request``'s whole body, read before the request is admitted.

    A body that is complete at its first read takes nothing; one still arriving takes a reader
    slot in ``readers`` (per client address, then in all) until it is in, so a slow body never
    holds an admission slot. Raises ``PayloadTooLargeError`` (413) past ``max_bytes`` (checked on
    Content-Length first, then while reading, so a lying client cannot make us buffer more),
    ``OverloadedError`` (429) past the reader limits, ``RequestTimeoutError`` (408, and the
    connection is closed) when the body has not arrived within ``timeout_s`` seconds (0: no
    deadline) -- a client trickling its body must not hold a slot forever -- and ``RequestError``
    if the client goes away.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(f"request body is {declared} bytes; the limit is {max_bytes}")
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
    return b"".join(parts)


async def take_prompt_turn(
    request: Request, body: bytes, turns: LoopTurns, recent_heads: RecentHeads | None
) -> None:
    """Take the loop turn the request's parsing, validation and prompt preparation run in.

    They run on the event loop in turns from here until the request waits on the engine
    (``ChatPipeline.start`` gives the turn up): a burst queues here instead of running thousands of
    such steps in one loop iteration while ``/live`` and everyone else wait. A follow-up of a
    recent conversation goes first: the HTTP protocol's verdict (``WARM_KEY``), else whether the
    body starts like a recent one.
    """
    urgent = request.scope.get(WARM_KEY)
    if urgent is None:  # not judged by the HTTP protocol (a test client, another server)
        urgent = recent_heads.seen_before(body) if recent_heads is not None else False
    CURRENT_TURN.set(await turns.take(urgent))


#: deepest nesting of arrays and objects a request body may have (the body itself is level 1).
#: Far above any real request (a tool schema is checked to 64 levels, api/schemas.py), and far
#: enough below orjson's own encoder limit (254) and Python's recursion limit that whatever the
#: server does with a body -- store it, copy it, encode a piece of it -- never overflows.
MAX_BODY_DEPTH = 128
#: orjson's encoder refuses values nested deeper than this (a TypeError, "Recursion limit reached")
_ORJSON_DEPTH = 254


def parse_json_object(raw: bytes, where: str = "request body") -> dict[str, Any]:
    """``raw`` as a JSON object; a ``RequestError`` naming ``where`` if empty, not JSON, not an
    object, or nested more than :data:`MAX_BODY_DEPTH` levels deep (then naming the path)."""
    if not raw:
        raise RequestError(f"{where} is empty; expected a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError(f"{where} must be a JSON object, got {type(data).__name__}")
    _check_depth(data, where, len(raw))
    return data


def _check_depth(data: dict[str, Any], where: str, size: int) -> None:
    """``RequestError`` naming the first path deeper than :data:`MAX_BODY_DEPTH` levels, if any.

    A body under :data:`~.memory.LARGE_BODY_BYTES` (``size``) costs one orjson encoding (C speed,
    about a sixth of a walk in Python): the body wrapped in enough lists that it fails exactly when
    the body is nested more than ``MAX_BODY_DEPTH`` levels; only then is it walked, to name the
    path. A larger one is walked at once, over its arrays and objects only (a multi-MB prompt has a
    handful): encoding it would allocate its size again, and those freed MBs stay in the heap."""
    if size < LARGE_BODY_BYTES:
        wrapped: Any = data
        for _ in range(_ORJSON_DEPTH - MAX_BODY_DEPTH):
            wrapped = [wrapped]
        try:
            orjson.dumps(wrapped)
            return
        except TypeError:
            pass
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        node, path, depth = stack.pop()
        if depth > MAX_BODY_DEPTH:
            param = path.lstrip(".")
            raise RequestError(
                f"{param}: {where} is nested more than {MAX_BODY_DEPTH} levels deep", param=param
            )
        if isinstance(node, dict):
            stack.extend(
                (v, f"{path}.{_shown_key(k)}", depth + 1)
                for k, v in node.items()
                if isinstance(v, dict | list)
            )
        elif isinstance(node, list):
            stack.extend(
                (v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node) if isinstance(v, dict | list)
            )


def _shown_key(key: str) -> str:
    """An object key in a path of an error message, cut short (keys are the client's)."""
    return key if len(key) <= 64 else key[:61] + "..."
