"""``/v1/conversations``: create, retrieve, update, delete; and their items: add, list, get, delete.

As OpenAI defines them: a conversation is ``{"id": "conv_...", "object": "conversation",
"created_at", "metadata"}``; ``POST /v1/conversations`` takes up to 20 initial ``items`` and
``metadata`` (at most 16 string pairs, keys up to 64 characters, values up to 512); items are
Responses input items, given an id when they have none (``item_reference`` items are replaced by
the stored item) and checked as ``/v1/responses`` checks its input (a 400 naming the item and
field, nothing stored); deleting an item answers the conversation. ``conversation`` on
``/v1/responses`` (api/responses/stateful.py) reads a conversation's items as the history and
appends the request's input and output items to it. Another API key's conversation is a 404.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response
from starlette.routing import Route

from deepseek_frontend.api.responses.convert import check_input_items
from deepseek_frontend.api.responses.stateful import input_items
from deepseek_frontend.api.stored import json_response, list_body, list_query, not_stored, path_id, read_page
from deepseek_frontend.api.validation import check_array, check_id, check_metadata, check_object
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.errors import RequestError
from deepseek_frontend.state import Page, StoredConversation, StoredItem, new_id

__all__ = ["ROUTES"]

#: items one create call may add (OpenAI's limit)
MAX_ITEMS_PER_CALL = 20


def _conversation_object(conv: StoredConversation) -> dict[str, Any]:
    return {
        "id": conv.id,
        "object": "conversation",
        "created_at": int(conv.created_at),
        "metadata": orjson.loads(conv.metadata),
    }


def _disabled(ctx: RequestContext) -> None:
    if not ctx.store.enabled:
        raise RequestError("conversations need stored state; this server is stateless (--state-store none)")


async def _items(
    ctx: RequestContext, raw: Any, param: str, conversation_id: str | None = None
) -> list[StoredItem]:
    """The items of a create or add call, checked as ``/v1/responses`` checks its input items (a 400
    naming ``items[i]`` and the field, before anything is stored: a stored item must be one every
    later response on the conversation can read), references resolved and ids given. For an add,
    ``conversation_id``: its stored items come first (an output may answer a call among them)."""
    items = check_array(raw, param)
    if len(items) > MAX_ITEMS_PER_CALL:
        raise RequestError(
            f"{param}: at most {MAX_ITEMS_PER_CALL} items per call, got {len(items)}", param=param
        )
    for i, item in enumerate(items):
        item = check_object(item, f"{param}[{i}]")
        if "type" not in item and "role" not in item:
            raise RequestError(f"{param}[{i}].type: required", param=f"{param}[{i}].type")
        if item.get("id") not in (None, ""):  # no id: one is given
            check_id(item["id"], f"{param}[{i}].id")
    resolved = await input_items(items, ctx.store, ctx.owner) if items else []
    history: list[Any] = []
    if resolved and conversation_id is not None:
        stored = await ctx.store.conversation_items(ctx.owner, conversation_id)
        history = [orjson.loads(item.data) for item in stored or []]
    check_input_items(history, resolved, param)
    return [StoredItem(str(item["id"]), orjson.dumps(item).decode()) for item in resolved]


@api_route("/v1/conversations", prefix="conv", generates=False)
async def create_conversation(ctx: RequestContext) -> Response:
    _disabled(ctx)
    body = check_object(await ctx.json(), "body")
    metadata = check_metadata(body.get("metadata"))
    items = await _items(ctx, body.get("items") or [], "items")
    conv = StoredConversation(new_id("conv"), ctx.owner, ctx.store.now(), orjson.dumps(metadata).decode())
    await ctx.store.put_conversation(conv, items)
    return json_response(_conversation_object(conv))


async def _get(ctx: RequestContext) -> StoredConversation:
    conversation_id = path_id(ctx.request, "conversation_id")
    conv = await ctx.store.get_conversation(ctx.owner, conversation_id)
    if conv is None:
        raise not_stored("Conversation", conversation_id)
    return conv


@api_route("/v1/conversations/{id}", prefix="conv", generates=False)
async def retrieve_conversation(ctx: RequestContext) -> Response:
    return json_response(_conversation_object(await _get(ctx)))


@api_route("/v1/conversations/{id}", prefix="conv", generates=False)
async def update_conversation(ctx: RequestContext) -> Response:
    body = check_object(await ctx.json(), "body")
    if "metadata" not in body:
        raise RequestError("metadata: required", param="metadata")
    metadata = orjson.dumps(check_metadata(body["metadata"])).decode()
    conv = await _get(ctx)
    if not await ctx.store.update_conversation(ctx.owner, conv.id, metadata):
        raise not_stored("Conversation", conv.id)
    return json_response(_conversation_object(await _get(ctx)))


@api_route("/v1/conversations/{id}", prefix="conv", generates=False)
async def delete_conversation(ctx: RequestContext) -> Response:
    conversation_id = path_id(ctx.request, "conversation_id")
    if not await ctx.store.delete_conversation(ctx.owner, conversation_id):
        raise not_stored("Conversation", conversation_id)
    return json_response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@api_route("/v1/conversations/{id}/items", prefix="conv", generates=False)
async def create_items(ctx: RequestContext) -> Response:
    body = check_object(await ctx.json(), "body")
    if "items" not in body:
        raise RequestError("items: required", param="items")
    conv = await _get(ctx)
    items = await _items(ctx, body["items"], "items", conv.id)
    if not await ctx.store.add_conversation_items(ctx.owner, conv.id, items):
        raise not_stored("Conversation", conv.id)
    return json_response(list_body(Page(items, has_more=False)))


@api_route("/v1/conversations/{id}/items", prefix="conv", generates=False)
async def list_items(ctx: RequestContext) -> Response:
    conversation_id = path_id(ctx.request, "conversation_id")
    query = list_query(ctx.request)
    store = ctx.store
    page = await read_page(store.list_conversation_items(ctx.owner, conversation_id, **query.kwargs()))
    if page is None:
        raise not_stored("Conversation", conversation_id)
    return json_response(list_body(page))


@api_route("/v1/conversations/{id}/items/{item_id}", prefix="conv", generates=False)
async def retrieve_item(ctx: RequestContext) -> Response:
    conv = await _get(ctx)
    item_id = path_id(ctx.request, "item_id")
    item = await ctx.store.get_conversation_item(ctx.owner, conv.id, item_id)
    if item is None:
        raise not_stored("Item", item_id)
    return json_response(item.data)


@api_route("/v1/conversations/{id}/items/{item_id}", prefix="conv", generates=False)
async def delete_item(ctx: RequestContext) -> Response:
    conv = await _get(ctx)
    item_id = path_id(ctx.request, "item_id")
    if not await ctx.store.delete_conversation_item(ctx.owner, conv.id, item_id):
        raise not_stored("Item", item_id)
    return json_response(_conversation_object(conv))


ROUTES = [
    Route("/v1/conversations", create_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", retrieve_conversation, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}", update_conversation, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", delete_conversation, methods=["DELETE"]),
    Route("/v1/conversations/{conversation_id}/items", create_items, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}/items", list_items, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", retrieve_item, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items/{item_id}", delete_item, methods=["DELETE"]),
]
