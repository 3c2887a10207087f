"""The store's logic, once, over a tiny transaction interface both databases provide.

:class:`SqlStore` implements :class:`~.store.StateStore` with SQL written for the common subset
of SQLite and PostgreSQL, ``?`` placeholders (the PostgreSQL transaction rewrites them). A
subclass supplies :meth:`SqlStore.transaction`: an async context manager yielding a
:class:`Tx`, committed when the block ends and rolled back when it raises.
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, TypeVar

from deepseek_frontend.errors import StoreBudgetError

from .batch_sql import BatchSql
from .migrations import MIGRATIONS, SCHEMA_VERSION, statements_for
from .records import FINAL_RESPONSE_STATUSES, ItemKind, Page, StoredConversation, StoredItem, StoredResponse
from .store import MAX_PAGE, BrokenChainError, CursorError, Order, StateStore
from .tx import Tx

__all__ = ["SchemaTooNewError", "SqlStore", "Tx"]

#: objects looked at per table and round of the size-budget eviction
_EVICT_BATCH = 64
#: rounds of eviction one write may run before it leaves the rest to the next write or the purge
_EVICT_ROUNDS = 64
#: the statuses a stored response may still leave (the others are final)
_RUNNING = "status NOT IN (" + ", ".join(f"'{s}'" for s in sorted(FINAL_RESPONSE_STATUSES)) + ")"
_ALIVE = "(expires_at IS NULL OR expires_at > ?)"
#: a stored response's columns in :class:`StoredResponse`'s field order
_RESPONSE_COLUMNS = (
    "id, owner, created_at, status, body, request, previous_response_id, conversation_id, updated_at"
)
#: the tables of objects that own items
_ObjectTable = Literal["responses", "conversations"]
#: an object table -> (its items' table, the items' column holding the object's id)
_ITEM_TABLES: dict[_ObjectTable, tuple[str, str]] = {
    "responses": ("response_items", "response_id"),
    "conversations": ("conversation_items", "conversation_id"),
}
T = TypeVar("T")


class SchemaTooNewError(RuntimeError):
    """The database was migrated by a newer version of this program."""


def _items_size(items: Sequence[StoredItem]) -> int:
    return sum(len(item.data) for item in items)


#: an object the budget must not evict to make room for itself: (table, id, owner)
_Keep = tuple[str, str, str] | None


class SqlStore(BatchSql, StateStore):
    """:class:`StateStore` over SQL; see the module docstring. Files and batches: :class:`BatchSql`."""

    @abstractmethod
    def transaction(self) -> contextlib.AbstractAsyncContextManager[Tx]: ...

    async def in_transaction(self, op: Callable[[Tx], Awaitable[T]], readonly: bool = False) -> T:
        """Run ``op`` in one transaction (committed when it returns, rolled back when it raises).
        Every operation of the store goes through here; a backend may run ``op`` in one piece
        (SQLite: on its thread, in one hand-over). ``readonly``: ``op`` only reads, so a backend
        may skip the write lock (SQLite) or the BEGIN / COMMIT round trips (PostgreSQL, whose
        READ COMMITTED gives each statement its own snapshot inside a transaction anyway)."""
        async with self.transaction() as tx:
            return await op(tx)

    # ---------------------------------------------------------------- schema
    async def migrate(self, tx: Tx) -> int:
        """Apply the missing migrations in ``tx`` (which holds the write lock); the version reached."""
        await tx.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        rows = await tx.fetch("SELECT version FROM schema_version")
        version = rows[0][0] if rows else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(
                f"the state store is at schema version {version}; this program knows up to {SCHEMA_VERSION}"
            )
        for migration in MIGRATIONS[version:]:
            for statement in statements_for(migration, self.kind):
                await tx.execute(statement)
        if not rows:
            await tx.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        else:
            # written even when current: a store that cannot be written (a read-only file or
            # database) fails here, at start-up, not at its first request
            await tx.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))
        return SCHEMA_VERSION

    # ---------------------------------------------------------------- the size budget
    def _refuse_over_budget(self, what: str, size: int) -> None:
        """Raise :class:`StoreBudgetError` when one object of ``size`` is over the whole budget."""
        budget = self.retention.max_bytes
        if budget is not None and size > budget:
            raise StoreBudgetError(
                f"{what} takes {size} bytes, more than the state store's whole budget of {budget} bytes"
                " (--state-max-bytes); it cannot be stored (send it with store: false)"
            )

    async def _hold_budget(self, tx: Tx, keep: _Keep) -> None:
        """In the writing transaction ``tx``, after its writes: evict the oldest objects (never
        ``keep``, the one just written) while the stored bytes exceed the budget."""
        budget = self.retention.max_bytes
        if budget is None:
            return
        for _ in range(_EVICT_ROUNDS):
            excess = await _stored_bytes(tx) - budget
            if excess <= 0 or not await self._evict_oldest(tx, excess, keep):
                return

    async def _evict_oldest(self, tx: Tx, excess: int, keep: _Keep) -> int:
        """Delete the oldest objects (responses, conversations, kept reasoning by creation time)
        until ``excess`` bytes are gone or a round's candidates are; the objects deleted."""
        candidates: list[tuple[float, str, str, int, str]] = []
        for table, key in (("responses", "id"), ("conversations", "id"), ("reasoning", "fingerprint")):
            rows = await tx.fetch(
                f"SELECT created_at, {key}, size, owner FROM {table} ORDER BY created_at LIMIT ?",
                (_EVICT_BATCH,),
            )
            candidates += [(float(r[0]), table, r[1], int(r[2]), r[3]) for r in rows]
        candidates.sort(key=lambda c: c[0])
        deleted = 0
        for _created, table, object_id, size, owner in candidates:
            if keep is not None and (table, object_id, owner) == keep:
                continue
            if table == "reasoning":
                gone = await tx.execute(
                    "DELETE FROM reasoning WHERE owner = ? AND fingerprint = ?", (owner, object_id)
                )
            else:
                gone = await self._delete_object(tx, table, owner, object_id)  # type: ignore[arg-type]
            if gone:  # another replica may have evicted it first
                deleted += 1
                excess -= size
                if excess <= 0:
                    break
        return deleted

    # ---------------------------------------------------------------- responses
    async def put_response(
        self, response: StoredResponse, input_items: list[StoredItem], output_items: list[StoredItem]
    ) -> None:
        size = len(response.body) + len(response.request)
        size += _items_size(input_items) + _items_size(output_items)
        self._refuse_over_budget("the response", size)

        async def op(tx: Tx) -> Any:
            await tx.execute(
                "INSERT INTO responses (id, owner, created_at, expires_at, status, body, request,"
                " previous_response_id, conversation_id, size, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    response.id,
                    response.owner,
                    float(response.created_at),
                    self.retention.expires_at(response.created_at),
                    response.status,
                    response.body,
                    response.request,
                    response.previous_response_id,
                    response.conversation_id,
                    size,
                    self.now(),
                ),
            )
            await self._insert_response_items(tx, response.owner, response.id, "input", input_items)
            await self._insert_response_items(tx, response.owner, response.id, "output", output_items)
            await self._hold_budget(tx, ("responses", response.id, response.owner))

        return await self.in_transaction(op)

    async def _insert_response_items(
        self, tx: Tx, owner: str, response_id: str, kind: ItemKind, items: Sequence[StoredItem]
    ) -> None:
        if items:
            await tx.executemany(
                "INSERT INTO response_items (response_id, kind, seq, item_id, owner, data)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                [(response_id, kind, i, item.item_id, owner, item.data) for i, item in enumerate(items)],
            )

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
        async def op(tx: Tx) -> Any:
            now = self.now()
            where = f"id = ? AND owner = ? AND {_RUNNING} AND {_ALIVE}"
            args: list[Any] = [status, body, now, response_id, owner, now]
            if renewed_before is not None:
                where += " AND updated_at < ?"
                args.append(renewed_before)
            # one conditional statement decides the transition: on PostgreSQL a concurrent one waits
            # for this row's lock and then finds the status final (READ COMMITTED re-reads the row)
            if not await tx.execute(
                f"UPDATE responses SET status = ?, body = ?, updated_at = ? WHERE {where}", args
            ):
                return False
            if output_items is not None:
                await tx.execute(
                    "DELETE FROM response_items WHERE response_id = ? AND kind = 'output'", (response_id,)
                )
                await self._insert_response_items(tx, owner, response_id, "output", output_items)
            rows = await tx.fetch(
                "SELECT (SELECT LENGTH(request) FROM responses WHERE id = ?),"
                " (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM response_items WHERE response_id = ?)",
                (response_id, response_id),
            )
            size = len(body) + int(rows[0][0]) + int(rows[0][1])
            self._refuse_over_budget("the response", size)
            await tx.execute("UPDATE responses SET size = ? WHERE id = ?", (size, response_id))
            await self._hold_budget(tx, ("responses", response_id, owner))
            return True

        return await self.in_transaction(op)

    async def get_response(self, owner: str, response_id: str) -> StoredResponse | None:
        async def op(tx: Tx) -> Any:
            row = await self._live_row(tx, "responses", _RESPONSE_COLUMNS, owner, response_id)
            return StoredResponse(*row) if row is not None else None

        return await self.in_transaction(op, readonly=True)

    async def touch_response(self, owner: str, response_id: str) -> bool:
        async def op(tx: Tx) -> Any:
            changed = await tx.execute(
                f"UPDATE responses SET updated_at = ? WHERE id = ? AND owner = ? AND {_RUNNING}",
                (self.now(), response_id, owner),
            )
            return bool(changed)

        return await self.in_transaction(op)

    async def delete_response(self, owner: str, response_id: str) -> bool:
        return await self.in_transaction(lambda tx: self._delete_object(tx, "responses", owner, response_id))

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
        async def op(tx: Tx) -> Any:
            if await self._live_row(tx, "responses", "1", owner, response_id) is None:
                return None
            return await _page(
                tx,
                "response_items",
                "response_id = ? AND kind = ?",
                (response_id, kind),
                after,
                before,
                limit,
                order,
            )

        return await self.in_transaction(op, readonly=True)

    async def history(self, owner: str, response_id: str) -> list[StoredItem] | None:
        async def op(tx: Tx) -> Any:
            chain = await tx.fetch(
                "WITH RECURSIVE chain (id, prev, depth) AS ("
                f" SELECT id, previous_response_id, 0 FROM responses WHERE id = ? AND owner = ? AND {_ALIVE}"
                " UNION ALL"
                " SELECT r.id, r.previous_response_id, c.depth + 1"
                " FROM responses r JOIN chain c ON r.id = c.prev"
                " WHERE r.owner = ? AND (r.expires_at IS NULL OR r.expires_at > ?)"
                ") SELECT id, prev, depth FROM chain ORDER BY depth DESC",
                (response_id, owner, self.now(), owner, self.now()),
            )
            if not chain:
                return None
            if chain[0][1] is not None:  # the oldest response reached still names a previous one
                raise BrokenChainError(chain[0][1])
            ids = [row[0] for row in chain]
            marks = ", ".join("?" for _ in ids)
            rows = await tx.fetch(
                "SELECT response_id, kind, seq, item_id, data FROM response_items"
                f" WHERE response_id IN ({marks})",
                ids,
            )
            depth = {rid: i for i, rid in enumerate(ids)}  # oldest first
            rows.sort(key=lambda r: (depth[r[0]], r[1] != "input", r[2]))
            return [StoredItem(r[3], r[4]) for r in rows]

        return await self.in_transaction(op, readonly=True)

    async def find_item(self, owner: str, item_id: str) -> StoredItem | None:
        now = self.now()

        async def op(tx: Tx) -> Any:
            rows = await tx.fetch(
                "SELECT i.item_id, i.data FROM response_items i JOIN responses r ON r.id = i.response_id"
                " WHERE i.owner = ? AND i.item_id = ? AND (r.expires_at IS NULL OR r.expires_at > ?)"
                " ORDER BY r.created_at DESC LIMIT 1",
                (owner, item_id, now),
            )
            if not rows:
                rows = await tx.fetch(
                    "SELECT i.item_id, i.data FROM conversation_items i JOIN conversations c"
                    " ON c.id = i.conversation_id WHERE i.owner = ? AND i.item_id = ?"
                    " AND (c.expires_at IS NULL OR c.expires_at > ?) LIMIT 1",
                    (owner, item_id, now),
                )
            return StoredItem(*rows[0]) if rows else None

        return await self.in_transaction(op, readonly=True)

    # ---------------------------------------------------------------- conversations
    async def put_conversation(self, conversation: StoredConversation, items: list[StoredItem]) -> None:
        c = conversation
        self._refuse_over_budget("the conversation", len(c.metadata) + _items_size(items))

        async def op(tx: Tx) -> Any:
            await tx.execute(
                "INSERT INTO conversations (id, owner, created_at, expires_at, metadata, size)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (
                    c.id,
                    c.owner,
                    float(c.created_at),
                    self.retention.expires_at(c.created_at),
                    c.metadata,
                    len(c.metadata) + _items_size(items),
                ),
            )
            await self._insert_conversation_items(tx, c.owner, c.id, 0, items)
            await self._hold_budget(tx, ("conversations", c.id, c.owner))

        return await self.in_transaction(op)

    async def _insert_conversation_items(
        self, tx: Tx, owner: str, conversation_id: str, first: int, items: Sequence[StoredItem]
    ) -> None:
        if items:
            await tx.executemany(
                "INSERT INTO conversation_items (conversation_id, seq, item_id, owner, data)"
                " VALUES (?, ?, ?, ?, ?)",
                [
                    (conversation_id, first + i, item.item_id, owner, item.data)
                    for i, item in enumerate(items)
                ],
            )

    async def get_conversation(self, owner: str, conversation_id: str) -> StoredConversation | None:
        async def op(tx: Tx) -> Any:
            row = await self._live_row(
                tx, "conversations", "id, owner, created_at, metadata", owner, conversation_id
            )
            return StoredConversation(*row) if row is not None else None

        return await self.in_transaction(op, readonly=True)

    async def update_conversation(self, owner: str, conversation_id: str, metadata: str) -> bool:
        async def op(tx: Tx) -> Any:
            # the size change from the row as it is when locked (SET reads the old metadata)
            changed = await tx.execute(
                "UPDATE conversations SET size = size - LENGTH(metadata) + ?, metadata = ?"
                f" WHERE id = ? AND owner = ? AND {_ALIVE}",
                (len(metadata), metadata, conversation_id, owner, self.now()),
            )
            if not changed:
                return False
            await self._refuse_conversation_over_budget(tx, conversation_id)
            await self._hold_budget(tx, ("conversations", conversation_id, owner))
            return True

        return await self.in_transaction(op)

    async def _refuse_conversation_over_budget(self, tx: Tx, conversation_id: str) -> None:
        if self.retention.max_bytes is not None:
            rows = await tx.fetch("SELECT size FROM conversations WHERE id = ?", (conversation_id,))
            self._refuse_over_budget("the conversation", int(rows[0][0]))

    async def delete_conversation(self, owner: str, conversation_id: str) -> bool:
        return await self.in_transaction(
            lambda tx: self._delete_object(tx, "conversations", owner, conversation_id)
        )

    async def _delete_object(self, tx: Tx, table: _ObjectTable, owner: str, object_id: str) -> bool:
        """Delete ``object_id`` of ``table`` and its items when ``owner`` owns it, expired or not;
        False when there is no such object."""
        items, key = _ITEM_TABLES[table]
        changed = await tx.execute(f"DELETE FROM {table} WHERE id = ? AND owner = ?", (object_id, owner))
        if changed:
            await tx.execute(f"DELETE FROM {items} WHERE {key} = ?", (object_id,))
        return bool(changed)

    async def add_conversation_items(self, owner: str, conversation_id: str, items: list[StoredItem]) -> bool:
        now = self.now()

        async def op(tx: Tx) -> Any:
            # the UPDATE first: on PostgreSQL it locks the conversation's row, so concurrent appends
            # take their sequence numbers one after the other
            changed = await tx.execute(
                "UPDATE conversations SET size = size + ?, expires_at = ?"
                f" WHERE id = ? AND owner = ? AND {_ALIVE}",
                (_items_size(items), self.retention.expires_at(now), conversation_id, owner, now),
            )
            if not changed:
                return False
            rows = await tx.fetch(
                "SELECT COALESCE(MAX(seq), -1) FROM conversation_items WHERE conversation_id = ?",
                (conversation_id,),
            )
            await self._insert_conversation_items(tx, owner, conversation_id, int(rows[0][0]) + 1, items)
            await self._refuse_conversation_over_budget(tx, conversation_id)
            await self._hold_budget(tx, ("conversations", conversation_id, owner))
            return True

        return await self.in_transaction(op)

    async def conversation_items(self, owner: str, conversation_id: str) -> list[StoredItem] | None:
        async def op(tx: Tx) -> Any:
            if not await self._conversation_alive(tx, owner, conversation_id):
                return None
            rows = await tx.fetch(
                "SELECT item_id, data FROM conversation_items WHERE conversation_id = ? ORDER BY seq",
                (conversation_id,),
            )
            return [StoredItem(*row) for row in rows]

        return await self.in_transaction(op, readonly=True)

    async def _conversation_alive(self, tx: Tx, owner: str, conversation_id: str) -> bool:
        return await self._live_row(tx, "conversations", "1", owner, conversation_id) is not None

    async def _live_row(
        self, tx: Tx, table: _ObjectTable, columns: str, owner: str, object_id: str
    ) -> Any | None:
        """``columns`` of ``object_id`` in ``table`` when ``owner`` owns it and it has not expired, else
        None: the one place the store's visibility rule (owner and retention) is written for a read."""
        rows = await tx.fetch(
            f"SELECT {columns} FROM {table} WHERE id = ? AND owner = ? AND {_ALIVE}",
            (object_id, owner, self.now()),
        )
        return rows[0] if rows else None

    async def list_conversation_items(
        self,
        owner: str,
        conversation_id: str,
        *,
        after: str | None = None,
        before: str | None = None,
        limit: int = 20,
        order: Order = "desc",
    ) -> Page | None:
        async def op(tx: Tx) -> Any:
            if not await self._conversation_alive(tx, owner, conversation_id):
                return None
            return await _page(
                tx,
                "conversation_items",
                "conversation_id = ?",
                (conversation_id,),
                after,
                before,
                limit,
                order,
            )

        return await self.in_transaction(op, readonly=True)

    async def get_conversation_item(
        self, owner: str, conversation_id: str, item_id: str
    ) -> StoredItem | None:
        async def op(tx: Tx) -> Any:
            if not await self._conversation_alive(tx, owner, conversation_id):
                return None
            rows = await tx.fetch(
                "SELECT item_id, data FROM conversation_items WHERE conversation_id = ? AND item_id = ?"
                " ORDER BY seq LIMIT 1",
                (conversation_id, item_id),
            )
            return StoredItem(*rows[0]) if rows else None

        return await self.in_transaction(op, readonly=True)

    async def delete_conversation_item(self, owner: str, conversation_id: str, item_id: str) -> bool:
        async def op(tx: Tx) -> Any:
            if not await self._conversation_alive(tx, owner, conversation_id):
                return False
            rows = await tx.fetch(
                "SELECT seq, LENGTH(data) FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                (conversation_id, item_id),
            )
            if not rows:
                return False
            await tx.execute(
                "DELETE FROM conversation_items WHERE conversation_id = ? AND item_id = ?",
                (conversation_id, item_id),
            )
            await tx.execute(
                "UPDATE conversations SET size = size - ? WHERE id = ?",
                (sum(int(r[1]) for r in rows), conversation_id),
            )
            return True

        return await self.in_transaction(op)

    # ---------------------------------------------------------------- reasoning continuity
    async def put_reasoning(self, owner: str, key: str, text: str) -> None:
        now = self.now()
        self._refuse_over_budget("the kept reasoning", len(text) + len(key))

        async def op(tx: Tx) -> Any:
            await tx.execute(
                "INSERT INTO reasoning (owner, fingerprint, text, created_at, expires_at, size)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (owner, fingerprint) DO UPDATE SET"
                " text = excluded.text, created_at = excluded.created_at, expires_at = excluded.expires_at,"
                " size = excluded.size",
                (owner, key, text, now, self.retention.expires_at(now), len(text) + len(key)),
            )
            await self._hold_budget(tx, ("reasoning", key, owner))

        return await self.in_transaction(op)

    async def get_reasoning(self, owner: str, key: str) -> str | None:
        async def op(tx: Tx) -> Any:
            rows = await tx.fetch(
                f"SELECT text FROM reasoning WHERE owner = ? AND fingerprint = ? AND {_ALIVE}",
                (owner, key, self.now()),
            )
            return rows[0][0] if rows else None

        return await self.in_transaction(op, readonly=True)

    async def get_reasonings(self, owner: str, keys: list[str]) -> dict[str, str]:
        if not keys:
            return {}
        marks = ", ".join("?" for _ in keys)

        async def op(tx: Tx) -> dict[str, str]:
            rows = await tx.fetch(
                f"SELECT fingerprint, text FROM reasoning WHERE owner = ? AND fingerprint IN ({marks})"
                f" AND {_ALIVE}",
                (owner, *keys, self.now()),
            )
            return {row[0]: row[1] for row in rows}

        return await self.in_transaction(op, readonly=True)

    # ---------------------------------------------------------------- retention
    async def purge(self, now: float | None = None) -> int:
        at = self.now() if now is None else now

        async def expired(tx: Tx) -> int:
            deleted = 0
            for table, (items, key) in _ITEM_TABLES.items():
                await tx.execute(
                    f"DELETE FROM {items} WHERE {key} IN"
                    f" (SELECT id FROM {table} WHERE expires_at IS NOT NULL AND expires_at <= ?)",
                    (at,),
                )
                deleted += await tx.execute(
                    f"DELETE FROM {table} WHERE expires_at IS NOT NULL AND expires_at <= ?", (at,)
                )
            deleted += await tx.execute(
                "DELETE FROM reasoning WHERE expires_at IS NOT NULL AND expires_at <= ?", (at,)
            )
            deleted += await self.purge_batches(tx, at)
            return deleted

        deleted = await self.in_transaction(expired)
        budget = self.retention.max_bytes
        if budget is not None:
            while True:  # a batch of the oldest objects per transaction, until the budget holds
                evicted = await self.in_transaction(lambda tx: self._evict_batch(tx, budget))
                if evicted is None:
                    break
                deleted += evicted
        return deleted

    async def _evict_batch(self, tx: Tx, budget: int) -> int | None:
        """Delete a round of the oldest objects while the stored bytes exceed ``budget``; the
        objects deleted, or None when the budget holds (or nothing is left)."""
        excess = await _stored_bytes(tx) - budget
        if excess <= 0:
            return None
        return await self._evict_oldest(tx, excess, None) or None

    async def stored_bytes(self) -> int:
        async def op(tx: Tx) -> Any:
            return await _stored_bytes(tx)

        return await self.in_transaction(op, readonly=True)


