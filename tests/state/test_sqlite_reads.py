"""On SQLite a read never waits behind a write: reads have connections and threads of their own.

Both tests hold a write open on purpose -- this process's own write transaction, and another
connection's write lock that this store's write is stuck behind -- and show a read finishing
while it is held. The bound on each read is a guard against a hang, not a timing: the write is
still held when the read returns (asserted), so the read did not wait for it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from deepseek_frontend.state import StateStore, StoredConversation, new_id, open_store_url, owner_key
from deepseek_frontend.state.sqlite import SqliteStore

OWNER = owner_key("reads")
#: seconds a read may take before the test calls it stuck (a hang guard; it takes milliseconds)
HANG_GUARD_S = 30.0


def test_a_read_completes_while_this_processs_write_transaction_is_held(tmp_path: Path) -> None:
    async def main() -> None:
        store = await open_store_url(f"sqlite:///{tmp_path}/s.sqlite3")
        try:
            assert isinstance(store, SqliteStore)
            conv = StoredConversation(new_id("conv"), OWNER, StateStore.now())
            await store.put_conversation(conv, [])
            async with store.transaction() as tx:  # the write lock of the file and of the store
                changed = '{"a":"b"}'
                await tx.execute("UPDATE conversations SET metadata = ? WHERE id = ?", (changed, conv.id))
                read = await asyncio.wait_for(store.get_conversation(OWNER, conv.id), HANG_GUARD_S)
                assert store._lock.locked()  # the write is still held
                assert read is not None and read.metadata == "{}"  # the last committed state
            after = await store.get_conversation(OWNER, conv.id)
            assert after is not None and after.metadata == '{"a":"b"}'
        finally:
            await store.close()

    asyncio.run(main())


def test_a_read_completes_while_a_write_waits_for_another_connections_lock(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"

    async def main() -> None:
        store = await open_store_url(f"sqlite:///{path}")
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            assert isinstance(store, SqliteStore)
            conv = StoredConversation(new_id("conv"), OWNER, StateStore.now())
            await store.put_conversation(conv, [])
            other.execute("BEGIN IMMEDIATE")  # another process's write, held
            blocked = StoredConversation(new_id("conv"), OWNER, 1.0)
            write = asyncio.create_task(store.put_conversation(blocked, []))
            while not store._lock.locked():  # the store's write has started and now waits for the lock
                await asyncio.sleep(0)
            read = await asyncio.wait_for(store.get_conversation(OWNER, conv.id), HANG_GUARD_S)
            assert read is not None
            assert not write.done()  # the read did not wait for the write, which still waits
            other.execute("ROLLBACK")
            await asyncio.wait_for(write, HANG_GUARD_S)
        finally:
            other.close()
            await store.close()

    asyncio.run(main())
