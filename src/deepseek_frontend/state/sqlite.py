"""The SQLite store: one database file, WAL mode, every call on threads of its own.

``sqlite3`` calls block, so none runs on the event loop. Writes and reads go different ways:

* **Writes** run on one dedicated writer thread with its own connection; transactions of the
  process take turns (an ``asyncio.Lock``), each handed to the thread whole. Every write
  transaction starts ``BEGIN IMMEDIATE`` (the write lock up front, so a transaction that reads and
  then writes never fails half-way on a lock upgrade), waiting up to :data:`BUSY_TIMEOUT_MS` for
  another process's transaction (``serve --workers N`` share the file through SQLite's locking).
* **Reads** run on :data:`READERS` reader threads, each with a connection of its own, and never
  take the writer's lock: in WAL mode a reader sees the last committed state while a writer holds
  the write lock or waits for it, so no read waits behind a write -- not this process's, not
  another's.

Durability: ``synchronous=NORMAL`` in WAL mode loses no committed transaction when the process
is killed (the WAL is in the operating system's hands); only a power loss may drop the last
ones. A transaction the process dies inside is rolled back on the next open.

Space: the file is kept with ``auto_vacuum=INCREMENTAL`` (an older file is converted with one
``VACUUM`` when it is opened), and once a write leaves :data:`VACUUM_PAGES` free pages behind
(deleted or evicted objects) they are given back to the file system (``PRAGMA incremental_vacuum``
and a passive checkpoint), so the file shrinks as objects leave.

Failures: every ``sqlite3`` error that says the database cannot be used now (disk full, locked
past the busy timeout, read-only, I/O error, a file that cannot be opened) is raised as
:class:`~deepseek_frontend.errors.StoreUnavailableError` (503, the server's fault).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from deepseek_frontend.errors import StoreUnavailableError

from .sql import SqlStore
from .store import Retention

__all__ = ["BUSY_TIMEOUT_MS", "READERS", "VACUUM_PAGES", "SqliteStore", "unavailable"]

log = logging.getLogger("deepseek_frontend.state")

#: milliseconds a transaction waits for another process's write lock before failing
BUSY_TIMEOUT_MS = 10_000
#: reader threads (each with its own connection) per store
READERS = 2
#: free pages (4 KiB each by default) after which a write gives the space back to the file system
VACUUM_PAGES = 256
#: bytes the WAL file is truncated to after a checkpoint
WAL_SIZE_LIMIT = 64 << 20
T = TypeVar("T")


def unavailable(exc: BaseException) -> StoreUnavailableError | None:
    """The :class:`StoreUnavailableError` an exception of the database means, or None when it is
    not one (a constraint violated or a misuse: a bug, reported as such)."""
    if (
        isinstance(exc, sqlite3.OperationalError)
        or type(exc) is sqlite3.DatabaseError
        or isinstance(exc, OSError)
    ):
        # SQLite's messages are fixed texts ("database or disk is full", "database is locked",
        # "attempt to write a readonly database"): no path, no data
        return StoreUnavailableError(f"the state store is unavailable ({exc}); retry later")
    return None


class _SqliteTx:
    """A transaction on the writer connection; every call runs on the writer thread."""

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
    """A transaction whose statements run where it is used: on a store thread, inside
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


def _in_one_transaction(conn: sqlite3.Connection, begin: str, op: Callable[[Any], Awaitable[T]]) -> T:
    """``begin``, ``op`` over ``conn``, COMMIT (ROLLBACK when it raises), on the calling thread."""
    conn.execute(begin)
    try:
        result = _drive(op(_InlineTx(conn)))  # type: ignore[arg-type]
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


