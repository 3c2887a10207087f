"""The SQLite store: one database file, WAL mode, every call on a thread of its own.

``sqlite3`` calls block, so none runs on the event loop: the connection lives on a dedicated
single-thread executor, and each operation (a whole transaction) is handed to it at once. One
connection per process, and transactions of that process take turns (an ``asyncio.Lock``);
several processes (``serve --workers N``) share the file through SQLite's own locking -- WAL
lets readers go on while one writer commits, and every transaction starts ``BEGIN IMMEDIATE``
(the write lock up front, so a transaction that reads and then writes never fails half-way on
a lock upgrade), waiting up to :data:`BUSY_TIMEOUT_MS` for another process's transaction to end.

Durability: ``synchronous=NORMAL`` in WAL mode loses no committed transaction when the process
is killed (the WAL is in the operating system's hands); only a power loss may drop the last
ones. A transaction the process dies inside is rolled back on the next open.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .sql import SqlStore
from .store import Retention

__all__ = ["BUSY_TIMEOUT_MS", "SqliteStore"]

#: milliseconds a transaction waits for another process's write lock before failing
BUSY_TIMEOUT_MS = 10_000
T = TypeVar("T")


class _SqliteTx:
    """A transaction on the store's connection; every call runs on the store's thread."""

    __slots__ = ("_conn", "_run")

    def __init__(self, run: Any, conn: sqlite3.Connection) -> None:
        self._run = run
        self._conn = conn

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        return await self._run(lambda: self._conn.execute(sql, tuple(args)).rowcount)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._run(lambda: self._conn.executemany(sql, rows))

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._run(lambda: self._conn.execute(sql, tuple(args)).fetchall())


class _InlineTx:
    """A transaction whose statements run where it is used: on the store's thread, inside
    :meth:`SqliteStore.in_transaction` (its coroutines never suspend)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self._conn.execute(sql, tuple(args)).rowcount

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._conn.executemany(sql, rows)

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(args)).fetchall()


def _drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (an operation over :class:`_InlineTx`) to its end."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("a SQLite store operation awaited something other than its transaction")


class SqliteStore(SqlStore):
    """:class:`~.store.StateStore` in the SQLite file at ``path`` (its folder is created)."""

    kind = "sqlite"

    def __init__(self, path: str | Path, retention: Retention | None = None) -> None:
        super().__init__(retention)
        self.path = Path(path)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    async def _run(self, fn: Any) -> Any:
        assert self._executor is not None, "SqliteStore used before open()"
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; this class says BEGIN and COMMIT itself
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        return conn

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-sqlite")
        self._conn = await self._run(self._connect)
        async with self.transaction() as tx:
            await self.migrate(tx)

    async def close(self) -> None:
        if self._executor is None:
            return
        async with self._lock:
            conn = self._conn
            if conn is not None:
                await self._run(conn.close)
            self._executor.shutdown(wait=True)
            self._executor = None
            self._conn = None

    async def in_transaction(self, op: Callable[[Any], Awaitable[T]], readonly: bool = False) -> T:
        """Run the whole of ``op`` -- BEGIN, its statements, COMMIT (or ROLLBACK) -- on the store's
        thread in one hand-over: a turn's read or write costs one thread switch, not one per
        statement. A caller cancelled meanwhile leaves the transaction to finish on the thread
        (committed or rolled back whole) before the next one starts."""
        async with self._lock:
            conn = self._conn
            assert conn is not None, "SqliteStore used before open()"

            def work() -> T:
                # a read needs no write lock: other processes' writers go on meanwhile (WAL)
                conn.execute("BEGIN" if readonly else "BEGIN IMMEDIATE")
                try:
                    result = _drive(op(_InlineTx(conn)))  # type: ignore[arg-type]
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return result

            return await self._run(work)  # type: ignore[no-any-return]

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_SqliteTx]:
        async with self._lock:
            conn = self._conn
            assert conn is not None, "SqliteStore used before open()"
            await self._run(lambda: conn.execute("BEGIN IMMEDIATE"))
            try:
                yield _SqliteTx(self._run, conn)
                await asyncio.shield(self._run(lambda: conn.execute("COMMIT")))
            except BaseException:
                # statements run in order on the one thread: this rollback runs after whatever the
                # cancelled or failed block had already handed over, and before the next BEGIN
                await asyncio.shield(self._run(lambda: conn.in_transaction and conn.execute("ROLLBACK")))
                raise
