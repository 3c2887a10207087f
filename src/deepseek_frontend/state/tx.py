"""The transaction the SQL stores' logic runs in: :class:`Tx`, which SQLite and PostgreSQL provide."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["Tx"]


class Tx(Protocol):
    """One open transaction."""

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; the rows it changed."""

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...
