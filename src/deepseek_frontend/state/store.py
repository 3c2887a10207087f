"""The storage interface of conversation state, and the store that keeps nothing.

One small async interface (:class:`StateStore`) for everything the APIs keep: stored responses
with their input and output items, conversations with their items, and reasoning kept for
clients that drop it. Every object has an owner (:func:`~.records.owner_key`); every read,
list and delete names the owner, and an object of another owner is simply not there.

Implementations: :class:`~.sqlite.SqliteStore` (the default), :class:`~.postgres.PostgresStore`
(several frontend replicas), and :class:`NullStore` (``--state-store none``: stateless).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from .batch_store import BatchStore
from .records import ItemKind, Order, Page, StoredConversation, StoredItem, StoredResponse

__all__ = ["MAX_PAGE", "BrokenChainError", "CursorError", "NullStore", "Order", "Retention", "StateStore"]

#: the largest ``limit`` of one page (OpenAI's lists take 1-100)
MAX_PAGE = 100


class CursorError(ValueError):
    """An ``after`` / ``before`` cursor that names no item of the list being paged."""

    def __init__(self, param: str, item_id: str) -> None:
        super().__init__(f"{param}: no item {item_id!r} in this list")
        self.param = param
        self.item_id = item_id


class BrokenChainError(LookupError):
    """A response whose ``previous_response_id`` chain reaches a response no longer stored."""

    def __init__(self, missing_id: str) -> None:
        super().__init__(f"response {missing_id!r} of this chain is no longer stored")
        self.missing_id = missing_id


@dataclass(frozen=True, slots=True)
class Retention:
    """How long and how much the store keeps.

    ``ttl_s``: seconds an object lives after its creation (a conversation: after its last
    change); None keeps objects until deleted or evicted. ``max_bytes``: the size budget of the
    stored JSON, held by every write (the oldest objects are evicted to make room; one object over
    the whole budget is refused with ``StoreBudgetError``). ``purge_interval_s``: how often the
    background purge of expired objects runs."""

    ttl_s: float | None = 30 * 24 * 3600.0
    max_bytes: int | None = 1 << 30
    purge_interval_s: float = 60.0

    def expires_at(self, now: float) -> float | None:
        return None if self.ttl_s is None else now + self.ttl_s


class StateStore(BatchStore, ABC):
    """Conversation state, owned per API key. All methods are coroutines and never block the loop.

    Files and batches (:class:`~.batch_store.BatchStore`) are part of the same interface.

    Reads of an expired object find nothing, whether or not the purge has removed it yet."""

    #: ``sqlite``, ``postgresql`` or ``none``
    kind: str = ""
    #: False for :class:`NullStore`: the APIs refuse stateful features instead of storing
    enabled: bool = True

    def __init__(self, retention: Retention | None = None) -> None:
        self.retention = retention or Retention()

    @staticmethod
    def now() -> float:
        return time.time()

    async def open(self) -> None:  # a store without set-up is fine
        """Connect and bring the schema to the current version."""

    async def close(self) -> None:
        """Release connections and threads."""

    # ---------------------------------------------------------------- responses
    @abstractmethod
    async def put_response(
        self, response: StoredResponse, input_items: list[StoredItem], output_items: list[StoredItem]
    ) -> None:
        """Store a response with its items, all or nothing (one transaction)."""

    @abstractmethod
    async def update_response(
        self,
        owner: str,
        response_id: str,
        status: str,
        body: str,
        output_items: list[StoredItem] | None,
        *,
        renewed_before: float | None = None,
    ) -> bool:
        """Move a response that is still ``queued`` or ``in_progress`` to ``status`` with ``body``
        (and its output items when given), in one transaction; whether it moved. A final status
        (:data:`~.records.FINAL_RESPONSE_STATUSES`) is final in the store itself: a response that
        is not there or already final is left as it is (False), so of two transitions racing --
        a cancel and a completion, a lost lease and a resumed task -- exactly one is written, whole.
        ``renewed_before``: move it only when its lease was last renewed before that time (a lost
        task's response is marked failed only if the task did not renew it meanwhile)."""

    @abstractmethod
    async def touch_response(self, owner: str, response_id: str) -> bool:
        """Record that a queued or in-progress response is still being generated (its
        ``updated_at`` becomes now); False when it is not there or no longer running."""

    @abstractmethod
    async def get_response(self, owner: str, response_id: str) -> StoredResponse | None: ...

    @abstractmethod
    async def delete_response(self, owner: str, response_id: str) -> bool:
        """Delete a response and its items; False when it is not there."""

    @abstractmethod
    async def list_response_items(
        self,
        owner: str,
        response_id: str,
        kind: ItemKind,
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int = 20,
        order: Order = "desc",
    ) -> Page | None:
        """One page of a response's input (or output) items; None when the response is not there.
        Raises :class:`CursorError` for a cursor that is not in the list."""

    @abstractmethod
    async def history(self, owner: str, response_id: str) -> list[StoredItem] | None:
        """Every item of the chain ending at ``response_id`` -- each response's input items then its
        output items, oldest response first; None when the response is not there. Raises
        :class:`BrokenChainError` when an earlier response of the chain is gone."""

    @abstractmethod
    async def find_item(self, owner: str, item_id: str) -> StoredItem | None:
        """An item of any stored response or conversation of ``owner`` (``item_reference``)."""

    # ---------------------------------------------------------------- conversations
    @abstractmethod
    async def put_conversation(self, conversation: StoredConversation, items: list[StoredItem]) -> None: ...

    @abstractmethod
    async def get_conversation(self, owner: str, conversation_id: str) -> StoredConversation | None: ...

    @abstractmethod
    async def update_conversation(self, owner: str, conversation_id: str, metadata: str) -> bool: ...

    @abstractmethod
    async def delete_conversation(self, owner: str, conversation_id: str) -> bool: ...

    @abstractmethod
    async def add_conversation_items(self, owner: str, conversation_id: str, items: list[StoredItem]) -> bool:
        """Append items to a conversation; False when it is not there."""

    @abstractmethod
    async def conversation_items(self, owner: str, conversation_id: str) -> list[StoredItem] | None:
        """All items of a conversation, oldest first; None when it is not there."""

    @abstractmethod
    async def list_conversation_items(
        self,
        owner: str,
        conversation_id: str,
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int = 20,
        order: Order = "desc",
    ) -> Page | None: ...

    @abstractmethod
    async def get_conversation_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> StoredItem | None: ...

    @abstractmethod
    async def delete_conversation_item(self, owner: str, conversation_id: str, item_id: str) -> bool: ...

    # ---------------------------------------------------------------- reasoning continuity
    @abstractmethod
    async def put_reasoning(self, owner: str, key: str, text: str) -> None:
        """Keep the reasoning of an assistant turn under ``key`` (a fingerprint of what the client saw)."""

    @abstractmethod
    async def get_reasoning(self, owner: str, key: str) -> str | None: ...

    async def get_reasonings(self, owner: str, keys: list[str]) -> dict[str, str]:
        """The reasoning kept under each of ``keys`` that has some (one round trip where the store can)."""
        found = {}
        for key in keys:
            text = await self.get_reasoning(owner, key)
            if text is not None:
                found[key] = text
        return found

    # ---------------------------------------------------------------- retention
    @abstractmethod
    async def purge(self, now: float | None = None) -> int:
        """Delete expired objects, then the oldest ones past the size budget; the objects deleted."""

    @abstractmethod
    async def stored_bytes(self) -> int:
        """The JSON bytes stored (what the size budget counts)."""


class NullStore(StateStore):
    """``--state-store none``: nothing is kept, nothing is found."""

    kind = "none"
    enabled = False

    async def put_response(
        self, response: StoredResponse, input_items: list[StoredItem], output_items: list[StoredItem]
    ) -> None:
        return None

    async def update_response(
        self,
        owner: str,
        response_id: str,
        status: str,
        body: str,
        output_items: list[StoredItem] | None,
        *,
        renewed_before: float | None = None,
    ) -> bool:
        return False

    async def touch_response(self, owner: str, response_id: str) -> bool:
        return False

    async def get_response(self, owner: str, response_id: str) -> StoredResponse | None:
        return None

    async def delete_response(self, owner: str, response_id: str) -> bool:
        return False

    async def list_response_items(
        self, owner: str, response_id: str, kind: ItemKind, **_: object
    ) -> Page | None:
        return None

    async def history(self, owner: str, response_id: str) -> list[StoredItem] | None:
        return None

    async def find_item(self, owner: str, item_id: str) -> StoredItem | None:
        return None

    async def put_conversation(self, conversation: StoredConversation, items: list[StoredItem]) -> None:
        return None

    async def get_conversation(self, owner: str, conversation_id: str) -> StoredConversation | None:
        return None

    async def update_conversation(self, owner: str, conversation_id: str, metadata: str) -> bool:
        return False

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        return False

    async def add_conversation_items(self, owner: str, conversation_id: str, items: list[StoredItem]) -> bool:
        return False

    async def conversation_items(self, owner: str, conversation_id: str) -> list[StoredItem] | None:
        return None

    async def list_conversation_items(self, owner: str, conversation_id: str, **_: object) -> Page | None:
        return None

    async def get_conversation_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> StoredItem | None:
        return None

    async def delete_conversation_item(self, owner: str, conversation_id: str, item_id: str) -> bool:
        return False

    async def put_reasoning(self, owner: str, key: str, text: str) -> None:
        return None

    async def get_reasoning(self, owner: str, key: str) -> str | None:
        return None

    async def purge(self, now: float | None = None) -> int:
        return 0

    async def stored_bytes(self) -> int:
        return 0
