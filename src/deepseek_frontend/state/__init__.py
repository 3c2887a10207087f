"""Conversation state: stored responses, conversations and kept reasoning, per owner; the files and
batches of the Batch APIs.

A layer of its own below ``api/``: the APIs build a store from their configuration
(:func:`store_for_url`) and call the async :class:`StateStore` interface; nothing here knows
about HTTP or request shapes. Stores: SQLite (default), PostgreSQL, none.
"""

from .batch_records import (
    ACTIVE_BATCH_STATUSES,
    FINAL_BATCH_STATUSES,
    BatchCounts,
    BatchLineRecord,
    ClaimedLine,
    LineResult,
    StoredBatch,
    StoredFile,
)
from .batch_store import BatchStore, StoreDisabledError
from .records import (
    ANONYMOUS_OWNER,
    FINAL_RESPONSE_STATUSES,
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
    "ACTIVE_BATCH_STATUSES",
    "ANONYMOUS_OWNER",
    "DEFAULT_DB_NAME",
    "FINAL_BATCH_STATUSES",
    "FINAL_RESPONSE_STATUSES",
    "MAX_PAGE",
    "BatchCounts",
    "BatchLineRecord",
    "BatchStore",
    "BrokenChainError",
    "ClaimedLine",
    "CursorError",
    "LineResult",
    "NullStore",
    "Page",
    "Retention",
    "StateStore",
    "StoreDisabledError",
    "StoredBatch",
    "StoredConversation",
    "StoredFile",
    "StoredItem",
    "StoredResponse",
    "default_state_dir",
    "new_id",
    "open_store_url",
    "owner_key",
    "purge_forever",
    "store_for_url",
]
