"""The size budget (``--state-max-bytes``) holds at every write, the accounting is exact, and the
SQLite file gives freed space back.

Tens of megabytes are written against a 200 KB budget: after every write the stored bytes are
within it (the write evicted the oldest objects itself, no purge ran) and equal the sum of the
objects' sizes; one object larger than the whole budget is refused. On SQLite the file's size is
measured: bounded while writing, and smaller once the objects are gone.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from deepseek_frontend.errors import StoreBudgetError
from deepseek_frontend.state import (
    Retention,
    StateStore,
    StoredConversation,
    StoredItem,
    StoredResponse,
    new_id,
    open_store_url,
    owner_key,
)
from deepseek_frontend.state.postgres import PostgresStore
from deepseek_frontend.state.sqlite import SqliteStore

from .conftest import run_with_store

OWNER = owner_key("budget")
BUDGET = 200_000
#: bytes of one written object (a response with one input item)
OBJECT = 20_000


def _response(size: int = OBJECT) -> tuple[StoredResponse, list[StoredItem]]:
    rid = new_id("resp")
    body = '{"id":"' + rid + '","status":"completed"}'
    item = StoredItem(new_id("msg"), '{"t":"' + "x" * (size - len(body) - 10) + '"}')
    return StoredResponse(rid, OWNER, StateStore.now(), "completed", body, "{}"), [item]


async def _summed(store: StateStore) -> int:
    """The stored bytes recounted from the objects themselves."""
    assert isinstance(store, SqliteStore | PostgresStore)
    async with store.transaction() as tx:
        rows = await tx.fetch(
            "SELECT (SELECT COALESCE(SUM(size), 0) FROM responses)"
            " + (SELECT COALESCE(SUM(size), 0) FROM conversations)"
            " + (SELECT COALESCE(SUM(size), 0) FROM reasoning)"
        )
    return int(rows[0][0])


def test_the_budget_holds_at_every_write_and_the_count_is_exact(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        written = 0
        for n in range(300):  # 6 MB against 200 KB
            if n % 3 == 2:
                conv = StoredConversation(new_id("conv"), OWNER, StateStore.now())
                item = StoredItem(new_id("msg"), '{"t":"' + "y" * OBJECT + '"}')
                await store.put_conversation(conv, [item])
            elif n % 3 == 1:
                await store.put_reasoning(OWNER, new_id("fp"), "z" * OBJECT)
            else:
                record, items = _response()
                await store.put_response(record, items, [])
            written += OBJECT
            stored = await store.stored_bytes()
            assert stored <= BUDGET
        assert written >= 30 * BUDGET
        assert await store.stored_bytes() == await _summed(store) > BUDGET - 2 * OBJECT

    run_with_store(store_url, body, Retention(ttl_s=None, max_bytes=BUDGET))


def test_one_object_over_the_whole_budget_is_refused(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        kept, items = _response()
        await store.put_response(kept, items, [])
        record, items = _response(BUDGET + 1)
        with pytest.raises(StoreBudgetError) as err:
            await store.put_response(record, items, [])
        assert err.value.status_code == 413 and str(BUDGET) in err.value.message
        conv = StoredConversation(new_id("conv"), OWNER, StateStore.now())
        await store.put_conversation(conv, [])
        with pytest.raises(StoreBudgetError):
            await store.add_conversation_items(OWNER, conv.id, [StoredItem("m", "x" * (BUDGET + 1))])
        # nothing was stored, nothing was evicted for it
        assert await store.get_response(OWNER, record.id) is None
        assert await store.get_response(OWNER, kept.id) is not None
        assert await store.conversation_items(OWNER, conv.id) == []
        assert await store.stored_bytes() == await _summed(store)

    run_with_store(store_url, body, Retention(ttl_s=None, max_bytes=BUDGET))


def test_concurrent_writers_of_two_replicas_keep_the_count_exact(postgres_url: str) -> None:
    """Eight writers on two replicas at once. The count is exact whatever the interleaving; each
    write holds the budget as it sees it (the committed objects and its own), so writes in flight
    together may pass it by their own objects, until the next write evicts them."""
    writers = 8

    async def main() -> None:
        retention = Retention(ttl_s=None, max_bytes=BUDGET)
        stores = [await open_store_url(postgres_url, retention) for _ in range(2)]
        try:
            highest = 0

            async def writer(store: StateStore, n: int) -> None:
                nonlocal highest
                for _ in range(n):
                    record, items = _response()
                    await store.put_response(record, items, [])
                    highest = max(highest, await store.stored_bytes())

            await asyncio.gather(*(writer(stores[i % 2], 25) for i in range(writers)))
            assert await stores[0].stored_bytes() == await _summed(stores[0])
            assert highest <= BUDGET + writers * OBJECT
            record, items = _response()
            await stores[1].put_response(record, items, [])  # alone: the budget holds again
            assert await stores[0].stored_bytes() == await _summed(stores[0]) <= BUDGET
        finally:
            for store in stores:
                await store.close()

    asyncio.run(asyncio.wait_for(main(), 120))


def _file_bytes(path: Path) -> int:
    return sum(os.path.getsize(p) for p in (path, Path(f"{path}-wal")) if p.exists())


def test_the_sqlite_file_stays_bounded_and_shrinks_once_objects_go(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    budget = 2_000_000  # a freed megabyte or more is given back (VACUUM_PAGES)

    async def main() -> tuple[int, int, int]:
        store = await open_store_url(f"sqlite:///{path}", Retention(ttl_s=None, max_bytes=budget))
        try:
            largest = 0
            for _ in range(1250):  # 25 MB written against 2 MB
                record, items = _response()
                await store.put_response(record, items, [])
                largest = max(largest, _file_bytes(path))
            assert isinstance(store, SqliteStore)
            conn = store._conn
            assert conn is not None
            await store._run(lambda: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
            full = os.path.getsize(path)
            async with store.transaction() as tx:  # everything goes
                ids = [row[0] for row in await tx.fetch("SELECT id FROM responses")]
            for rid in ids:
                await store.delete_response(OWNER, rid)
            await store.put_response(*_response(), [])  # a write after the deletes gives the space back
            await store._run(lambda: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
            return largest, full, os.path.getsize(path)
        finally:
            await store.close()

    largest, full, emptied = asyncio.run(asyncio.wait_for(main(), 120))
    print(f"sqlite file: at most {largest} B (db + WAL) writing 25 MB; {full} B full -> {emptied} B emptied")
    assert largest < 12 * 1024 * 1024  # the WAL's pages are reused once checkpointed; no 25 MB file
    assert full < 3 * 1024 * 1024
    assert emptied < full / 2
