"""A store that cannot be used raises StoreUnavailableError (503, the server's fault), on SQLite and
PostgreSQL, and a store that cannot be written is refused when it is opened.

The failures are real: SQLite's own "database or disk is full" (``PRAGMA max_page_count`` caps the
file where it is), a file another connection keeps locked past the busy timeout, a file the kernel
will not let anyone write (``chattr +i``, which binds root too), and a PostgreSQL server stopped
under an open store.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from deepseek_frontend.errors import StoreUnavailableError
from deepseek_frontend.fleet.store_config import StateOptions, check_state_store
from deepseek_frontend.state import (
    StateStore,
    StoredConversation,
    StoredItem,
    new_id,
    open_store_url,
    owner_key,
)
from deepseek_frontend.state.sqlite import SqliteStore
from tests.support.postgres import PostgresServer, create_database, start_postgres

OWNER = owner_key("failures")


def _conversation() -> StoredConversation:
    return StoredConversation(new_id("conv"), OWNER, StateStore.now())


def _big_items() -> list[StoredItem]:
    return [StoredItem(new_id("msg"), '{"text":"' + "x" * 200_000 + '"}')]


def test_sqlite_disk_full_is_store_unavailable_and_reads_go_on(tmp_path: Path) -> None:
    async def main() -> None:
        store = await open_store_url(f"sqlite:///{tmp_path}/s.sqlite3")
        try:
            assert isinstance(store, SqliteStore)
            kept = _conversation()
            await store.put_conversation(kept, [])
            conn = store._conn
            assert conn is not None
            # the file may not grow past the pages it has: what SQLite answers on a full disk
            await store._run(lambda: conn.execute("PRAGMA max_page_count = 1"))
            with pytest.raises(StoreUnavailableError) as err:
                await store.put_conversation(_conversation(), _big_items())
            assert err.value.status_code == 503 and err.value.retry_after_s >= 1
            assert "full" in err.value.message
            assert await store.get_conversation(OWNER, kept.id) is not None
        finally:
            await store.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_file_locked_past_the_busy_timeout_is_store_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deepseek_frontend.state import sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "BUSY_TIMEOUT_MS", 50)  # not the 10 s a test would wait
    path = tmp_path / "s.sqlite3"

    async def main() -> None:
        store = await open_store_url(f"sqlite:///{path}")
        other = sqlite3.connect(path, isolation_level=None)
        try:
            kept = _conversation()
            await store.put_conversation(kept, [])
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            with pytest.raises(StoreUnavailableError, match="locked"):
                await store.put_conversation(_conversation(), [])
            assert await store.get_conversation(OWNER, kept.id) is not None  # reads go on
        finally:
            other.close()
            await store.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def _immutable(path: Path) -> bool:
    """Make ``path`` immutable (no write by anyone, root included); False where chattr cannot."""
    done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False)
    return done.returncode == 0


def test_a_read_only_sqlite_file_is_refused_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"

    async def make() -> None:
        store = await open_store_url(f"sqlite:///{path}")
        await store.close()

    asyncio.run(make())
    if not _immutable(path):
        pytest.skip("chattr +i is not available on this file system")
    try:
        with pytest.raises(StoreUnavailableError, match="readonly"):
            asyncio.run(make())
        error = check_state_store(StateOptions(url=f"sqlite:///{path}"))
        assert error is not None and "\n" not in error
        assert error.startswith(f"--state-store sqlite:///{path} cannot be opened for writing")
        assert "readonly" in error
        # serve's default file is left to the start-up (which runs stateless with a warning)
        assert check_state_store(StateOptions(url=f"sqlite:///{path}", explicit=False)) is None
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


@pytest.fixture()
def doomed_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, which it stops."""
    server = start_postgres()
    try:
        yield server
    finally:
        server.stop()


def test_postgres_down_is_store_unavailable_and_refused_at_start(doomed_postgres: PostgresServer) -> None:
    url = create_database(doomed_postgres)

    async def main() -> None:
        store = await open_store_url(url)
        try:
            conv = _conversation()
            await store.put_conversation(conv, [])
            await asyncio.to_thread(doomed_postgres.stop)
            for call in (
                store.get_conversation(OWNER, conv.id),
                store.put_conversation(_conversation(), []),
                store.stored_bytes(),
            ):
                with pytest.raises(StoreUnavailableError) as err:
                    await call
                assert err.value.status_code == 503
                assert "127.0.0.1" not in err.value.message  # where the database is stays in the log
        finally:
            await store.close()

    asyncio.run(asyncio.wait_for(main(), 120))
    error = check_state_store(StateOptions(url=url.replace("postgres@", "postgres:secret@")))
    assert error is not None and "\n" not in error and "secret" not in error
    assert "cannot be opened for writing" in error
