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
from starlette.responses import Response
from starlette.routing import Route

from deepseek_frontend.api.stored import json_response, list_body, list_query, not_stored, path_id, read_page
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.errors import RequestError

from .background import TERMINAL, expire_if_lost

__all__ = ["ROUTES"]


def _response_id(ctx: RequestContext) -> str:
    return path_id(ctx.request, "response_id")


@api_route("/v1/responses/{id}", prefix="resp", generates=False)
async def retrieve_response(ctx: RequestContext) -> Response:
    """``GET /v1/responses/{id}``: the stored response object."""
    if ctx.request.query_params.get("stream") in ("true", "1"):
        raise RequestError("stream: streaming a stored response again is not supported", param="stream")
    response_id = _response_id(ctx)
    store = ctx.store
    stored = await store.get_response(ctx.owner, response_id)
    if stored is None:
        raise not_stored("Response", response_id)
    return json_response((await expire_if_lost(store, stored)).body)


@api_route("/v1/responses/{id}", prefix="resp", generates=False)
async def delete_response(ctx: RequestContext) -> Response:
    """``DELETE /v1/responses/{id}`` (a background response still running is cancelled first)."""
    response_id = _response_id(ctx)
    store, owner = ctx.store, ctx.owner
    if await store.get_response(owner, response_id) is None:
        raise not_stored("Response", response_id)
    await ctx.state.background.cancel(response_id)
    if not await store.delete_response(owner, response_id):
        raise not_stored("Response", response_id)
    return json_response({"id": response_id, "object": "response", "deleted": True})


@api_route("/v1/responses/{id}/input_items", prefix="resp", generates=False)
async def list_input_items(ctx: RequestContext) -> Response:
    """``GET /v1/responses/{id}/input_items``: the request's own input items, paged."""
    response_id = _response_id(ctx)
    query = list_query(ctx.request)
    page = await read_page(ctx.store.list_response_items(ctx.owner, response_id, "input", **query.kwargs()))
    if page is None:
        raise not_stored("Response", response_id)
    return json_response(list_body(page))


@api_route("/v1/responses/{id}/cancel", prefix="resp", generates=False)
async def cancel_response(ctx: RequestContext) -> Response:
    """``POST /v1/responses/{id}/cancel``: stop a background response; the response object after.

    The store decides (one conditional write, ``StateStore.update_response``): a cancel answered 200
    is the cancel that moved the response to ``cancelled``, and nothing overwrites it after. A
    response already cancelled is returned as it is; one that finished first (its completion won
    the race), or that was not created with ``background: true``, is a 400, as OpenAI answers."""
    response_id = _response_id(ctx)
    store, owner = ctx.store, ctx.owner
    stored = await store.get_response(owner, response_id)
    if stored is None:
        raise not_stored("Response", response_id)
    stored = await expire_if_lost(store, stored)
    if not orjson.loads(stored.request).get("background"):
        raise RequestError("Only responses created with background: true can be cancelled.")
    if stored.status not in TERMINAL:
        body: dict[str, Any] = orjson.loads(stored.body)
        body["status"] = "cancelled"
        # the store first: a task on another process or replica stops when it reads this
        if await store.update_response(owner, response_id, "cancelled", orjson.dumps(body).decode(), None):
            await ctx.state.background.cancel(response_id)
        stored = await store.get_response(owner, response_id)
        if stored is None:  # deleted meanwhile
            raise not_stored("Response", response_id)
    if stored.status != "cancelled":
        raise RequestError(f"Cannot cancel a response with status '{stored.status}'.")
    return json_response(stored.body)


ROUTES = [
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
]
