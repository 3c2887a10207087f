"""Files in SQL: :class:`FileSql`, the part of :class:`~.sql.SqlStore` that keeps the Files API's
files (``state/batch_store.py``): an uploaded file's row and its bytes in chunks, invisible until
the upload finishes; the batches' output and error files are rows whose content is their batch's
results (``state/batch_sql.py``)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .batch_records import StoredFile
from .batch_store import BatchStore
from .records import Order
from .store import CursorError
from .tx import Tx

if TYPE_CHECKING:
    from .store import Retention

__all__ = ["FILE_COLUMNS", "UPLOAD_TTL_S", "FileSql"]

T = TypeVar("T")

#: seconds an upload that never finished (its process died) is kept before the purge removes it
UPLOAD_TTL_S = 24 * 3600.0
_ALIVE = "(expires_at IS NULL OR expires_at > ?)"
FILE_COLUMNS = (
    "id, owner, created_at, purpose, filename, bytes, lines, status, status_details, expires_at,"
    " batch_id, outcomes"
)


def _file(row: Sequence[Any]) -> StoredFile:
    return StoredFile(
        id=row[0],
        owner=row[1],
        created_at=float(row[2]),
        purpose=row[3],
        filename=row[4],
        bytes=int(row[5]),
        lines=int(row[6]),
        status=row[7],
        status_details=row[8],
        expires_at=row[9],
        batch_id=row[10],
        outcomes=row[11],
    )


class FileSql(BatchStore):
    """The files of :class:`~.batch_store.BatchStore` over the SQL store's transactions."""

    if TYPE_CHECKING:
        retention: Retention

        @staticmethod
        def now() -> float: ...

    @abstractmethod
    async def in_transaction(self, op: Callable[[Tx], Awaitable[T]], readonly: bool = False) -> T: ...

    # ---------------------------------------------------------------- files
    async def begin_file(self, file: StoredFile) -> None:
        f = file

        async def op(tx: Tx) -> None:
            await tx.execute(
                f"INSERT INTO files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, 'uploading', ?, ?, ?, ?)",
                (
                    f.id,
                    f.owner,
                    float(f.created_at),
                    f.purpose,
                    f.filename,
                    f.bytes,
                    f.lines,
                    f.status_details,
                    f.created_at + UPLOAD_TTL_S,
                    f.batch_id,
                    f.outcomes,
                ),
            )

        await self.in_transaction(op)

    async def put_file_chunk(self, file_id: str, seq: int, data: bytes) -> None:
        async def op(tx: Tx) -> None:
            await tx.execute(
                "INSERT INTO file_chunks (file_id, seq, data) VALUES (?, ?, ?)", (file_id, seq, data)
            )

        await self.in_transaction(op)

    async def finish_file(
        self,
        owner: str,
        file_id: str,
        *,
        filename: str,
        size: int,
        lines: int,
        status_details: str | None,
        expires_at: float | None,
    ) -> bool:
        async def op(tx: Tx) -> bool:
            changed = await tx.execute(
                "UPDATE files SET status = 'processed', filename = ?, bytes = ?, lines = ?,"
                " status_details = ?, expires_at = ? WHERE id = ? AND owner = ? AND status = 'uploading'",
                (filename, size, lines, status_details, expires_at, file_id, owner),
            )
            return bool(changed)

        return await self.in_transaction(op)

    async def get_file(self, owner: str, file_id: str) -> StoredFile | None:
        async def op(tx: Tx) -> StoredFile | None:
            rows = await tx.fetch(
                f"SELECT {FILE_COLUMNS} FROM files WHERE id = ? AND owner = ? AND status = 'processed'"
                f" AND {_ALIVE}",
                (file_id, owner, self.now()),
            )
            return _file(rows[0]) if rows else None

        return await self.in_transaction(op, readonly=True)

    async def list_files(
        self, owner: str, *, purpose: str | None, after: str | None, limit: int, order: Order
    ) -> tuple[list[StoredFile], bool]:
        now = self.now()

        async def op(tx: Tx) -> tuple[list[StoredFile], bool]:
            where = f"owner = ? AND status = 'processed' AND {_ALIVE}"
            args: list[Any] = [owner, now]
            if purpose is not None:
                where += " AND purpose = ?"
                args.append(purpose)
            if after is not None:
                rows = await tx.fetch(
                    "SELECT created_at FROM files WHERE id = ? AND owner = ?", (after, owner)
                )
                if not rows:
                    raise CursorError("after", after)
                sign = ">" if order == "asc" else "<"
                where += f" AND (created_at {sign} ? OR (created_at = ? AND id {sign} ?))"
                args += [rows[0][0], rows[0][0], after]
            direction = "ASC" if order == "asc" else "DESC"
            rows = await tx.fetch(
                f"SELECT {FILE_COLUMNS} FROM files WHERE {where}"
                f" ORDER BY created_at {direction}, id {direction} LIMIT ?",
                (*args, limit + 1),
            )
            return [_file(r) for r in rows[:limit]], len(rows) > limit

        return await self.in_transaction(op, readonly=True)

    async def delete_file(self, owner: str, file_id: str) -> bool:
        async def op(tx: Tx) -> bool:
            # an upload that failed half-way is deleted too (its id was never handed out)
            changed = await tx.execute("DELETE FROM files WHERE id = ? AND owner = ?", (file_id, owner))
            if changed:
                await tx.execute("DELETE FROM file_chunks WHERE file_id = ?", (file_id,))
            return bool(changed)

        return await self.in_transaction(op)

    async def file_chunks(self, file_id: str, first_seq: int, limit: int) -> list[tuple[int, bytes]]:
        async def op(tx: Tx) -> list[tuple[int, bytes]]:
            rows = await tx.fetch(
                "SELECT seq, data FROM file_chunks WHERE file_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
                (file_id, first_seq, limit),
            )
            return [(int(seq), bytes(data)) for seq, data in rows]

        return await self.in_transaction(op, readonly=True)

    async def line_results(
        self, batch_id: str, outcomes: Sequence[str], after_line: int, limit: int
    ) -> list[tuple[int, str]]:
        marks = ", ".join("?" for _ in outcomes)

        async def op(tx: Tx) -> list[tuple[int, str]]:
            rows = await tx.fetch(
                f"SELECT line, result FROM batch_lines WHERE batch_id = ? AND outcome IN ({marks})"
                " AND line > ? ORDER BY line LIMIT ?",
                (batch_id, *outcomes, after_line, limit),
            )
            return [(int(line), result) for line, result in rows]

        return await self.in_transaction(op, readonly=True)

    async def purge_files(self, tx: Tx, at: float) -> int:
        """Delete (in ``tx``) the files whose retention ended by ``at``, with their chunks; how many."""
        ended = "expires_at IS NOT NULL AND expires_at <= ?"
        await tx.execute(
            f"DELETE FROM file_chunks WHERE file_id IN (SELECT id FROM files WHERE {ended})", (at,)
        )
        return await tx.execute(f"DELETE FROM files WHERE {ended}", (at,))
