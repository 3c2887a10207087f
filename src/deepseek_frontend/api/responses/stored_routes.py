"""The stored-response endpoints: ``GET`` / ``DELETE /v1/responses/{id}``,
``GET /v1/responses/{id}/input_items`` and ``POST /v1/responses/{id}/cancel``.

Shapes follow OpenAI's: the response object as stored; ``{"id", "object": "response", "deleted":
true}``; an OpenAI list page of input items (``after`` / ``before`` / ``limit`` / ``order``,
newest first by default); the response object after a cancel. A response of another API key, a
deleted one or an expired one is a 404 ``invalid_request_error``.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deepseek_frontend.api.stored import (
    json_response,
    list_body,
    list_query,
    not_stored,
    owner_of,
    read_page,
    store_of,
)
from deepseek_frontend.edge.context import get_state
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.edge.tracking import RequestTracker
from deepseek_frontend.errors import RequestError

from .background import TERMINAL, BackgroundRuns, expire_if_lost

__all__ = ["ROUTES", "background_runs"]


def background_runs(request: Request) -> BackgroundRuns:
    """This process's background responses (made on first use)."""
    extra = get_state(request).extra
    runs = extra.get("background_runs")
    if runs is None:
        runs = extra["background_runs"] = BackgroundRuns()
    return runs


def _response_id(request: Request) -> str:
    return str(request.path_params["response_id"])


@api_route("/v1/responses/{id}", prefix="resp")
async def retrieve_response(request: Request, tracker: RequestTracker) -> Response:
    """``GET /v1/responses/{id}``: the stored response object."""
    if request.query_params.get("stream") in ("true", "1"):
        raise RequestError("stream: streaming a stored response again is not supported", param="stream")
    response_id = _response_id(request)
    store = store_of(request)
    stored = await store.get_response(owner_of(request), response_id)
    if stored is None:
        raise not_stored("Response", response_id)
    return json_response((await expire_if_lost(store, stored)).body)


@api_route("/v1/responses/{id}", prefix="resp")
async def delete_response(request: Request, tracker: RequestTracker) -> Response:
    """``DELETE /v1/responses/{id}`` (a background response still running is cancelled first)."""
    response_id = _response_id(request)
    store, owner = store_of(request), owner_of(request)
    if await store.get_response(owner, response_id) is None:
        raise not_stored("Response", response_id)
    await background_runs(request).cancel(response_id)
    if not await store.delete_response(owner, response_id):
        raise not_stored("Response", response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


@api_route("/v1/responses/{id}/input_items", prefix="resp")
async def list_input_items(request: Request, tracker: RequestTracker) -> Response:
    """``GET /v1/responses/{id}/input_items``: the request's own input items, paged."""
    response_id = _response_id(request)
    query = list_query(request)
    page = await read_page(
        store_of(request).list_response_items(owner_of(request), response_id, "input", **query.kwargs())
    )
    if page is None:
        raise not_stored("Response", response_id)
    return json_response(list_body(page))


@api_route("/v1/responses/{id}/cancel", prefix="resp")
async def cancel_response(request: Request, tracker: RequestTracker) -> Response:
    """``POST /v1/responses/{id}/cancel``: stop a background response; the response object after.

    A response already cancelled is returned as it is; one that ended otherwise, or that was not
    created with ``background: true``, is a 400."""
    response_id = _response_id(request)
    store, owner = store_of(request), owner_of(request)
    stored = await store.get_response(owner, response_id)
    if stored is None:
        raise not_stored("Response", response_id)
    stored = await expire_if_lost(store, stored)
    if not orjson.loads(stored.request).get("background"):
        raise RequestError("Only responses created with background: true can be cancelled.")
    if stored.status != "cancelled":
        if stored.status in TERMINAL:
            raise RequestError(f"Cannot cancel a response with status '{stored.status}'.")
        body: dict[str, Any] = orjson.loads(stored.body)
        body["status"] = "cancelled"
        # the store first: a task on another process or replica stops when it reads this
        await store.update_response(owner, response_id, "cancelled", orjson.dumps(body).decode(), None)
        await background_runs(request).cancel(response_id)
        stored = await store.get_response(owner, response_id) or stored
    return json_response(stored.body)


ROUTES = [
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
]
