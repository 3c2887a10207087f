"""Errors as HTTP answers.

Every ``FrontendError`` already knows its status and error type
(``deepseek_frontend.errors``); this module only chooses the JSON shape. The
shape is pluggable: OpenAI routes use :func:`openai_error_body`, the Anthropic
adapter passes its own :data:`ErrorBodyRenderer` to :func:`error_response` and
to the stream helpers.

OpenAI shape::

    {"error": {"message": "...", "type": "invalid_request_error",
               "param": "messages[2].content", "code": null}}
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from starlette.responses import Response

from deepseek_frontend.errors import DeadlineExceededError, FrontendError

log = logging.getLogger("deepseek_frontend.api")

#: Turns an error into the JSON object a protocol sends (body of a response or of an SSE error event).
ErrorBodyRenderer = Callable[[FrontendError], dict[str, Any]]


class InternalServerError(FrontendError):
    """An unexpected exception, reported without its internals (HTTP 500)."""


def as_frontend_error(exc: BaseException) -> FrontendError:
    """``exc`` itself when it is a ``FrontendError``, else a generic 500 (the cause is logged)."""
    if isinstance(exc, FrontendError):
        return exc
    log.exception("unexpected error", exc_info=exc)
    return InternalServerError(f"internal server error ({type(exc).__name__})")


def openai_error_body(err: FrontendError) -> dict[str, Any]:
    """The OpenAI error object for ``err``."""
    return {
        "error": {
            "message": err.message,
            "type": err.error_type,
            "param": err.param,
            "code": err.code,
        }
    }


@dataclass(frozen=True, slots=True)
class ApiShape:
    """How one API answers at the edge: the shape of its error bodies, and whose rate-limit headers
    its responses carry (``keys/rate_limits.py``: OpenAI's ``x-ratelimit-*`` or Anthropic's
    ``anthropic-ratelimit-*``)."""

    name: Literal["openai", "anthropic"]
    error_body: ErrorBodyRenderer


#: the OpenAI APIs (chat, completions, Responses, conversations)
OPENAI = ApiShape("openai", openai_error_body)


def shape_for(path: str, shapes: tuple[tuple[str, ApiShape], ...]) -> ApiShape:
    """The API ``path`` belongs to: the first of ``shapes`` (path prefix, shape) whose prefix it
    starts with, else OpenAI's. Used for errors answered before a handler runs (no key, no route)."""
    for prefix, shape in shapes:
        if path.startswith(prefix):
            return shape
    return OPENAI


def error_response(
    exc: BaseException,
    render: ErrorBodyRenderer = openai_error_body,
    headers: dict[str, str] | None = None,
) -> Response:
    """A JSON response with the status ``exc`` maps to, in the shape ``render`` gives."""
    err = as_frontend_error(exc)
    retry_after = getattr(err, "retry_after_s", None)
    if retry_after is not None:
        headers = {**(headers or {}), "retry-after": str(retry_after)}
    if err.status_code in (408, 413) and not isinstance(err, DeadlineExceededError):
        # the client is too slow to send its request, or sends more than is taken: the rest of its
        # body is not read, so the connection cannot carry another request (a client still sending
        # sees its write fail and reads this answer). A request whose own time budget ran out was
        # read whole: its connection stays open.
        headers = {**(headers or {}), "connection": "close"}
    return Response(
        orjson.dumps(render(err)),
        status_code=err.status_code,
        media_type="application/json",
        headers=headers,
    )
