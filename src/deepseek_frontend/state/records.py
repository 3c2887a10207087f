"""What the conversation-state store keeps: plain records, ids and owner keys.

Nothing here does I/O. Items and response bodies are JSON text exactly as the API layer
serialised them: the store never parses or re-orders them, so an item read back renders the
same prompt bytes as the item that was written.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from deepseek_frontend._random_ids import random_hex

__all__ = [
    "ANONYMOUS_OWNER",
    "FINAL_RESPONSE_STATUSES",
    "ID_RANDOM_HEX",
    "ItemKind",
    "Order",
    "Page",
    "StoredConversation",
    "StoredItem",
    "StoredResponse",
    "new_id",
    "owner_key",
]

#: hex digits of randomness in an id (192 bits): ids are unguessable, never sequential
ID_RANDOM_HEX = 48
#: the owner of everything stored by a server that checks no API key
ANONYMOUS_OWNER = "anonymous"

#: the statuses after which a stored response never changes again: the store refuses every
#: transition out of them (``StateStore.update_response``)
FINAL_RESPONSE_STATUSES = frozenset({"completed", "incomplete", "failed", "cancelled"})

#: which list of a stored response an item belongs to
ItemKind = Literal["input", "output"]
#: the order of a list page
Order = Literal["asc", "desc"]


def new_id(prefix: str) -> str:
    """``<prefix>_<48 random hex>`` (``resp``, ``msg``, ``conv``, ``fc``, ``rs``...), as OpenAI's ids look."""
    return f"{prefix}_{random_hex(ID_RANDOM_HEX // 2)}"


def owner_key(api_key: str | bytes | None) -> str:
    """The owner of objects created with ``api_key``: a SHA-256 of the key (the key itself is never
    stored), or :data:`ANONYMOUS_OWNER` when the request presented none."""
    if not api_key:
        return ANONYMOUS_OWNER
    raw = api_key.encode() if isinstance(api_key, str) else api_key
    return "sha256:" + hashlib.sha256(b"deepseek-frontend-owner\0" + raw).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredItem:
    """One input or output item of a response, or one item of a conversation.

    ``data`` is the item's JSON text (with its ``id`` inside); ``item_id`` repeats that id so the
    store can find the item without parsing it."""

    item_id: str
    data: str


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A stored response: its response object (``body``, JSON text), the fields a continuation needs
    (``request``: JSON text of the request settings the API layer keeps) and bookkeeping.

    ``status`` repeats the body's status so that a background response can be polled and cancelled
    without parsing the body."""

    id: str
    owner: str
    created_at: float
    status: str
    body: str
    request: str = "{}"
    previous_response_id: str | None = None
    conversation_id: str | None = None
    #: when it was last written or renewed (``StateStore.touch_response``); None before schema 2
    updated_at: float | None = None


@dataclass(frozen=True, slots=True)
class StoredConversation:
    """A conversation: ``metadata`` is JSON text (an object of at most 16 string pairs, as OpenAI's)."""

    id: str
    owner: str
    created_at: float
    metadata: str = "{}"


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a list: items in the order asked for and whether more follow that page."""

    items: list[StoredItem] = field(default_factory=list)
    has_more: bool = False

    @property
    def first_id(self) -> str | None:
        return self.items[0].item_id if self.items else None

    @property
    def last_id(self) -> str | None:
        return self.items[-1].item_id if self.items else None
