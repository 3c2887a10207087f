"""Stored responses on ``POST /v1/responses``: ``store``, ``previous_response_id``,
``conversation`` and ``item_reference``, resolved before the stateless translation.

:func:`resolve_stateful` turns a stateful request body into the stateless body a client would
have sent had it resent everything: the stored items of the ``previous_response_id`` chain (each
response's input items, then its output items, oldest first) or of the ``conversation``, then the
request's own input, with every ``item_reference`` replaced by the item it names. The stateless
translation (:mod:`.convert`) then renders exactly the prompt the resent conversation renders:
the items are the same JSON, stored byte for byte.

:func:`save_response` stores a finished response with its input and output items (and appends
them to its conversation); the answer reaches the client only after that write committed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from deepseek_frontend.api.stored import not_stored
from deepseek_frontend.api.validation import check_array, check_boolean, check_id, check_object
from deepseek_frontend.errors import RequestError
from deepseek_frontend.state import BrokenChainError, StateStore, StoredItem, StoredResponse, new_id

__all__ = [
    "StatefulRequest",
    "input_items",
    "normalize_item",
    "resolve_stateful",
    "save_response",
    "stored_items",
    "stored_output_items",
]

#: id prefix of an input item the client sent without an id, by item type
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


@dataclass(slots=True)
class StatefulRequest:
    """A request body with its stored state resolved."""

    #: the stateless body: ``input`` holds every item, the state fields are gone
    body: dict[str, Any]
    owner: str
    store: bool = False
    background: bool = False
    previous_response_id: str | None = None
    conversation_id: str | None = None
    #: the request's own input items (ids given to those without), references resolved
    new_items: list[dict[str, Any]] = field(default_factory=list)

    def echo(self) -> dict[str, Any]:
        """The state fields a response object reports."""
        out: dict[str, Any] = {
            "store": self.store,
            "background": self.background,
            "previous_response_id": self.previous_response_id,
        }
        if self.conversation_id is not None:
            out["conversation"] = {"id": self.conversation_id}
        return out


def normalize_item(item: dict[str, Any]) -> dict[str, Any]:
    """``item`` as stored and listed: with an ``id``, ``type: message`` for a bare ``{role, content}``
    and a string ``content`` as its one text part (as OpenAI lists input items). A one-part content
    renders the same prompt as the string (:mod:`.convert` joins parts), so nothing changes for
    the model."""
    if "type" not in item and "role" in item:
        item = {"type": "message", **item}
    if item.get("type") == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        item["content"] = [{"type": part, "text": item["content"]}]
    if not isinstance(item.get("id"), str) or not item["id"]:
        item = {"id": new_id(_ID_PREFIX.get(str(item.get("type")), "item")), **item}
    return item


def _references(raw: Any) -> bool:
    """Whether an ``input`` list holds an ``item_reference`` item."""
    return isinstance(raw, list) and any(
        isinstance(item, Mapping) and item.get("type") == "item_reference" for item in raw
    )


async def input_items(raw: Any, store: StateStore, owner: str) -> list[dict[str, Any]]:
    """The request's ``input`` as items with ids; ``item_reference`` items replaced by the stored item."""
    if isinstance(raw, str):
        return [
            {
                "id": new_id("msg"),
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": raw}],
            }
        ]
    items = check_array(raw, "input")
    out = []
    for i, item in enumerate(items):
        item = check_object(item, f"input[{i}]")
        if item.get("type") == "item_reference":
            ref = check_id(item.get("id"), f"input[{i}].id")
            if not store.enabled:
                raise RequestError(
                    f"input[{i}]: item_reference needs stored responses, and this server stores "
                    "nothing (--state-store none); send the item itself",
                    param=f"input[{i}].type",
                )
            found = await store.find_item(owner, ref)
            if found is None:
                raise not_stored("Item", ref, f"input[{i}].id")
            out.append(orjson.loads(found.data))
        else:
            if item.get("id") not in (None, ""):  # no id: one is given (normalize_item)
                check_id(item["id"], f"input[{i}].id")
            out.append(normalize_item(dict(item)))
    return out


