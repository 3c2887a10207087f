"""A batch's batch-level work, done by whichever runner leased it (``state.claim_batch_work``).

* ``validating`` -> ``in_progress``: the input file is read line by line into the batch's lines
  (:func:`~.lines.openai_line`), a group at a time; each group's write also renews the lease, and
  is refused once the lease moved on (a runner that stalled and lost it stops). A runner that
  takes over a validation starts it over.
* ``in_progress`` with every line done -> ``finalizing`` -> ``completed``; past its deadline ->
  ``expired``; ``cancelling`` -> ``cancelled``. The end is one transaction: lines still pending get
  their ``expired`` / ``canceled`` result, the output and error files are stored (OpenAI), the
  batch takes its final status.
* An input file deleted before its batch read it -> ``failed``, with the reason in ``errors``.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from deepseek_frontend.state import BatchLineRecord, StateStore, StoredBatch, StoredFile, new_id

from .lines import file_lines, openai_line
from .results import anthropic_unrun_line, openai_unrun_line

__all__ = ["do_batch_work", "output_file_id"]

log = logging.getLogger("deepseek_frontend.batches")

#: lines written per transaction while a batch's file is read
LINES_PER_WRITE = 256


def output_file_id() -> str:
    """An OpenAI-looking file id (``file-`` and 48 random hex digits)."""
    return new_id("file").replace("_", "-", 1)


async def do_batch_work(store: StateStore, batch: StoredBatch, holder: str, lease_s: float) -> None:
    """Do the batch-level work ``batch`` (leased by ``holder``) is waiting for; see the module
    docstring. A lease lost on the way ends the work quietly: its successor does it."""
    now = store.now()
    if batch.status == "validating" and now < batch.deadline:
        await _validate(store, batch, holder, lease_s)
    elif batch.status in ("validating", "in_progress") and now >= batch.deadline:
        await _end(store, batch, holder, "expired", "expired")
    elif batch.status == "cancelling":
        await _end(store, batch, holder, "cancelled", "canceled")
    elif batch.status in ("in_progress", "finalizing"):
        if batch.status == "in_progress" and not await store.set_batch_status(
            batch.id, holder, "finalizing", now
        ):
            return
        await _end(store, batch, holder, "completed", None)


async def _validate(store: StateStore, batch: StoredBatch, holder: str, lease_s: float) -> None:
    file = await store.get_file(batch.owner, batch.input_file_id or "")
    if file is None:
        error = {
            "code": "invalid_input_file",
            "message": f"the input file {batch.input_file_id} was deleted before the batch read it",
            "param": "input_file_id",
            "line": None,
        }
        await _end(store, batch, holder, "failed", None, errors=[error])
        return
    if not await store.reset_batch_lines(batch.id, holder):
        return
    seen: dict[str, int] = {}
    group: list[BatchLineRecord] = []
    total = 0
    async for number, raw in file_lines(store, file.id):
        group.append(openai_line(number, raw, batch.endpoint, seen))
        if len(group) >= LINES_PER_WRITE:
            if not await store.add_batch_lines(batch.id, holder, store.now() + lease_s, group):
                await _give_up(store, batch, holder)
                return
            total += len(group)
            group = []
            await asyncio.sleep(0)  # the loop serves requests between groups
    if group and not await store.add_batch_lines(batch.id, holder, store.now() + lease_s, group):
        await _give_up(store, batch, holder)
        return
    total += len(group)
    if await store.start_batch(batch.id, holder, total, store.now()):
        log.info("batch %s: %d lines to run", batch.id, total)
    else:
        await _give_up(store, batch, holder)


async def _give_up(store: StateStore, batch: StoredBatch, holder: str) -> None:
    """A validation that stopped (the batch was cancelled meanwhile, or the lease moved on): the
    lease, if still ours, is given up at once, so the batch's next step need not wait for it."""
    await store.renew_batch_lease(batch.id, holder, store.now() - 1)


async def _end(
    store: StateStore,
    batch: StoredBatch,
    holder: str,
    status: str,
    pending_outcome: str | None,
    errors: list[dict[str, object]] | None = None,
) -> None:
    now = store.now()
    output = error = None
    if batch.api == "openai":
        output, error = (
            StoredFile(
                output_file_id(),
                batch.owner,
                now,
                "batch_output",
                f"{batch.id}_{kind}.jsonl",
                expires_at=batch.expires_at,
                outcomes=outcomes,
            )
            for kind, outcomes in (("output", "succeeded"), ("error", "errored,canceled,expired"))
        )
    render = anthropic_unrun_line if batch.api == "anthropic" else openai_unrun_line
    ended = await store.end_batch(
        batch.id,
        holder,
        status,
        now,
        errors=orjson.dumps(errors).decode() if errors else None,
        pending_outcome=pending_outcome,
        render=render,
        output_file=output,
        error_file=error,
    )
    if ended:
        log.info("batch %s %s", batch.id, status)
