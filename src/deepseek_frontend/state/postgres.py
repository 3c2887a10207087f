"""The PostgreSQL store: several frontend replicas share one database (``asyncpg`` and its pool).

``asyncpg`` is optional (``pip install 'deepseek-frontend[postgres]'``); it is imported when a
``postgresql://`` store is opened. Statements are the shared ones of :mod:`.sql` with ``?``
rewritten to ``$1, $2, ...``. Migrations run under a transaction-scoped advisory lock, so replicas
starting at once migrate one after another (the later ones find the schema current).

Failures: a database that cannot be reached, refuses connections, runs out of resources (disk
full, too many connections), is shutting down or is read-only is raised as
:class:`~deepseek_frontend.errors.StoreUnavailableError` (503, the server's fault; the cause is
logged, never sent: it may name hosts). A transaction chosen as a deadlock's victim, or failing
serialization, is run again (:data:`TX_ATTEMPTS` times in all).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from deepseek_frontend.errors import StoreUnavailableError

from .sql import SqlStore
from .store import Retention

__all__ = ["CONNECT_TIMEOUT_S", "TX_ATTEMPTS", "PostgresStore", "to_dollar_params", "unavailable"]

log = logging.getLogger("deepseek_frontend.state")

#: seconds a new connection may take before the database counts as unreachable
CONNECT_TIMEOUT_S = 10.0
#: runs of a transaction that a deadlock or a serialization failure ended (the first included)
TX_ATTEMPTS = 3
#: SQLSTATE classes that say the database cannot serve now: connection exception, insufficient
#: resources (disk full, out of memory, too many connections), operator intervention (shutting
#: down, cannot connect now), system error (I/O)
_UNAVAILABLE_CLASSES = ("08", "53", "57", "58")
#: SQLSTATEs of one transaction's bad luck: serialization failure, deadlock detected
_RETRY_STATES = ("40001", "40P01")

#: the advisory lock key migrations hold (any constant; "dsfe" in ASCII)
_MIGRATION_LOCK = 0x64736665
_MARK = re.compile(r"\?")
T = TypeVar("T")


@functools.lru_cache(maxsize=256)
def to_dollar_params(sql: str) -> str:
    """``?`` placeholders -> ``$1, $2, ...`` (the store's SQL has no ``?`` inside string literals)."""
    counter = iter(range(1, 1 << 16))
    return _MARK.sub(lambda _: f"${next(counter)}", sql)


def _rowcount(status: str) -> int:
    """The row count of an asyncpg command status (``"DELETE 3"``, ``"INSERT 0 1"``)."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


def _sqlstate(exc: BaseException) -> str:
    state = getattr(exc, "sqlstate", None)
    return state if isinstance(state, str) else ""


def unavailable(exc: BaseException) -> StoreUnavailableError | None:
    """The :class:`StoreUnavailableError` an exception of the driver means, or None when it is not
    one (a constraint violated or a bug)."""
    state = _sqlstate(exc)
    if state[:2] in _UNAVAILABLE_CLASSES or state == "25006":  # 25006: a read-only transaction
        reason = f"the database cannot serve now (SQLSTATE {state})"
    elif isinstance(exc, OSError | TimeoutError | ConnectionError):
        reason = "the database cannot be reached"
    elif type(exc).__name__ in ("InterfaceError", "ConnectionDoesNotExistError", "InternalClientError"):
        reason = "the connection to the database failed"  # asyncpg: a connection closed under it
    else:
        return None
    return StoreUnavailableError(f"the state store is unavailable ({reason}); retry later")


class _PgTx:
    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        return _rowcount(await self._conn.execute(to_dollar_params(sql), *args))

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._conn.executemany(to_dollar_params(sql), [tuple(r) for r in rows])

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await self._conn.fetch(to_dollar_params(sql), *args)]


class PostgresStore(SqlStore):
    """:class:`~.store.StateStore` in the PostgreSQL database at ``dsn`` (``postgresql://...``)."""

    kind = "postgresql"
    claim_lock = " FOR UPDATE SKIP LOCKED"

    def __init__(
        self, dsn: str, retention: Retention | None = None, *, min_size: int = 1, max_size: int = 16
    ) -> None:
        super().__init__(retention)
        self.dsn = dsn
        self._sizes = (min_size, max_size)
        self._pool: Any = None

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            import asyncpg
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise RuntimeError(
                "--state-store postgresql:// needs asyncpg: pip install 'deepseek-frontend[postgres]'"
            ) from exc
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn, min_size=self._sizes[0], max_size=self._sizes[1], timeout=CONNECT_TIMEOUT_S
            )
            async with self.transaction() as tx:
                await tx.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
                await self.migrate(tx)
        except Exception as exc:
            await self.close()
            mapped = unavailable(exc)
            if mapped is None:
                raise
            raise mapped from exc

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def in_transaction(self, op: Callable[[Any], Awaitable[T]], readonly: bool = False) -> T:
        for attempt in range(1, TX_ATTEMPTS + 1):
            try:
                if not readonly:
                    return await super().in_transaction(op)
                assert self._pool is not None, "PostgresStore used before open()"
                async with self._pool.acquire() as conn:  # no BEGIN / COMMIT: two round trips fewer
                    return await op(_PgTx(conn))
            except Exception as exc:
                if _sqlstate(exc) in _RETRY_STATES and attempt < TX_ATTEMPTS:
                    await asyncio.sleep(0)  # rolled back whole: run it again
                    continue
                mapped = unavailable(exc)
                if mapped is None:
                    raise
                log.warning("state store operation failed: %r", exc)
                raise mapped from exc
        raise AssertionError("unreachable")  # pragma: no cover

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_PgTx]:
        assert self._pool is not None, "PostgresStore used before open()"
        async with self._pool.acquire() as conn, conn.transaction():
            yield _PgTx(conn)
