"""A stored response's final status is final in the store itself, on SQLite and PostgreSQL.

``update_response`` moves only a response still queued or in progress, in one conditional
statement: of a cancel and a completion racing exactly one is written, whole (a cancelled response
never has output items, a completed one always its own), and a response marked failed when its
lease ran out is never overwritten by the task that resumes. The races are run two ways: in a
fixed order (each side's outcome known), and concurrently a few hundred times through two stores
on the same database -- two replicas, each with its own connections.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from deepseek_frontend.state import (
    FINAL_RESPONSE_STATUSES,
    StateStore,
    StoredItem,
    StoredResponse,
    new_id,
    open_store_url,
    owner_key,
)

from .conftest import run_with_store

OWNER = owner_key("finality")


def _body(response_id: str, status: str) -> str:
    return json.dumps({"id": response_id, "object": "response", "status": status})


async def _queued(store: StateStore) -> str:
    rid = new_id("resp")
    body = _body(rid, "queued")
    record = StoredResponse(rid, OWNER, StateStore.now(), "queued", body, '{"background":true}')
    await store.put_response(record, [StoredItem(new_id("msg"), '{"type":"message"}')], [])
    return rid


def _outputs() -> list[StoredItem]:
    return [StoredItem(new_id("msg"), '{"type":"message","role":"assistant"}')]


async def _state(store: StateStore, rid: str) -> tuple[str, str, int]:
    """(status column, body's status, output items stored)."""
    got = await store.get_response(OWNER, rid)
    assert got is not None
    page = await store.list_response_items(OWNER, rid, "output", limit=100)
    assert page is not None
    return got.status, json.loads(got.body)["status"], len(page.items)


@pytest.mark.parametrize("final", sorted(FINAL_RESPONSE_STATUSES))
def test_no_transition_leaves_a_final_status(store_url: str, final: str) -> None:
    async def body(store: StateStore) -> None:
        rid = await _queued(store)
        assert await store.update_response(OWNER, rid, "in_progress", _body(rid, "in_progress"), None)
        outputs = _outputs() if final in ("completed", "incomplete") else None
        assert await store.update_response(OWNER, rid, final, _body(rid, final), outputs)
        before = await _state(store, rid)
        for status in ("in_progress", "completed", "cancelled", "failed", "incomplete", "queued"):
            assert not await store.update_response(OWNER, rid, status, _body(rid, status), _outputs())
            assert await _state(store, rid) == before
        assert not await store.touch_response(OWNER, rid)

    run_with_store(store_url, body)


def test_a_completion_after_a_cancel_writes_nothing_and_the_reverse(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        first = await _queued(store)
        assert await store.update_response(OWNER, first, "cancelled", _body(first, "cancelled"), None)
        late = _body(first, "completed")
        assert not await store.update_response(OWNER, first, "completed", late, _outputs())
        assert await _state(store, first) == ("cancelled", "cancelled", 0)

        second = await _queued(store)
        assert await store.update_response(OWNER, second, "completed", _body(second, "completed"), _outputs())
        assert not await store.update_response(OWNER, second, "cancelled", _body(second, "cancelled"), None)
        assert await _state(store, second) == ("completed", "completed", 1)

    run_with_store(store_url, body)


def test_a_lost_lease_is_marked_failed_only_when_not_renewed_and_stays_failed(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        rid = await _queued(store)
        assert await store.update_response(OWNER, rid, "in_progress", _body(rid, "in_progress"), None)
        renewed = await store.get_response(OWNER, rid)
        assert renewed is not None and renewed.updated_at is not None
        # the task renewed its lease after the reader decided it was stale: the mark is not written
        stale_before = renewed.updated_at - 1.0
        assert not await store.update_response(
            OWNER, rid, "failed", _body(rid, "failed"), None, renewed_before=stale_before
        )
        assert (await _state(store, rid))[0] == "in_progress"
        # not renewed since: marked failed
        assert await store.update_response(
            OWNER, rid, "failed", _body(rid, "failed"), None, renewed_before=renewed.updated_at + 1.0
        )
        # the paused replica resumes: neither its renewal nor its completion is written
        assert not await store.touch_response(OWNER, rid)
        assert not await store.update_response(OWNER, rid, "completed", _body(rid, "completed"), _outputs())
        assert await _state(store, rid) == ("failed", "failed", 0)

    run_with_store(store_url, body)


#: concurrent races per backend: a few hundred, each a fresh response
RACES = {"sqlite": 300, "postgresql": 200}


def test_cancel_and_completion_racing_leave_one_consistent_answer(store_url: str) -> None:
    """Two stores on one database (two replicas): one completes each response while the other
    cancels it, at once. Exactly one of them is told it won, and the stored response is that
    one's, whole."""
    races = RACES["sqlite" if store_url.startswith("sqlite") else "postgresql"]

    async def main() -> tuple[int, int]:
        generator, canceller = await open_store_url(store_url), await open_store_url(store_url)
        try:
            won = {"completed": 0, "cancelled": 0}
            for _ in range(races):
                rid = await _queued(generator)
                completed, cancelled = await asyncio.gather(
                    generator.update_response(OWNER, rid, "completed", _body(rid, "completed"), _outputs()),
                    canceller.update_response(OWNER, rid, "cancelled", _body(rid, "cancelled"), None),
                )
                assert completed != cancelled, "exactly one transition is written"
                status = "completed" if completed else "cancelled"
                won[status] += 1
                expected = (status, status, 1 if completed else 0)
                assert await _state(generator, rid) == expected
                assert await _state(canceller, rid) == expected
            return won["completed"], won["cancelled"]
        finally:
            await generator.close()
            await canceller.close()

    completed, cancelled = asyncio.run(asyncio.wait_for(main(), 300))
    assert completed + cancelled == races
    print(f"{store_url.split(':')[0]}: {races} races, completion won {completed}, cancel won {cancelled}")
