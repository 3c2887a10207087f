"""``/v1/conversations``: create, retrieve, update, delete; and their items: add, list, get, delete.

As OpenAI defines them: a conversation is ``{"id": "conv_...", "object": "conversation",
"created_at", "metadata"}``; ``POST /v1/conversations`` takes up to 20 initial ``items`` and
``metadata`` (at most 16 string pairs, keys up to 64 characters, values up to 512); items are
Responses input items, given an id when they have none (``item_reference`` items are replaced by
the stored item); deleting an item answers the conversation. ``conversation`` on
``/v1/responses`` (api/responses/stateful.py) reads a conversation's items as the history and
appends the request's input and output items to it. Another API key's conversation is a 404.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deepseek_frontend.api.responses.stateful import input_items
from deepseek_frontend.api.stored import (
    json_response,
    list_body,
    list_query,
    not_stored,
    owner_of,
    read_page,
    store_of,
)
from deepseek_frontend.api.validation import check_array, check_object
from deepseek_frontend.edge.body import read_json
from deepseek_frontend.edge.context import get_state
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.edge.tracking import RequestTracker
from deepseek_frontend.errors import RequestError
from deepseek_frontend.state import Page, StoredConversation, StoredItem, new_id

__all__ = ["ROUTES"]

#: items one create call may add (OpenAI's limit)
MAX_ITEMS_PER_CALL = 20


def _metadata(raw: Any) -> dict[str, str]:
    """OpenAI's metadata rules: an object of at most 16 string values (keys <= 64, values <= 512)."""
    if raw is None:
        return {}
    metadata = check_object(raw, "metadata")
    if len(metadata) > 16:
        raise RequestError(f"metadata: at most 16 pairs, got {len(metadata)}", param="metadata")
    for key, value in metadata.items():
        if len(key) > 64:
            raise RequestError(
                f"metadata: key {key[:20]!r}... is longer than 64 characters", param="metadata"
            )
        if not isinstance(value, str) or len(value) > 512:
            raise RequestError(
                f"metadata.{key}: expected a string of at most 512 characters", param=f"metadata.{key}"
            )
    return dict(metadata)


def _conversation_object(conv: StoredConversation) -> dict[str, Any]:
    return {
        "id": conv.id,
        "object": "conversation",
        "created_at": int(conv.created_at),
        "metadata": orjson.loads(conv.metadata),
    }


def _disabled(request: Request) -> None:
    if not store_of(request).enabled:
        raise RequestError("conversations need stored state; this server is stateless (--state-store none)")


async def _items(request: Request, raw: Any, param: str) -> list[StoredItem]:
    items = check_array(raw, param)
    if len(items) > MAX_ITEMS_PER_CALL:
        raise RequestError(
            f"{param}: at most {MAX_ITEMS_PER_CALL} items per call, got {len(items)}", param=param
        )
    for i, item in enumerate(items):
        item = check_object(item, f"{param}[{i}]")
        if "type" not in item and "role" not in item:
            raise RequestError(f"{param}[{i}].type: required", param=f"{param}[{i}].type")
    resolved = await input_items(items, store_of(request), owner_of(request)) if items else []
    return [StoredItem(str(item["id"]), orjson.dumps(item).decode()) for item in resolved]


@api_route("/v1/conversations", prefix="conv")
async def create_conversation(request: Request, tracker: RequestTracker) -> Response:
    _disabled(request)
    body = check_object(await read_json(request, get_state(request).config.max_body_bytes), "body")
    metadata = _metadata(body.get("metadata"))
    items = await _items(request, body.get("items") or [], "items")
    conv = StoredConversation(
        new_id("conv"), owner_of(request), store_of(request).now(), orjson.dumps(metadata).decode()
    )
    await store_of(request).put_conversation(conv, items)
    return json_response(_conversation_object(conv))


async def _get(request: Request) -> StoredConversation:
    conversation_id = str(request.path_params["conversation_id"])
    conv = await store_of(request).get_conversation(owner_of(request), conversation_id)
    if conv is None:
        raise not_stored("Conversation", conversation_id)
    return conv


@api_route("/v1/conversations/{id}", prefix="conv")
async def retrieve_conversation(request: Request, tracker: RequestTracker) -> Response:
    return json_response(_conversation_object(await _get(request)))


@api_route("/v1/conversations/{id}", prefix="conv")
async def update_conversation(request: Request, tracker: RequestTracker) -> Response:
    body = check_object(await read_json(request, get_state(request).config.max_body_bytes), "body")
    if "metadata" not in body:
        raise RequestError("metadata: required", param="metadata")
    metadata = orjson.dumps(_metadata(body["metadata"])).decode()
    conv = await _get(request)
    if not await store_of(request).update_conversation(owner_of(request), conv.id, metadata):
        raise not_stored("Conversation", conv.id)
    return json_response(_conversation_object(await _get(request)))


@api_route("/v1/conversations/{id}", prefix="conv")
async def delete_conversation(request: Request, tracker: RequestTracker) -> Response:
    conversation_id = str(request.path_params["conversation_id"])
    if not await store_of(request).delete_conversation(owner_of(request), conversation_id):
        raise not_stored("Conversation", conversation_id)
    return json_response({"id": conversation_id, "object": "conversation.deleted", "deleted": True})


@api_route("/v1/conversations/{id}/items", prefix="conv")
async def create_items(request: Request, tracker: RequestTracker) -> Response:
    body = check_object(await read_json(request, get_state(request).config.max_body_bytes), "body")
    if "items" not in body:
        raise RequestError("items: required", param="items")
    conv = await _get(request)
    items = await _items(request, body["items"], "items")
    if not await store_of(request).add_conversation_items(owner_of(request), conv.id, items):
        raise not_stored("Conversation", conv.id)
    return json_response(list_body(Page(items, has_more=False)))


@api_route("/v1/conversations/{id}/items", prefix="conv")
async def list_items(request: Request, tracker: RequestTracker) -> Response:
    conversation_id = str(request.path_params["conversation_id"])
    query = list_query(request)
    store = store_of(request)
    page = await read_page(
        store.list_conversation_items(owner_of(request), conversation_id, **query.kwargs())
    )
    if page is None:
        raise not_stored("Conversation", conversation_id)
    return json_response(list_body(page))


@api_route("/v1/conversations/{id}/items/{item_id}", prefix="conv")
async def retrieve_item(request: Request, tracker: RequestTracker) -> Response:
    conv = await _get(request)
    item_id = str(request.path_params["item_id"])
    item = await store_of(request).get_conversation_item(owner_of(request), conv.id, item_id)
    if item is None:
        raise not_stored("Item", item_id)
    return json_response(item.data)


@api_route("/v1/conversations/{id}/items/{item_id}", prefix="conv")
async def delete_item(request: Request, tracker: RequestTracker) -> Response:
    conv = await _get(request)
    item_id = str(request.path_params["item_id"])
    if not await store_of(request).delete_conversation_item(owner_of(request), conv.id, item_id):
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