async def _stored_bytes(tx: Tx) -> int:
    """The stored bytes the budget counts: the sum of ``store_usage``, which the database's own
    triggers keep (state/migrations.py, version 4)."""
    rows = await tx.fetch("SELECT COALESCE(SUM(bytes), 0) FROM store_usage")
    return int(rows[0][0])


async def _page(
    tx: Tx,
    table: str,
    where: str,
    args: tuple[Any, ...],
    after: str | None,
    before: str | None,
    limit: int,
    order: Order,
) -> Page:
    """One page of ``table``'s rows matching ``where``, by ``seq`` in ``order``, strictly after the
    ``after`` item and strictly before the ``before`` item (in that order)."""
    limit = max(1, min(limit, MAX_PAGE))
    bounds: list[str] = []
    bound_args: list[Any] = []
    for param, item_id, forward in (("after", after, True), ("before", before, False)):
        if item_id is None:
            continue
        rows = await tx.fetch(f"SELECT seq FROM {table} WHERE {where} AND item_id = ?", (*args, item_id))
        if not rows:
            raise CursorError(param, item_id)
        # "after" in ascending order is a larger seq; in descending order a smaller one
        bounds.append("seq > ?" if forward == (order == "asc") else "seq < ?")
        bound_args.append(rows[0][0])
    clause = " AND ".join([where, *bounds])
    direction = "ASC" if order == "asc" else "DESC"
    rows = await tx.fetch(
        f"SELECT item_id, data FROM {table} WHERE {clause} ORDER BY seq {direction} LIMIT ?",
        (*args, *bound_args, limit + 1),
    )
    return Page([StoredItem(*row) for row in rows[:limit]], has_more=len(rows) > limit)
