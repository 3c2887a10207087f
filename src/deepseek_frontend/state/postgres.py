"""The PostgreSQL store: several frontend replicas share one database (``asyncpg`` and its pool).

``asyncpg`` is optional (``pip install 'deepseek-frontend[postgres]'``); it is imported when a
``postgresql://`` store is opened. Statements are the shared ones of :mod:`.sql` with ``?``
rewritten to ``$1, $2, ...``. Migrations run under a transaction-scoped advisory lock, so replicas
starting at once migrate one after another (the later ones find the schema current).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from .sql import SqlStore
from .store import Retention

__all__ = ["PostgresStore", "to_dollar_params"]

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
        self._pool = await asyncpg.create_pool(self.dsn, min_size=self._sizes[0], max_size=self._sizes[1])
        async with self.transaction() as tx:
            await tx.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            await self.migrate(tx)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def in_transaction(self, op: Callable[[Any], Awaitable[T]], readonly: bool = False) -> T:
        if not readonly:
            return await super().in_transaction(op)
        assert self._pool is not None, "PostgresStore used before open()"
        async with self._pool.acquire() as conn:  # no BEGIN / COMMIT: two round trips fewer
            return await op(_PgTx(conn))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[_PgTx]:
        assert self._pool is not None, "PostgresStore used before open()"
        async with self._pool.acquire() as conn, conn.transaction():
            yield _PgTx(conn)