async def resolve_stateful(
    body: Any, store: StateStore, owner: str, store_by_default: bool
) -> StatefulRequest:
    """Resolve ``body``'s stored state for ``owner``; see the module docstring.

    Raises ``RequestError`` (400) for state fields the server cannot honour (anything stateful
    under ``--state-store none``; ``background`` without ``store``; both ``previous_response_id``
    and ``conversation``) and :class:`~..stored.StoredObjectNotFoundError` (404) for a previous
    response, conversation or referenced item that is not stored for this owner."""
    body = dict(check_object(body, "body"))
    enabled = store.enabled
    stored_flag = check_boolean(body.pop("store", None), "store", default=None)
    background = bool(check_boolean(body.pop("background", None), "background", default=False))
    previous = check_id(body.pop("previous_response_id", None), "previous_response_id", default=None)
    conversation = body.pop("conversation", None)
    stateless = "this server is stateless (--state-store none): send the whole conversation in input"
    if not enabled:
        if stored_flag:
            raise RequestError(f"store: true is not supported; {stateless}", param="store")
        if previous is not None:
            raise RequestError(
                f"previous_response_id: not supported; {stateless}", param="previous_response_id"
            )
        if conversation is not None:
            raise RequestError(f"conversation: not supported; {stateless}", param="conversation")
        if background:
            raise RequestError(
                "background: true needs stored responses (--state-store none)", param="background"
            )
    store_it = enabled and (store_by_default if stored_flag is None else stored_flag)
    if background and not store_it:
        raise RequestError("background: true requires store: true", param="background")
    conversation_id = None
    if conversation is not None:
        if isinstance(conversation, Mapping):
            conversation_id = check_id(conversation.get("id"), "conversation.id")
        else:
            conversation_id = check_id(conversation, "conversation")
        if previous is not None:
            raise RequestError(
                "conversation: cannot be used together with previous_response_id", param="conversation"
            )
    if "input" not in body:
        raise RequestError("input: required", param="input")
    raw = body["input"]
    if not (store_it or previous or conversation_id) and not _references(raw):
        # nothing stored, nothing read: the body goes to the translation as the client sent it
        return StatefulRequest(body=body, owner=owner, background=background)
    new_items = await input_items(raw, store, owner)
    history: list[StoredItem] = []
    if previous is not None:
        try:
            chain = await store.history(owner, previous)
        except BrokenChainError as exc:
            raise not_stored("Response", exc.missing_id, "previous_response_id") from None
        if chain is None:
            raise not_stored("Previous response", previous, "previous_response_id")
        history = chain
    elif conversation_id is not None:
        items = await store.conversation_items(owner, conversation_id)
        if items is None:
            raise not_stored("Conversation", conversation_id, "conversation")
        history = items
    body["input"] = [orjson.loads(item.data) for item in history] + new_items
    return StatefulRequest(
        body=body,
        owner=owner,
        store=store_it,
        background=background,
        previous_response_id=previous,
        conversation_id=conversation_id,
        new_items=new_items,
    )


def stored_items(items: list[dict[str, Any]]) -> list[StoredItem]:
    return [StoredItem(str(item["id"]), orjson.dumps(item).decode()) for item in items]


def stored_output_items(response: Mapping[str, Any]) -> list[StoredItem]:
    """The output items of a response object, as stored."""
    return stored_items(list(response.get("output") or []))


async def save_response(
    store: StateStore, stateful: StatefulRequest, response: Mapping[str, Any], status: str | None = None
) -> None:
    """Store ``response`` (a response object) with the request's input items, and append the input
    and output items to its conversation. One transaction for the response; the conversation's
    append is a second one (a failure between them leaves a stored response outside its
    conversation, never a half-written one)."""
    outputs = stored_output_items(response)
    record = StoredResponse(
        id=str(response["id"]),
        owner=stateful.owner,
        created_at=float(response.get("created_at") or StateStore.now()),
        status=status or str(response.get("status")),
        body=orjson.dumps(response).decode(),
        request=orjson.dumps({"background": stateful.background}).decode(),
        previous_response_id=stateful.previous_response_id,
        conversation_id=stateful.conversation_id,
    )
    await store.put_response(record, stored_items(stateful.new_items), outputs)
    if stateful.conversation_id is not None and response.get("status") in ("completed", "incomplete"):
        await store.add_conversation_items(
            stateful.owner, stateful.conversation_id, stored_items(stateful.new_items) + outputs
        )
