"""What is particular to each backend: URLs, schema versions, WAL, the SQLite thread, crash safety."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from deepseek_frontend.state import (
    NullStore,
    StateStore,
    StoredConversation,
    StoredItem,
    new_id,
    open_store_url,
    owner_key,
    store_for_url,
)
from deepseek_frontend.state.migrations import SCHEMA_VERSION
from deepseek_frontend.state.postgres import PostgresStore, to_dollar_params
from deepseek_frontend.state.sql import SchemaTooNewError
from deepseek_frontend.state.sqlite import SqliteStore
from deepseek_frontend.state.url import default_state_dir

from .conftest import run_with_store

OWNER = owner_key("k")


def test_urls_are_spelled_as_sqlalchemy_spells_them(tmp_path: Path) -> None:
    relative = store_for_url("sqlite:///state/db.sqlite3")
    assert isinstance(relative, SqliteStore) and relative.path == Path("state/db.sqlite3")
    absolute = store_for_url("sqlite:////var/lib/dsfe/db.sqlite3")
    assert isinstance(absolute, SqliteStore) and absolute.path == Path("/var/lib/dsfe/db.sqlite3")
    pg = store_for_url("postgresql://u:p@db:5432/state")
    assert isinstance(pg, PostgresStore) and pg.dsn == "postgresql://u:p@db:5432/state"
    assert isinstance(store_for_url("postgresql+asyncpg://db/state"), PostgresStore)
    none = store_for_url("none")
    assert isinstance(none, NullStore) and not none.enabled
    for bad in ("sqlite://db.sqlite3", "mysql://db/x", "state.db", "sqlite:///"):
        with pytest.raises(ValueError, match="--state-store"):
            store_for_url(bad)
    assert default_state_dir({"XDG_STATE_HOME": "/x"}) == Path("/x/deepseek-frontend")
    assert default_state_dir({"HOME": "/home/u"}) == Path("/home/u/.local/state/deepseek-frontend")


def test_dollar_params() -> None:
    assert to_dollar_params("SELECT ? + ?, ?") == "SELECT $1 + $2, $3"


def test_schema_version_is_recorded_and_migrations_run_once(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        conv = StoredConversation(new_id("conv"), OWNER, StateStore.now())
        await store.put_conversation(conv, [])
        assert isinstance(store, SqliteStore | PostgresStore)
        async with store.transaction() as tx:
            assert await tx.fetch("SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]
        return conv.id

    conv_id = run_with_store(store_url, body)

    async def reopened(store: StateStore) -> None:
        # reopening keeps the data (no migration ran again) and the single version row
        assert await store.get_conversation(OWNER, conv_id) is not None
        assert isinstance(store, SqliteStore | PostgresStore)
        async with store.transaction() as tx:
            assert await tx.fetch("SELECT COUNT(*) FROM schema_version") == [(1,)]
            await tx.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))

    run_with_store(store_url, reopened)
    with pytest.raises(SchemaTooNewError, match=f"schema version {SCHEMA_VERSION + 1}"):
        run_with_store(store_url, reopened)


def test_replicas_opening_together_migrate_once(postgres_url: str) -> None:
    async def main() -> None:
        stores = [store_for_url(postgres_url) for _ in range(4)]
        await asyncio.gather(*(s.open() for s in stores))
        try:
            conv = StoredConversation(new_id("conv"), OWNER, StateStore.now())
            await stores[0].put_conversation(conv, [])
            assert await stores[3].get_conversation(OWNER, conv.id) is not None
        finally:
            await asyncio.gather(*(s.close() for s in stores))

    asyncio.run(asyncio.wait_for(main(), 120))


def test_sqlite_runs_in_wal_mode_off_the_event_loop_thread(tmp_path: Path) -> None:
    threads: set[int] = set()

    async def body(store: StateStore) -> None:
        assert isinstance(store, SqliteStore) and store._conn is not None
        conn = store._conn
        await store._run(lambda: conn.set_trace_callback(lambda _sql: threads.add(threading.get_ident())))
        loop_thread = threading.get_ident()
        await store.put_conversation(StoredConversation(new_id("conv"), OWNER, StateStore.now()), [])
        await store.purge()
        assert threads and loop_thread not in threads

    run_with_store(f"sqlite:///{tmp_path}/s.sqlite3", body)
    with sqlite3.connect(tmp_path / "s.sqlite3") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


_WRITER = """
import asyncio, sys
from deepseek_frontend.state import StoredConversation, StoredItem, open_store_url, owner_key
async def main():
    store = await open_store_url(sys.argv[1])
    owner = owner_key("k")
    await store.put_conversation(StoredConversation("conv_acked", owner, 0.0 + __import__("time").time()), [])
    print("acked", flush=True)
    n = 0
    while True:  # killed somewhere in here, maybe inside a transaction
        batch = [StoredItem(f"msg_{n}_{k}", "{}") for k in range(50)]
        await store.add_conversation_items(owner, "conv_acked", batch)
        n += 1
        if n == 20:
            print("twenty", flush=True)
asyncio.run(main())
"""


def test_sqlite_survives_sigkill_with_nothing_half_written(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/crash.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, url], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "acked"
        assert proc.stdout.readline().strip() == "twenty"
    finally:
        proc.kill()
        proc.wait(timeout=30)

    async def body(store: StateStore) -> None:
        items = await store.conversation_items(OWNER, "conv_acked")
        assert items is not None and len(items) >= 20 * 50
        assert len(items) % 50 == 0  # every batch whole or absent
        assert all(isinstance(i, StoredItem) for i in items)

    run_with_store(url, body)


def test_null_store_keeps_nothing() -> None:
    async def main() -> None:
        store = await open_store_url("none")
        conv = StoredConversation(new_id("conv"), OWNER, StateStore.now())
        await store.put_conversation(conv, [])
        assert await store.get_conversation(OWNER, conv.id) is None
        assert await store.purge() == 0

    asyncio.run(main())
