"""Batches and batch lines in SQL: :class:`BatchSql`, the part of :class:`~.sql.SqlStore` that
implements :class:`~.batch_store.BatchStore` (the same SQL on SQLite and PostgreSQL; the files
are :class:`~.file_sql.FileSql`'s).

Claiming under concurrency: a claim is one ``UPDATE ... WHERE <lease free>`` per batch. SQLite
runs writers one at a time (``BEGIN IMMEDIATE``). On PostgreSQL the candidate lines are picked
``FOR UPDATE SKIP LOCKED`` (:attr:`BatchSql.claim_lock`), so two replicas claiming at once take
different lines; and were two to pick the same line, the second would wait on its row lock and
then re-check the lease condition on the new row version (READ COMMITTED), which no longer
holds -- a line is never claimed twice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .batch_records import (
    ACTIVE_BATCH_STATUSES,
    BATCH_TIME_COLUMNS,
    BatchCounts,
    BatchLineRecord,
    ClaimedLine,
    LineResult,
    StoredBatch,
    StoredFile,
)
from .file_sql import FILE_COLUMNS, FileSql
from .store import CursorError
from .tx import Tx

__all__ = ["BatchSql"]

#: candidate batches looked at per claim
_CLAIM_BATCHES = 16
_ALIVE = "(expires_at IS NULL OR expires_at > ?)"
_LEASE_FREE = "(lease_until IS NULL OR lease_until < ?)"
_BATCH_COLUMNS = (
    "id, owner, api, tenant, endpoint, completion_window, status, created_at, deadline, input_file_id,"
    " metadata, errors, output_file_id, error_file_id, total, expires_at"
)
_TIME_STATUSES = tuple(BATCH_TIME_COLUMNS)
_TIME_COLUMNS = ", ".join(BATCH_TIME_COLUMNS.values())
_ACTIVE = "(" + ", ".join(f"'{status}'" for status in ACTIVE_BATCH_STATUSES) + ")"
_OUTCOMES = ("pending", "succeeded", "errored", "canceled", "expired")


def _batch(row: Sequence[Any]) -> StoredBatch:
    head, times = row[:16], row[16:]
    return StoredBatch(
        id=head[0],
        owner=head[1],
        api=head[2],
        tenant=head[3],
        endpoint=head[4],
        completion_window=head[5],
        status=head[6],
        created_at=float(head[7]),
        deadline=float(head[8]),
        input_file_id=head[9],
        metadata=head[10],
        errors=head[11],
        output_file_id=head[12],
        error_file_id=head[13],
        total=int(head[14]),
        expires_at=head[15],
        times={status: float(t) for status, t in zip(_TIME_STATUSES, times, strict=True) if t is not None},
    )


def _line_rows(batch_id: str, lines: Sequence[BatchLineRecord]) -> list[tuple[Any, ...]]:
    return [
        (
            batch_id,
            r.line,
            r.custom_id,
            r.url,
            r.body,
            r.outcome,
            r.result,
            _size(r.result),
        )
        for r in lines
    ]


def _size(result: str | None) -> int:
    """Bytes the result takes in its JSONL file, newline included."""
    return 0 if result is None else len(result.encode()) + 1


_INSERT_LINE = (
    "INSERT INTO batch_lines (batch_id, line, custom_id, url, body, outcome, result, size, attempts,"
    " input_tokens, cached_tokens, output_tokens, reasoning_tokens)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, 0, 0, 0, 0)"
)


class BatchSql(FileSql):
    """:class:`BatchStore` over the SQL store's transactions (mixed into ``SqlStore``); files are
    :class:`FileSql`'s."""

    #: how a claim locks the lines it picks: PostgreSQL's ``FOR UPDATE SKIP LOCKED`` (lines another
    #: claim is taking are passed over); SQLite has no row locks (its writers take turns)
    claim_lock = ""

    # ---------------------------------------------------------------- batches
    async def create_batch(
        self, batch: StoredBatch, lines: Sequence[BatchLineRecord], max_active: int | None
    ) -> bool:
        b = batch

        async def op(tx: Tx) -> bool:
            if max_active is not None:
                rows = await tx.fetch(
                    f"SELECT COUNT(*) FROM batches WHERE owner = ? AND status IN {_ACTIVE}", (b.owner,)
                )
                if int(rows[0][0]) >= max_active:
                    return False
            await tx.execute(
                f"INSERT INTO batches ({_BATCH_COLUMNS}, in_progress_at) VALUES"
                " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    b.id,
                    b.owner,
                    b.api,
                    b.tenant,
                    b.endpoint,
                    b.completion_window,
                    b.status,
                    float(b.created_at),
                    float(b.deadline),
                    b.input_file_id,
                    b.metadata,
                    b.errors,
                    b.output_file_id,
                    b.error_file_id,
                    b.total,
                    b.expires_at,
                    b.times.get("in_progress"),
                ),
            )
            if lines:
                await tx.executemany(_INSERT_LINE, _line_rows(b.id, lines))
            return True

        return await self.in_transaction(op)

    async def get_batch(self, owner: str, api: str, batch_id: str) -> StoredBatch | None:
        async def op(tx: Tx) -> StoredBatch | None:
            rows = await tx.fetch(
                f"SELECT {_BATCH_COLUMNS}, {_TIME_COLUMNS} FROM batches"
                f" WHERE id = ? AND owner = ? AND api = ? AND {_ALIVE}",
                (batch_id, owner, api, self.now()),
            )
            return _batch(rows[0]) if rows else None

        return await self.in_transaction(op, readonly=True)

    async def list_batches(
        self, owner: str, api: str, *, after: str | None, before: str | None, limit: int
    ) -> tuple[list[StoredBatch], bool]:
        now = self.now()

        async def op(tx: Tx) -> tuple[list[StoredBatch], bool]:
            where = f"owner = ? AND api = ? AND {_ALIVE}"
            args: list[Any] = [owner, api, now]
            # newest first: "after" is older, "before" is newer
            for param, cursor, sign in (("after", after, "<"), ("before", before, ">")):
                if cursor is None:
                    continue
                rows = await tx.fetch(
                    "SELECT created_at FROM batches WHERE id = ? AND owner = ? AND api = ?",
                    (cursor, owner, api),
                )
                if not rows:
                    raise CursorError(param, cursor)
                where += f" AND (created_at {sign} ? OR (created_at = ? AND id {sign} ?))"
                args += [rows[0][0], rows[0][0], cursor]
            # a "before" page is the one just newer than the cursor: read upwards, then reverse
            direction = "ASC" if before is not None and after is None else "DESC"
            rows = await tx.fetch(
                f"SELECT {_BATCH_COLUMNS}, {_TIME_COLUMNS} FROM batches WHERE {where}"
                f" ORDER BY created_at {direction}, id {direction} LIMIT ?",
                (*args, limit + 1),
            )
            page = [_batch(r) for r in rows[:limit]]
            if direction == "ASC":
                page.reverse()
            return page, len(rows) > limit

        return await self.in_transaction(op, readonly=True)

    async def batch_counts(self, batch_ids: Sequence[str]) -> dict[str, BatchCounts]:
        if not batch_ids:
            return {}
        marks = ", ".join("?" for _ in batch_ids)

        async def op(tx: Tx) -> dict[str, BatchCounts]:
            rows = await tx.fetch(
                "SELECT batch_id, outcome, COUNT(*), SUM(input_tokens), SUM(cached_tokens),"
                " SUM(output_tokens), SUM(reasoning_tokens) FROM batch_lines"
                f" WHERE batch_id IN ({marks}) GROUP BY batch_id, outcome",
                tuple(batch_ids),
            )
            tallies: dict[str, dict[str, int]] = {bid: {} for bid in batch_ids}
            for bid, outcome, count, inputs, cached, outputs, reasoning in rows:
                tally = tallies[bid]
                if outcome in _OUTCOMES:
                    tally[outcome] = int(count)
                for name, value in (
                    ("input_tokens", inputs),
                    ("cached_tokens", cached),
                    ("output_tokens", outputs),
                    ("reasoning_tokens", reasoning),
                ):
                    tally[name] = tally.get(name, 0) + int(value or 0)
            return {bid: BatchCounts(**tally) for bid, tally in tallies.items()}

        return await self.in_transaction(op, readonly=True)

    async def cancel_batch(self, owner: str, api: str, batch_id: str, now: float) -> StoredBatch | None:
        async def op(tx: Tx) -> StoredBatch | None:
            await tx.execute(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ?"
                " WHERE id = ? AND owner = ? AND api = ? AND status IN ('validating', 'in_progress')",
                (now, batch_id, owner, api),
            )
            rows = await tx.fetch(
                f"SELECT {_BATCH_COLUMNS}, {_TIME_COLUMNS} FROM batches"
                f" WHERE id = ? AND owner = ? AND api = ? AND {_ALIVE}",
                (batch_id, owner, api, now),
            )
            return _batch(rows[0]) if rows else None

        return await self.in_transaction(op)

    async def delete_batch(self, owner: str, api: str, batch_id: str) -> bool:
        async def op(tx: Tx) -> bool:
            changed = await tx.execute(
                "DELETE FROM batches WHERE id = ? AND owner = ? AND api = ?", (batch_id, owner, api)
            )
            if changed:
                await tx.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
                await tx.execute("DELETE FROM files WHERE batch_id = ?", (batch_id,))
            return bool(changed)

        return await self.in_transaction(op)

    # ---------------------------------------------------------------- batch-level work
    async def claim_batch_work(self, holder: str, now: float, lease_until: float) -> StoredBatch | None:
        async def op(tx: Tx) -> StoredBatch | None:
            candidates = await tx.fetch(
                f"SELECT id FROM batches b WHERE {_LEASE_FREE} AND ("
                " status IN ('validating', 'cancelling', 'finalizing')"
                " OR (status = 'in_progress' AND (deadline <= ? OR NOT EXISTS ("
                "  SELECT 1 FROM batch_lines l WHERE l.batch_id = b.id AND l.outcome = 'pending'))))"
                " ORDER BY created_at LIMIT 4",
                (now, now),
            )
            for (batch_id,) in candidates:
                taken = await tx.execute(
                    f"UPDATE batches SET holder = ?, lease_until = ? WHERE id = ? AND {_LEASE_FREE}",
                    (holder, lease_until, batch_id, now),
                )
                if taken:
                    rows = await tx.fetch(
                        f"SELECT {_BATCH_COLUMNS}, {_TIME_COLUMNS} FROM batches WHERE id = ?", (batch_id,)
                    )
                    return _batch(rows[0])
            return None

        return await self.in_transaction(op)

    async def _fence(
        self, tx: Tx, batch_id: str, holder: str, lease_until: float | None = None, status: str | None = None
    ) -> bool:
        """Whether ``holder`` holds ``batch_id``'s lease (and the batch is in ``status``, when given),
        the lease extended to ``lease_until`` when given. On PostgreSQL the UPDATE also locks the
        batch's row until the transaction ends, so the holder's writes in it cannot interleave with
        a successor's."""
        where = "id = ? AND holder = ?" + (" AND status = ?" if status is not None else "")
        args: tuple[Any, ...] = (batch_id, holder) + ((status,) if status is not None else ())
        if lease_until is None:
            changed = await tx.execute(f"UPDATE batches SET holder = holder WHERE {where}", args)
        else:
            changed = await tx.execute(
                f"UPDATE batches SET lease_until = ? WHERE {where}", (lease_until, *args)
            )
        return bool(changed)

    async def renew_batch_lease(self, batch_id: str, holder: str, lease_until: float) -> bool:
        return await self.in_transaction(lambda tx: self._fence(tx, batch_id, holder, lease_until))

    async def reset_batch_lines(self, batch_id: str, holder: str) -> bool:
        async def op(tx: Tx) -> bool:
            if not await self._fence(tx, batch_id, holder):
                return False
            await tx.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
            return True

        return await self.in_transaction(op)

    async def add_batch_lines(
        self, batch_id: str, holder: str, lease_until: float, lines: Sequence[BatchLineRecord]
    ) -> bool:
        async def op(tx: Tx) -> bool:
            # a validation the batch was cancelled during stops at its next write
            if not await self._fence(tx, batch_id, holder, lease_until, "validating"):
                return False
            if lines:
                await tx.executemany(_INSERT_LINE, _line_rows(batch_id, lines))
            return True

        return await self.in_transaction(op)

    async def set_batch_status(self, batch_id: str, holder: str, status: str, now: float) -> bool:
        column = BATCH_TIME_COLUMNS[status]

        async def op(tx: Tx) -> bool:
            changed = await tx.execute(
                f"UPDATE batches SET status = ?, {column} = ? WHERE id = ? AND holder = ?",
                (status, now, batch_id, holder),
            )
            return bool(changed)

        return await self.in_transaction(op)

    async def start_batch(self, batch_id: str, holder: str, total: int, now: float) -> bool:
        async def op(tx: Tx) -> bool:
            changed = await tx.execute(
                "UPDATE batches SET status = 'in_progress', in_progress_at = ?, total = ?, holder = NULL,"
                " lease_until = NULL WHERE id = ? AND holder = ? AND status = 'validating'",
                (now, total, batch_id, holder),
            )
            return bool(changed)

        return await self.in_transaction(op)

    async def end_batch(
        self,
        batch_id: str,
        holder: str,
        status: str,
        now: float,
        *,
        errors: str | None = None,
        pending_outcome: str | None = None,
        render: Callable[[int, str | None, str], str] | None = None,
        output_file: StoredFile | None = None,
        error_file: StoredFile | None = None,
    ) -> bool:
        column = BATCH_TIME_COLUMNS[status]

        async def op(tx: Tx) -> bool:
            if not await self._fence(tx, batch_id, holder):
                return False
            if pending_outcome is not None and render is not None:
                pending = await tx.fetch(
                    "SELECT line, custom_id FROM batch_lines WHERE batch_id = ? AND outcome = 'pending'",
                    (batch_id,),
                )
                if pending:
                    updates = []
                    for line, custom_id in pending:
                        result = render(int(line), custom_id, pending_outcome)
                        updates.append((pending_outcome, result, _size(result), batch_id, line))
                    await tx.executemany(
                        "UPDATE batch_lines SET outcome = ?, result = ?, size = ?, holder = NULL,"
                        " claim = NULL, lease_until = NULL"
                        " WHERE batch_id = ? AND line = ? AND outcome = 'pending'",
                        updates,
                    )
            file_ids: list[str | None] = []
            for file in (output_file, error_file):
                file_ids.append(await self._store_results_file(tx, batch_id, file) if file else None)
            await tx.execute(
                f"UPDATE batches SET status = ?, {column} = ?, errors = ?, output_file_id = ?,"
                " error_file_id = ?, holder = NULL, lease_until = NULL WHERE id = ?",
                (status, now, errors, file_ids[0], file_ids[1], batch_id),
            )
            return True

        return await self.in_transaction(op)

    async def _store_results_file(self, tx: Tx, batch_id: str, file: StoredFile) -> str | None:
        """Store ``file`` (a view of ``batch_id``'s results whose outcome is in ``file.outcomes``)
        with its size and line count; its id, or None (nothing stored) when it would list no line."""
        outcomes = (file.outcomes or "").split(",")
        marks = ", ".join("?" for _ in outcomes)
        rows = await tx.fetch(
            "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM batch_lines"
            f" WHERE batch_id = ? AND outcome IN ({marks})",
            (batch_id, *outcomes),
        )
        count, size = int(rows[0][0]), int(rows[0][1])
        if not count:
            return None
        await tx.execute(
            f"INSERT INTO files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, 'processed', ?, ?, ?, ?)",
            (
                file.id,
                file.owner,
                float(file.created_at),
                file.purpose,
                file.filename,
                size,
                count,
                file.status_details,
                file.expires_at,
                batch_id,
                file.outcomes,
            ),
        )
        return file.id

    # ---------------------------------------------------------------- lines
    async def claim_lines(
        self, holder: str, claim: str, now: float, lease_until: float, limit: int
    ) -> list[ClaimedLine]:
        async def op(tx: Tx) -> list[ClaimedLine]:
            batches = await tx.fetch(
                "SELECT id, owner, tenant, api FROM batches WHERE status = 'in_progress' AND deadline > ?"
                " ORDER BY created_at LIMIT ?",
                (now, _CLAIM_BATCHES),
            )
            claimed: list[ClaimedLine] = []
            for batch_id, owner, tenant, api in batches:
                wanted = limit - len(claimed)
                if wanted <= 0:
                    break
                # the candidates in a CTE: evaluated once (a locking subquery in the WHERE could be
                # run again per row, each run skipping what the last one locked: more than wanted)
                taken = await tx.execute(
                    "WITH picked AS (SELECT line FROM batch_lines WHERE batch_id = ? AND outcome = 'pending'"
                    f" AND {_LEASE_FREE} ORDER BY line LIMIT ?{self.claim_lock})"
                    " UPDATE batch_lines SET holder = ?, claim = ?, lease_until = ?, attempts = attempts + 1"
                    f" WHERE batch_id = ? AND outcome = 'pending' AND {_LEASE_FREE}"
                    " AND line IN (SELECT line FROM picked)",
                    (batch_id, now, wanted, holder, claim, lease_until, batch_id, now),
                )
                if not taken:
                    continue
                rows = await tx.fetch(
                    "SELECT line, custom_id, url, body, attempts FROM batch_lines"
                    " WHERE batch_id = ? AND claim = ? ORDER BY line",
                    (batch_id, claim),
                )
                claimed += [
                    ClaimedLine(batch_id, int(line), custom_id, url, body, int(attempts), owner, tenant, api)
                    for line, custom_id, url, body, attempts in rows
                ]
            return claimed

        return await self.in_transaction(op)

    async def renew_line_leases(self, holder: str, lease_until: float) -> set[tuple[str, int, str]]:
        async def op(tx: Tx) -> set[tuple[str, int, str]]:
            await tx.execute(
                "UPDATE batch_lines SET lease_until = ? WHERE holder = ? AND outcome = 'pending'",
                (lease_until, holder),
            )
            rows = await tx.fetch(
                "SELECT batch_id, line, claim FROM batch_lines WHERE holder = ? AND outcome = 'pending'",
                (holder,),
            )
            return {(batch_id, int(line), claim) for batch_id, line, claim in rows}

        return await self.in_transaction(op)

    async def finish_line(self, batch_id: str, line: int, claim: str, result: LineResult) -> bool:
        r = result

        async def op(tx: Tx) -> bool:
            changed = await tx.execute(
                "UPDATE batch_lines SET outcome = ?, result = ?, size = ?, input_tokens = ?,"
                " cached_tokens = ?, output_tokens = ?, reasoning_tokens = ?, holder = NULL, claim = NULL,"
                " lease_until = NULL"
                " WHERE batch_id = ? AND line = ? AND claim = ? AND outcome = 'pending'",
                (
                    r.outcome,
                    r.result,
                    _size(r.result),
                    r.input_tokens,
                    r.cached_tokens,
                    r.output_tokens,
                    r.reasoning_tokens,
                    batch_id,
                    line,
                    claim,
                ),
            )
            return bool(changed)

        return await self.in_transaction(op)

    async def release_line(
        self, batch_id: str, line: int, claim: str, retry_at: float | None, *, counted: bool = True
    ) -> bool:
        async def op(tx: Tx) -> bool:
            changed = await tx.execute(
                "UPDATE batch_lines SET holder = NULL, claim = NULL, lease_until = ?, attempts = attempts - ?"
                " WHERE batch_id = ? AND line = ? AND claim = ? AND outcome = 'pending'",
                (retry_at, 0 if counted else 1, batch_id, line, claim),
            )
            return bool(changed)

        return await self.in_transaction(op)

    async def release_lines(self, holder: str) -> int:
        async def op(tx: Tx) -> int:
            return await tx.execute(
                "UPDATE batch_lines SET holder = NULL, claim = NULL, lease_until = NULL"
                " WHERE holder = ? AND outcome = 'pending'",
                (holder,),
            )

        return await self.in_transaction(op)

    async def running_batches(self, batch_ids: Sequence[str], now: float) -> set[str]:
        if not batch_ids:
            return set()
        marks = ", ".join("?" for _ in batch_ids)

        async def op(tx: Tx) -> set[str]:
            rows = await tx.fetch(
                f"SELECT id FROM batches WHERE id IN ({marks}) AND status = 'in_progress' AND deadline > ?",
                (*batch_ids, now),
            )
            return {row[0] for row in rows}

        return await self.in_transaction(op, readonly=True)

    # ---------------------------------------------------------------- retention
    async def purge_batches(self, tx: Tx, at: float) -> int:
        """Delete (in ``tx``) the files and batches whose retention ended by ``at``, with their chunks,
        lines and output files; how many files and batches."""
        deleted = await self.purge_files(tx, at)
        ended = "expires_at IS NOT NULL AND expires_at <= ?"
        expired = f"SELECT id FROM batches WHERE {ended}"
        await tx.execute(f"DELETE FROM batch_lines WHERE batch_id IN ({expired})", (at,))
        await tx.execute(f"DELETE FROM files WHERE batch_id IN ({expired})", (at,))
        deleted += await tx.execute(f"DELETE FROM batches WHERE {ended}", (at,))
        return deleted
