"""One batch line run through its endpoint's own route, in-process.

A line is not re-implemented: its body goes through the same ASGI route a client's request takes
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``, ``/v1/messages``) -- the same
validation, prompt rendering, tool parsing, reasoning and error answers -- so a line's output is
what the endpoint answers for that body. The call enters below the HTTP server and the
middlewares: there is no API key to check (the batch's key's tenant rides in the scope, for the
models it may use), and the scope carries an :class:`~deepseek_frontend.edge.request.OnBehalf`:
the batch's owner (whose stored responses a ``/v1/responses`` line reads and writes) and
:data:`BATCH_PRIORITY`.

:data:`BATCH_PRIORITY` is the one place a batch line's priority is set. It is the lowest there is:
a line is never judged a warm follow-up (no urgent loop turn ahead of other requests), and
admission -- once it orders waiters by priority -- lets every interactive request go first.

The route answers as it would over HTTP; :func:`classify` says what the runner does with it:
a result to keep (2xx, or a refusal that is the request's fault), or a retry (the server's load:
429 and 503, never the request's; other 5xx, a few times).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from starlette.types import ASGIApp, Message

from deepseek_frontend.edge.request import ON_BEHALF_KEY, OnBehalf
from deepseek_frontend.edge.turns import WARM_KEY
from deepseek_frontend.generation import LOWEST_PRIORITY

if TYPE_CHECKING:
    from deepseek_frontend.keys.tenants import Tenant

__all__ = ["BATCH_PRIORITY", "MAX_ATTEMPTS", "MAX_CLAIMS", "RouteAnswer", "call_route", "classify"]

#: the priority every batch line runs at (higher is more important): below every interactive request
BATCH_PRIORITY: Final = LOWEST_PRIORITY
#: times a line is run before a server-side failure (5xx other than load) is its result
MAX_ATTEMPTS: Final = 3
#: times a line may be claimed without a result (its process died each time) before it is given up
#: as a server error, so that a line that brings its process down cannot do so for ever
MAX_CLAIMS: Final = 5
#: statuses that say the server is busy, not that the line failed: it runs again later, uncounted
_LOAD_STATUSES = frozenset({429, 503})


@dataclass(frozen=True, slots=True)
class RouteAnswer:
    """What the route answered: its status, ``x-request-id`` and body."""

    status: int
    request_id: str
    body: bytes


async def call_route(
    app: ASGIApp,
    router: ASGIApp,
    path: str,
    body: bytes,
    *,
    tenant: Tenant | None,
    owner: str,
) -> RouteAnswer:
    """``POST path`` with ``body`` through ``router`` (``app``'s routes, below its middlewares), on
    behalf of ``owner`` with ``tenant``'s permissions, at :data:`BATCH_PRIORITY`. Cancelling the
    call cancels the handler, which closes its engine streams (the engine requests are aborted)."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("batch", 0),
        "server": None,
        "app": app,
        "state": {"tenant": tenant, "api_key_name": tenant.name if tenant is not None else ""},
        ON_BEHALF_KEY: OnBehalf(owner, BATCH_PRIORITY),
        # a batch line is never a warm follow-up: its prompt work never goes ahead of others'
        WARM_KEY: False,
    }
    sent = False
    never: asyncio.Future[Message] = asyncio.get_running_loop().create_future()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        # the connection stays open until the answer is complete (a disconnect would cancel it)
        return await asyncio.shield(never)

    status = 500
    request_id = ""
    parts: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, request_id
        if message["type"] == "http.response.start":
            status = int(message["status"])
            for name, value in message.get("headers", ()):
                if name == b"x-request-id":
                    request_id = value.decode("latin-1")
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    try:
        await router(scope, receive, send)
    finally:
        never.cancel()
    return RouteAnswer(status, request_id, b"".join(parts))


Verdict = Literal["result", "retry", "retry-uncounted"]


def classify(status: int, attempts: int) -> Verdict:
    """What a line whose route answered ``status`` on its ``attempts``-th run becomes: its result
    (2xx; a 4xx, the request's own fault; a 5xx after :data:`MAX_ATTEMPTS` runs), a retry that
    counts (another 5xx), or a retry that does not (the server's load: 429, 503)."""
    if status in _LOAD_STATUSES:
        return "retry-uncounted"
    if status >= 500 and attempts < MAX_ATTEMPTS:
        return "retry"
    return "result"
