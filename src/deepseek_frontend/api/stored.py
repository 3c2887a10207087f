"""What the stored-object endpoints share: 404s and list pages.

Used by ``/v1/responses`` (stored responses) and ``/v1/conversations``. Every read names the
owner of the request (``RequestContext.owner``): an object of another API key is answered exactly
as an object that does not exist.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from deepseek_frontend.errors import FrontendError, RequestError
from deepseek_frontend.state import MAX_PAGE, CursorError, Page

from .validation import check_id

__all__ = [
    "ListQuery",
    "StoredObjectNotFoundError",
    "json_response",
    "list_body",
    "list_query",
    "path_id",
]


class StoredObjectNotFoundError(FrontendError):
    """A stored object that is not there (never stored, deleted, expired, or another key's): 404 with
    OpenAI's ``invalid_request_error`` type, as OpenAI answers a missing response or conversation."""

    status_code = 404
    error_type = "invalid_request_error"


def not_stored(kind: str, object_id: str, param: str | None = None) -> StoredObjectNotFoundError:
    """The 404 for a missing ``kind`` (``Response``, ``Conversation``, ``Item``) ``object_id``."""
    return StoredObjectNotFoundError(f"{kind} with id '{object_id}' not found.", param=param)


class ListQuery:
    """The pagination parameters of an OpenAI list endpoint (``after``, ``before``, ``limit``, ``order``)."""

    __slots__ = ("after", "before", "limit", "order")

    def __init__(self, after: str | None, before: str | None, limit: int, order: Any) -> None:
        self.after = after
        self.before = before
        self.limit = limit
        self.order = order

    def kwargs(self) -> dict[str, Any]:
        return {"after": self.after, "before": self.before, "limit": self.limit, "order": self.order}


def list_query(request: Request, default_order: str = "desc") -> ListQuery:
    """The list parameters of ``request``'s query string; 400 naming the parameter when one is bad.
    ``limit`` is 1-100 (default 20); ``order`` ``asc`` or ``desc``; the cursors ``after`` and
    ``before`` are ids (``validation.check_id``)."""
    query = request.query_params
    raw_limit = query.get("limit")
    limit = 20
    if raw_limit is not None:
        try:
            limit = int(raw_limit)
        except ValueError:
            raise RequestError(f"limit: expected an integer, got {raw_limit!r}", param="limit") from None
        if not 1 <= limit <= MAX_PAGE:
            raise RequestError(f"limit: expected 1 to {MAX_PAGE}, got {limit}", param="limit")
    order = query.get("order", default_order)
    if order not in ("asc", "desc"):
        raise RequestError(f"order: expected 'asc' or 'desc', got {order!r}", param="order")
    after = check_id(query.get("after") or None, "after", default=None)
    before = check_id(query.get("before") or None, "before", default=None)
    return ListQuery(after, before, limit, order)


def path_id(request: Request, name: str) -> str:
    """The id the URL path names as ``{name}`` (``response_id``, ``conversation_id``, ``item_id``),
    checked like every id a client sends (``validation.check_id``: 400 naming ``name``)."""
    return check_id(str(request.path_params[name]), name)


async def read_page(coro: Any) -> Page | None:
    """Await a store list call, turning a cursor that is not in the list into a 400 naming it."""
    try:
        return await coro
    except CursorError as exc:
        raise RequestError(
            f"{exc.param}: no item with id '{exc.item_id}' in this list", param=exc.param
        ) from None


def list_body(page: Page) -> bytes:
    """An OpenAI list object: ``{"object": "list", "data", "first_id", "last_id", "has_more"}``; the
    items' JSON is spliced in as stored, never re-encoded."""
    data = b",".join(item.data.encode() for item in page.items)
    tail = orjson.dumps({"first_id": page.first_id, "last_id": page.last_id, "has_more": page.has_more})
    return b'{"object":"list","data":[' + data + b"]," + tail[1:]


def json_response(content: bytes | str | dict[str, Any], status_code: int = 200) -> Response:
    body = (
        content
        if isinstance(content, bytes)
        else (content.encode() if isinstance(content, str) else orjson.dumps(content))
    )
    return Response(body, status_code=status_code, media_type="application/json")
