"""The storage interface of the Files and Batch APIs: part of every :class:`~.store.StateStore`.

Files and batches are owned like every stored object (an object of another owner is simply not
there). Besides what the endpoints read and write, the interface carries the work-sharing the
batch runners of several processes and replicas do over one store:

* **Leases.** A runner claims work with a lease that ends at ``lease_until`` unless renewed: a
  batch's batch-level work (:meth:`BatchStore.claim_batch_work`: reading its input file into lines,
  finishing it), or a chunk of its pending lines (:meth:`BatchStore.claim_lines`). A lease that is
  not renewed (its process died) runs out, and another runner claims the work.
* **One result per line.** A line's result is written only by the claim that holds it and only
  while the line is pending (:meth:`BatchStore.finish_line`): a line runs again after a crash only
  when it has no result, and a late writer whose lease was taken over writes nothing.
* **Fenced batch work.** Every write of batch-level work names its holder and is refused once the
  lease has moved on, so a stalled runner cannot clobber its successor's work.

:class:`~.store.NullStore` keeps none of this: its methods raise (the APIs refuse batches on a
store that is not ``enabled`` before calling them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .batch_records import BatchCounts, BatchLineRecord, ClaimedLine, LineResult, StoredBatch, StoredFile
from .records import Order

__all__ = ["BatchStore", "StoreDisabledError"]


class StoreDisabledError(RuntimeError):
    """Files and batches asked of a store that keeps nothing (``--state-store none``)."""


def _disabled() -> StoreDisabledError:
    return StoreDisabledError("this state store keeps no files or batches (--state-store none)")


class BatchStore:
    """Files, batches and batch lines. All methods are coroutines; see the module docstring."""

    # ---------------------------------------------------------------- files
    async def begin_file(self, file: StoredFile) -> None:
        """Create ``file`` as ``uploading`` (invisible to reads until :meth:`finish_file`); an upload
        that never finishes is purged a day later."""
        raise _disabled()

    async def put_file_chunk(self, file_id: str, seq: int, data: bytes) -> None:
        """Store the ``seq``-th chunk of an uploading file's bytes."""
        raise _disabled()

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
        """Make an uploaded file visible with its name, size and line count; False when it is not there."""
        raise _disabled()

    async def get_file(self, owner: str, file_id: str) -> StoredFile | None:
        raise _disabled()

    async def list_files(
        self, owner: str, *, purpose: str | None, after: str | None, limit: int, order: Order
    ) -> tuple[list[StoredFile], bool]:
        """One page of the owner's files by creation time, and whether more follow; raises
        :class:`~.store.CursorError` for an ``after`` that is not one of them."""
        raise _disabled()

    async def delete_file(self, owner: str, file_id: str) -> bool:
        """Delete a file (an uploaded one with its bytes, also one still uploading); False when it is not
        there."""
        raise _disabled()

    async def file_chunks(self, file_id: str, first_seq: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` chunks of an uploaded file from ``first_seq`` on, in order (the caller
        has found the file with :meth:`get_file`)."""
        raise _disabled()

    async def line_results(
        self, batch_id: str, outcomes: Sequence[str], after_line: int, limit: int
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` results ``(line, JSON line)`` of a batch's lines whose outcome is one of
        ``outcomes``, after line ``after_line``, in line order."""
        raise _disabled()

    # ---------------------------------------------------------------- batches
    async def create_batch(
        self, batch: StoredBatch, lines: Sequence[BatchLineRecord], max_active: int | None
    ) -> bool:
        """Store a batch (with its lines, when already known) unless its owner already has
        ``max_active`` batches that are not finished (None: no limit); whether it was stored."""
        raise _disabled()

    async def get_batch(self, owner: str, api: str, batch_id: str) -> StoredBatch | None:
        raise _disabled()

    async def list_batches(
        self, owner: str, api: str, *, after: str | None, before: str | None, limit: int
    ) -> tuple[list[StoredBatch], bool]:
        """One page of the owner's batches of ``api``, newest first, strictly after ``after`` (or
        before ``before``), and whether more follow; raises ``CursorError`` for an unknown cursor."""
        raise _disabled()

    async def batch_counts(self, batch_ids: Sequence[str]) -> dict[str, BatchCounts]:
        """Each batch's lines by outcome and the tokens they used."""
        raise _disabled()

    async def cancel_batch(self, owner: str, api: str, batch_id: str, now: float) -> StoredBatch | None:
        """Mark a validating or running batch ``cancelling`` (a finished one is left as it is); the
        batch as it is then, None when it is not there."""
        raise _disabled()

    async def delete_batch(self, owner: str, api: str, batch_id: str) -> bool:
        """Delete a batch, its lines and its output files; False when it is not there."""
        raise _disabled()

    # ---------------------------------------------------------------- batch-level work (runners)
    async def claim_batch_work(self, holder: str, now: float, lease_until: float) -> StoredBatch | None:
        """Lease one batch with batch-level work to do and no live lease: ``validating`` (read its
        input file into lines), ``cancelling``, ``finalizing``, or ``in_progress`` with no pending
        line or past its deadline (finish it); None when there is none."""
        raise _disabled()

    async def renew_batch_lease(self, batch_id: str, holder: str, lease_until: float) -> bool:
        """Extend ``holder``'s lease on a batch (to now: give it up); False when it is no longer
        ``holder``'s."""
        raise _disabled()

    async def reset_batch_lines(self, batch_id: str, holder: str) -> bool:
        """Delete a validating batch's lines (a validation starting over); False without the lease."""
        raise _disabled()

    async def add_batch_lines(
        self, batch_id: str, holder: str, lease_until: float, lines: Sequence[BatchLineRecord]
    ) -> bool:
        """Add lines to a validating batch and renew the lease, in one transaction; False (nothing
        added) when the lease is no longer ``holder``'s or the batch no longer validating."""
        raise _disabled()

    async def set_batch_status(self, batch_id: str, holder: str, status: str, now: float) -> bool:
        """Move a leased batch to ``status`` (recording when); False without the lease."""
        raise _disabled()

    async def start_batch(self, batch_id: str, holder: str, total: int, now: float) -> bool:
        """A validated batch of ``total`` lines: ``in_progress``, its lease released."""
        raise _disabled()

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
        """Finish a leased batch in one transaction: every line still pending gets
        ``pending_outcome`` and the result ``render(line, custom_id, outcome)``; ``output_file`` and
        ``error_file`` (views of its results by outcome) are stored when they list any line; the
        batch takes its final ``status`` (and ``errors``) with its time, and its lease is released.
        False when the lease is no longer ``holder``'s."""
        raise _disabled()

    # ---------------------------------------------------------------- lines (runners)
    async def claim_lines(
        self, holder: str, claim: str, now: float, lease_until: float, limit: int
    ) -> list[ClaimedLine]:
        """Lease up to ``limit`` pending lines of running batches (oldest batch first, in line
        order) whose lease is free, under the claim id ``claim``."""
        raise _disabled()

    async def renew_line_leases(self, holder: str, lease_until: float) -> set[tuple[str, int, str]]:
        """Extend every lease ``holder`` still has on pending lines; those lines as
        ``(batch_id, line, claim)`` (a line missing was taken over or ended meanwhile)."""
        raise _disabled()

    async def finish_line(self, batch_id: str, line: int, claim: str, result: LineResult) -> bool:
        """Write a line's one result, if the line is pending and ``claim`` still holds it; whether
        it was written."""
        raise _disabled()

    async def release_line(
        self, batch_id: str, line: int, claim: str, retry_at: float | None, *, counted: bool = True
    ) -> bool:
        """Give a line back without a result, to be claimed again from ``retry_at`` on (None: at once);
        not ``counted``: this run does not count among its attempts (the server was busy)."""
        raise _disabled()

    async def release_lines(self, holder: str) -> int:
        """Give back every line ``holder`` holds (a runner stopping); how many."""
        raise _disabled()

    async def running_batches(self, batch_ids: Sequence[str], now: float) -> set[str]:
        """Those of ``batch_ids`` still running (``in_progress`` and before their deadline)."""
        raise _disabled()