class SqliteStore(SqlStore):
    """:class:`~.store.StateStore` in the SQLite file at ``path`` (its folder is created)."""

    kind = "sqlite"

    def __init__(
        self, path: str | Path, retention: Retention | None = None, *, readers: int = READERS
    ) -> None:
        super().__init__(retention)
        self.path = Path(path)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._reader_count = max(1, readers)
        self._readers: ThreadPoolExecutor | None = None
        self._reader_local = threading.local()
        self._reader_conns: list[sqlite3.Connection] = []
        self._reader_conns_lock = threading.Lock()

    async def _run(self, fn: Any) -> Any:
        assert self._executor is not None, "SqliteStore used before open()"
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; this class says BEGIN and COMMIT itself
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # before any table exists, so that a new file starts with it (an older one: see open())
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        return conn

    def _reader(self) -> sqlite3.Connection:
        """This reader thread's connection (opened on its first read)."""
        conn: sqlite3.Connection | None = getattr(self._reader_local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA query_only = ON")  # a reader never writes, whatever it is handed
            self._reader_local.conn = conn
            with self._reader_conns_lock:
                self._reader_conns.append(conn)
        return conn

    async def open(self) -> None:
        if self._executor is not None:
            return
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-sqlite")
        self._readers = ThreadPoolExecutor(
            max_workers=self._reader_count, thread_name_prefix="state-sqlite-read"
        )
        try:
            try:
                self._conn = await self._run(self._connect)
                async with self.transaction() as tx:
                    await self.migrate(tx)
            except Exception as exc:
                mapped = unavailable(exc)
                if mapped is None:
                    raise
                raise mapped from exc
            await self._run(self._convert_to_incremental_vacuum)
        except BaseException:
            await self.close()
            raise

    def _convert_to_incremental_vacuum(self) -> None:
        """A file made before ``auto_vacuum=INCREMENTAL`` was set gets it with one VACUUM (its size
        in I/O, once); a busy file is left as it is until the next start."""
        conn = self._conn
        assert conn is not None
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
            return
        log.info("state store %s: converting to incremental auto-vacuum (one VACUUM)", self.path)
        try:
            conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
            conn.execute("VACUUM")
        except sqlite3.Error as exc:
            log.warning(
                "state store %s: VACUUM failed (%s); its freed space stays in the file", self.path, exc
            )

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
        readers, self._readers = self._readers, None
        if readers is not None:
            readers.shutdown(wait=True)
        with self._reader_conns_lock:
            conns, self._reader_conns = self._reader_conns, []
        for reader in conns:
            reader.close()
        self._reader_local = threading.local()

    async def in_transaction(self, op: Callable[[Any], Awaitable[T]], readonly: bool = False) -> T:
        """Run the whole of ``op`` -- BEGIN, its statements, COMMIT (or ROLLBACK) -- on a store
        thread in one hand-over: a turn's read or write costs one thread switch, not one per
        statement. A read runs on a reader thread, beside whatever write is under way; a write
        waits for this process's previous one. A caller cancelled meanwhile leaves the
        transaction to finish on its thread (committed or rolled back whole)."""
        if readonly:
            readers = self._readers
            assert readers is not None, "SqliteStore used before open()"

            def read() -> T:
                # a read needs no write lock: writers, this process's and others', go on meanwhile
                return _in_one_transaction(self._reader(), "BEGIN", op)

            return await self._mapped(asyncio.get_running_loop().run_in_executor(readers, read))
        async with self._lock:
            conn = self._conn
            assert conn is not None, "SqliteStore used before open()"

            def write() -> T:
                result = _in_one_transaction(conn, "BEGIN IMMEDIATE", op)
                self._give_space_back(conn)
                return result

            return await self._mapped(self._run(write))

    @staticmethod
    async def _mapped(work: Awaitable[T]) -> T:
        try:
            return await work
        except Exception as exc:
            mapped = unavailable(exc)
            if mapped is None:
                raise
            log.warning("state store operation failed: %s", exc)
            raise mapped from exc

    @staticmethod
    def _give_space_back(conn: sqlite3.Connection) -> None:
        """After a committed write: once deleted objects left :data:`VACUUM_PAGES` free pages, hand
        them back to the file system (the file shrinks at the checkpoint). Best effort: the write
        itself is committed whatever happens here."""
        try:
            if conn.execute("PRAGMA freelist_count").fetchone()[0] < VACUUM_PAGES:
                return
            # executescript steps it to its end (execute would free one page: one step)
            conn.executescript("PRAGMA incremental_vacuum;")
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error as exc:
            log.debug("incremental vacuum skipped: %s", exc)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_SqliteTx]:
        async with self._lock:
            conn = self._conn
            assert conn is not None, "SqliteStore used before open()"
            await self._mapped(self._run(lambda: conn.execute("BEGIN IMMEDIATE")))
            try:
                yield _SqliteTx(self._run, conn)
                await asyncio.shield(self._mapped(self._run(lambda: conn.execute("COMMIT"))))
            except BaseException:
                # statements run in order on the one thread: this rollback runs after whatever the
                # cancelled or failed block had already handed over, and before the next BEGIN
                await asyncio.shield(self._run(lambda: conn.in_transaction and conn.execute("ROLLBACK")))
                raise
