"""Conversation state: stored responses, conversations and kept reasoning, per owner.

A layer of its own below ``api/``: the APIs build a store from their configuration
(:func:`store_for_url`) and call the async :class:`StateStore` interface; nothing here knows
about HTTP or request shapes. Stores: SQLite (default), PostgreSQL, none.
"""

from .records import (
    ANONYMOUS_OWNER,
    Page,
    StoredConversation,
    StoredItem,
    StoredResponse,
    new_id,
    owner_key,
)
from .retention import purge_forever
from .store import MAX_PAGE, BrokenChainError, CursorError, NullStore, Retention, StateStore
from .url import DEFAULT_DB_NAME, default_state_dir, open_store_url, store_for_url

__all__ = [
    "ANONYMOUS_OWNER",
    "DEFAULT_DB_NAME",
    "MAX_PAGE",
    "BrokenChainError",
    "CursorError",
    "NullStore",
    "Page",
    "Retention",
    "StateStore",
    "StoredConversation",
    "StoredItem",
    "StoredResponse",
    "default_state_dir",
    "new_id",
    "open_store_url",
    "owner_key",
    "purge_forever",
    "store_for_url",
]
