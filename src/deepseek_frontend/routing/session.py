"""The agent session a request belongs to, read from the headers agents already send.

Headers, first match wins:

* ``x-claude-code-session-id`` -- Claude Code;
* ``session_id`` -- OpenAI Codex (its ``build_conversation_headers`` sends the conversation id
  under this name, see openai/codex ``codex-rs/codex-api/src/requests/headers.rs``);
* ``x-session-id`` -- a generic header for any other client.

:class:`SessionMiddleware` stores the value in a context variable for the lifetime of the HTTP
request; the router reads it with :func:`current_session` when it picks a worker (the pipeline
creates the engine stream inside the request's context, so no protocol adapter has to carry
it). Values are truncated to ``MAX_SESSION_ID_CHARS`` so a hostile header cannot grow the
affinity table's keys.
"""

from __future__ import annotations

import contextvars

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["SESSION_HEADERS", "SessionMiddleware", "current_session", "session_from_headers", "use_session"]

SESSION_HEADERS: tuple[bytes, ...] = (b"x-claude-code-session-id", b"session_id", b"x-session-id")
MAX_SESSION_ID_CHARS = 128

_SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "deepseek_frontend_session", default=None
)


def session_from_headers(headers: list[tuple[bytes, bytes]] | list[tuple[str, str]]) -> str | None:
    """The session id in ASGI-style ``(name, value)`` pairs (names lower-case), or None."""
    found: dict[bytes, bytes] = {}
    for name, value in headers:
        key = name.encode("latin-1") if isinstance(name, str) else name
        if key in SESSION_HEADERS and key not in found:
            found[key] = value.encode("latin-1") if isinstance(value, str) else value
    for key in SESSION_HEADERS:
        raw = found.get(key)
        if raw:
            text = raw.decode("latin-1").strip()[:MAX_SESSION_ID_CHARS]
            if text:
                return text
    return None


def current_session() -> str | None:
    """The session of the request being served (None outside a request or without a header)."""
    return _SESSION.get()


def use_session(session: str | None) -> contextvars.Token[str | None]:
    """Set the current session (benchmarks and tests that call the pool directly use this)."""
    return _SESSION.set(session)


class SessionMiddleware:
    """Pure-ASGI middleware: puts the request's session id in context for the router."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _SESSION.set(session_from_headers(scope["headers"]))
        try:
            await self.app(scope, receive, send)
        finally:
            _SESSION.reset(token)
