"""The files and batches of the store, on SQLite and PostgreSQL: chunks, pages, owners, leases and
one result per line."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from deepseek_frontend.state import (
    BatchLineRecord,
    CursorError,
    LineResult,
    Retention,
    StateStore,
    StoredBatch,
    StoredFile,
    new_id,
    owner_key,
)

from .conftest import run_with_store

ALICE = owner_key("alice")
BOB = owner_key("bob")


async def _upload(store: StateStore, owner: str, parts: list[bytes], at: float | None = None) -> StoredFile:
    now = store.now() if at is None else at
    file = StoredFile(new_id("file"), owner, now, "batch", "in.jsonl")
    await store.begin_file(file)
    assert await store.get_file(owner, file.id) is None  # invisible while uploading
    for seq, part in enumerate(parts):
        await store.put_file_chunk(file.id, seq, part)
    size = sum(map(len, parts))
    assert await store.finish_file(
        owner, file.id, filename="in.jsonl", size=size, lines=2, status_details=None, expires_at=None
    )
    stored = await store.get_file(owner, file.id)
    assert stored is not None
    return stored


def _batch(owner: str, now: float, *, status: str = "in_progress", window: float = 3600.0) -> StoredBatch:
    return StoredBatch(
        id=new_id("batch"),
        owner=owner,
        api="openai",
        tenant="alice",
        endpoint="/v1/chat/completions",
        completion_window="1h",
        status=status,
        created_at=now,
        deadline=now + window,
        times={"in_progress": now} if status == "in_progress" else {},
    )


def _lines(n: int) -> list[BatchLineRecord]:
    return [BatchLineRecord(i + 1, f"c{i + 1}", "/v1/chat/completions", f'{{"n": {i}}}') for i in range(n)]


def test_files_are_chunked_paged_and_owned(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        raw = [b'{"a": 1}\n', b"\x00\xff binary-safe\n"]
        file = await _upload(store, ALICE, raw)
        assert (file.bytes, file.lines, file.status) == (sum(map(len, raw)), 2, "processed")
        chunks = await store.file_chunks(file.id, 0, 10)
        assert b"".join(data for _, data in chunks) == b"".join(raw)
        assert await store.file_chunks(file.id, 1, 10) == [(1, raw[1])]
        assert await store.get_file(BOB, file.id) is None
        assert not await store.delete_file(BOB, file.id)

        others = [await _upload(store, ALICE, [b"x\n"], at=file.created_at + i + 1) for i in range(3)]
        page, more = await store.list_files(ALICE, purpose=None, after=None, limit=2, order="desc")
        assert [f.id for f in page] == [others[2].id, others[1].id] and more
        page, more = await store.list_files(ALICE, purpose="batch", after=page[-1].id, limit=5, order="desc")
        assert [f.id for f in page] == [others[0].id, file.id] and not more
        page, _ = await store.list_files(ALICE, purpose=None, after=None, limit=10, order="asc")
        assert page[0].id == file.id
        outputs, _ = await store.list_files(ALICE, purpose="batch_output", after=None, limit=5, order="asc")
        assert outputs == []
        assert (await store.list_files(BOB, purpose=None, after=None, limit=5, order="asc"))[0] == []
        with pytest.raises(CursorError):
            await store.list_files(ALICE, purpose=None, after="file-nope", limit=5, order="asc")

        assert await store.delete_file(ALICE, file.id)
        assert await store.get_file(ALICE, file.id) is None
        assert await store.file_chunks(file.id, 0, 10) == []

    run_with_store(store_url, body)


def test_active_batches_are_limited_per_owner(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        now = store.now()
        assert await store.create_batch(_batch(ALICE, now), _lines(1), max_active=2)
        assert await store.create_batch(_batch(ALICE, now + 1, status="validating"), [], max_active=2)
        assert not await store.create_batch(_batch(ALICE, now + 2), [], max_active=2)
        assert await store.create_batch(_batch(BOB, now), [], max_active=2)
        page, more = await store.list_batches(ALICE, "openai", after=None, before=None, limit=1)
        assert page[0].status == "validating" and more
        older, more = await store.list_batches(ALICE, "openai", after=page[0].id, before=None, limit=5)
        assert len(older) == 1 and not more
        newer, _ = await store.list_batches(ALICE, "openai", after=None, before=older[0].id, limit=5)
        assert [b.id for b in newer] == [page[0].id]
        assert (await store.list_batches(ALICE, "anthropic", after=None, before=None, limit=5))[0] == []

        cancelled = await store.cancel_batch(ALICE, "openai", older[0].id, now + 5)
        assert cancelled is not None and cancelled.status == "cancelling"
        assert cancelled.times["cancelling"] == now + 5
        assert await store.cancel_batch(BOB, "openai", older[0].id, now) is None

    run_with_store(store_url, body)


def test_a_line_is_claimed_once_and_has_one_result(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        now = store.now()
        batch = _batch(ALICE, now)
        await store.create_batch(batch, _lines(5), None)
        # two runners claiming at once never get the same line
        first, second = await asyncio.gather(
            store.claim_lines("r1", "k1", now, now + 30, 3), store.claim_lines("r2", "k2", now, now + 30, 3)
        )
        lines = [c.line for c in first] + [c.line for c in second]
        assert sorted(lines) == sorted(set(lines)) and len(lines) == 5
        held_by_r1 = first[0] if first else None
        assert held_by_r1 is not None and held_by_r1.attempts == 1 and held_by_r1.owner == ALICE

        ok = LineResult("succeeded", '{"ok": 1}', input_tokens=3, output_tokens=4)
        assert await store.finish_line(batch.id, held_by_r1.line, "k1", ok)
        assert not await store.finish_line(batch.id, held_by_r1.line, "k1", ok)  # written once
        assert not await store.finish_line(batch.id, second[0].line, "k1", ok)  # not k1's line

        # r2 dies: its leases run out and r3 takes its lines over; r2's late results are refused
        later = now + 31
        taken = await store.claim_lines("r3", "k3", later, later + 30, 10)
        assert {c.line for c in taken} == {c.line for c in second} | {c.line for c in first[1:]}
        assert all(c.attempts == 2 for c in taken)
        assert not await store.finish_line(batch.id, second[0].line, "k2", ok)
        assert await store.renew_line_leases("r3", later + 60) == {(batch.id, c.line, "k3") for c in taken}
        assert await store.renew_line_leases("r2", later + 60) == set()

        # a line given back for a retry waits until its retry time
        retry = taken[0]
        assert await store.release_line(batch.id, retry.line, "k3", later + 10)
        assert await store.claim_lines("r4", "k4", later + 1, later + 30, 10) == []
        again = await store.claim_lines("r4", "k5", later + 11, later + 40, 10)
        assert [c.line for c in again] == [retry.line]

        counts = (await store.batch_counts([batch.id]))[batch.id]
        assert (counts.pending, counts.succeeded, counts.total) == (4, 1, 5)
        assert (counts.input_tokens, counts.output_tokens) == (3, 4)
        assert await store.release_lines("r3") == len(taken) - 1

    run_with_store(store_url, body)


def test_batch_work_is_leased_and_fenced(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        now = store.now()
        validating = _batch(ALICE, now, status="validating")
        await store.create_batch(validating, [], None)
        claimed = await store.claim_batch_work("r1", now, now + 30)
        assert claimed is not None and claimed.id == validating.id
        assert await store.claim_batch_work("r2", now, now + 30) is None  # leased
        assert await store.add_batch_lines(validating.id, "r1", now + 30, _lines(2))
        # r1 stalls; r2 takes over, starts over, and r1's writes are refused from then on
        took = await store.claim_batch_work("r2", now + 31, now + 61)
        assert took is not None and took.id == validating.id
        assert not await store.add_batch_lines(validating.id, "r1", now + 60, _lines(3))
        assert await store.reset_batch_lines(validating.id, "r2")
        error = BatchLineRecord(3, None, "", "", "errored", '{"error": "bad line"}')
        assert await store.add_batch_lines(validating.id, "r2", now + 61, [*_lines(2), error])
        assert not await store.start_batch(validating.id, "r1", 3, now + 32)
        assert await store.start_batch(validating.id, "r2", 3, now + 32)
        started = await store.get_batch(ALICE, "openai", validating.id)
        assert started is not None and started.status == "in_progress" and started.total == 3

        # one line done, then the batch is cancelled: the pending line is rendered as canceled
        (line, *_) = await store.claim_lines("r3", "k", now + 33, now + 63, 1)
        await store.finish_line(validating.id, line.line, "k", LineResult("succeeded", '{"line": 1}'))
        await store.cancel_batch(ALICE, "openai", validating.id, now + 34)
        ending = await store.claim_batch_work("r4", now + 35, now + 65)
        assert ending is not None and ending.status == "cancelling"

        def render(number: int, custom_id: str | None, outcome: str) -> str:
            return f'{{"line": {number}, "custom_id": "{custom_id}", "outcome": "{outcome}"}}'

        output = StoredFile("file-out", ALICE, now + 36, "batch_output", "out.jsonl", outcomes="succeeded")
        errors = StoredFile(
            "file-err", ALICE, now + 36, "batch_output", "err.jsonl", outcomes="errored,canceled,expired"
        )
        assert await store.end_batch(
            validating.id,
            "r4",
            "cancelled",
            now + 36,
            pending_outcome="canceled",
            render=render,
            output_file=output,
            error_file=errors,
        )
        done = await store.get_batch(ALICE, "openai", validating.id)
        assert done is not None and done.status == "cancelled" and done.times["cancelled"] == now + 36
        assert (done.output_file_id, done.error_file_id) == ("file-out", "file-err")
        out = await store.get_file(ALICE, "file-out")
        assert out is not None and out.lines == 1 and out.bytes == len('{"line": 1}') + 1
        results = await store.line_results(validating.id, ["errored", "canceled", "expired"], 0, 10)
        assert [number for number, _ in results] == [2, 3]
        assert results[0][1] == '{"line": 2, "custom_id": "c2", "outcome": "canceled"}'
        assert await store.claim_batch_work("r5", now + 100, now + 130) is None  # nothing left to do

        assert await store.delete_batch(ALICE, "openai", validating.id)
        assert await store.get_file(ALICE, "file-out") is None
        assert await store.line_results(validating.id, ["succeeded"], 0, 10) == []

    run_with_store(store_url, body)


def test_expired_files_and_batches_are_purged(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        now = store.now()
        file = StoredFile(new_id("file"), ALICE, now, "batch", "in.jsonl")
        await store.begin_file(file)
        await store.put_file_chunk(file.id, 0, b"{}\n")
        await store.finish_file(
            ALICE, file.id, filename="in.jsonl", size=3, lines=1, status_details=None, expires_at=now + 10
        )
        batch = dataclasses.replace(_batch(ALICE, now), expires_at=now + 10)
        await store.create_batch(batch, _lines(2), None)
        assert await store.purge(now + 5) == 0
        assert await store.purge(now + 11) == 2
        assert await store.get_file(ALICE, file.id) is None
        assert await store.file_chunks(file.id, 0, 10) == []
        assert (await store.batch_counts([batch.id]))[batch.id].total == 0

    run_with_store(store_url, body, Retention(ttl_s=None, max_bytes=None))
