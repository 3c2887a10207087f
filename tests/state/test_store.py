"""The storage interface, the same tests on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import json

import pytest

from deepseek_frontend.state import (
    BrokenChainError,
    CursorError,
    Retention,
    StateStore,
    StoredConversation,
    StoredItem,
    StoredResponse,
    new_id,
    owner_key,
)

from .conftest import run_with_store

ALICE = owner_key("alice-key")
BOB = owner_key("bob-key")


def item(text: str, prefix: str = "msg") -> StoredItem:
    item_id = new_id(prefix)
    # key order and spacing a JSON round trip would change: the store must keep them as written
    data = '{"type":"message", "id":"' + item_id + '","role":"user","content":' + json.dumps(text) + "}"
    return StoredItem(item_id, data)


def response(owner: str, previous: str | None = None, created: float | None = None) -> StoredResponse:
    rid = new_id("resp")
    body = json.dumps({"id": rid, "object": "response", "status": "completed"})
    return StoredResponse(
        rid, owner, created or StateStore.now(), "completed", body, '{"model":"m"}', previous
    )


def test_response_round_trip_keeps_items_byte_for_byte(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        r = response(ALICE)
        inputs = [item("hi"), item("ünïcode ✓ \u2028")]
        outputs = [item("answer", "msg")]
        await store.put_response(r, inputs, outputs)
        got = await store.get_response(ALICE, r.id)
        assert got is not None
        assert (got.id, got.owner, got.status, got.body, got.request) == (
            r.id,
            ALICE,
            "completed",
            r.body,
            r.request,
        )
        assert await store.history(ALICE, r.id) == [*inputs, *outputs]
        page = await store.list_response_items(ALICE, r.id, "input", order="asc")
        assert page is not None and page.items == inputs
        assert await store.find_item(ALICE, outputs[0].item_id) == outputs[0]
        assert await store.delete_response(ALICE, r.id)
        assert await store.get_response(ALICE, r.id) is None
        assert await store.find_item(ALICE, outputs[0].item_id) is None
        assert not await store.delete_response(ALICE, r.id)

    run_with_store(store_url, body)


def test_other_owner_sees_nothing(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        r = response(ALICE)
        inputs = [item("secret")]
        await store.put_response(r, inputs, [])
        conv = StoredConversation(new_id("conv"), ALICE, StateStore.now())
        await store.put_conversation(conv, [item("c")])
        await store.put_reasoning(ALICE, "fp", "thoughts")
        assert await store.get_response(BOB, r.id) is None
        assert await store.history(BOB, r.id) is None
        assert await store.list_response_items(BOB, r.id, "input") is None
        assert await store.find_item(BOB, inputs[0].item_id) is None
        assert not await store.delete_response(BOB, r.id)
        assert not await store.update_response(BOB, r.id, "failed", "{}", None)
        assert await store.get_conversation(BOB, conv.id) is None
        assert await store.conversation_items(BOB, conv.id) is None
        assert not await store.add_conversation_items(BOB, conv.id, [item("x")])
        assert not await store.delete_conversation(BOB, conv.id)
        assert await store.get_reasoning(BOB, "fp") is None
        # and the owner's objects are all still there
        assert await store.get_response(ALICE, r.id) is not None
        assert len(await store.conversation_items(ALICE, conv.id) or []) == 1
        assert await store.get_reasoning(ALICE, "fp") == "thoughts"

    run_with_store(store_url, body)


def test_pagination_follows_openai_cursors(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        r = response(ALICE)
        items = [item(f"m{i}") for i in range(5)]
        await store.put_response(r, items, [])
        ids = [i.item_id for i in items]
        page = await store.list_response_items(ALICE, r.id, "input", limit=2)  # desc by default
        assert page is not None
        assert [i.item_id for i in page.items] == [ids[4], ids[3]] and page.has_more
        assert (page.first_id, page.last_id) == (ids[4], ids[3])
        page = await store.list_response_items(ALICE, r.id, "input", limit=2, after=page.last_id)
        assert page is not None and [i.item_id for i in page.items] == [ids[2], ids[1]] and page.has_more
        page = await store.list_response_items(ALICE, r.id, "input", limit=2, after=page.last_id)
        assert page is not None and [i.item_id for i in page.items] == [ids[0]] and not page.has_more
        page = await store.list_response_items(ALICE, r.id, "input", order="asc", after=ids[1], before=ids[4])
        assert page is not None and [i.item_id for i in page.items] == [ids[2], ids[3]] and not page.has_more
        page = await store.list_response_items(ALICE, r.id, "output")
        assert page is not None and page.items == [] and page.first_id is None
        with pytest.raises(CursorError) as err:
            await store.list_response_items(ALICE, r.id, "input", after="msg_unknown")
        assert err.value.param == "after"

    run_with_store(store_url, body)


def test_history_walks_the_chain_and_refuses_a_broken_one(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        first, second, third = response(ALICE), None, None
        turns = [([item("q1")], [item("a1")])]
        await store.put_response(first, *turns[0])
        second = response(ALICE, first.id)
        turns.append(([item("q2")], [item("a2"), item("call", "fc")]))
        await store.put_response(second, *turns[1])
        third = response(ALICE, second.id)
        turns.append(([item("q3")], []))
        await store.put_response(third, *turns[2])
        expected = [it for inputs, outputs in turns for it in (*inputs, *outputs)]
        assert await store.history(ALICE, third.id) == expected
        assert await store.history(ALICE, second.id) == expected[:5]
        assert await store.history(BOB, third.id) is None
        await store.delete_response(ALICE, second.id)
        with pytest.raises(BrokenChainError) as err:
            await store.history(ALICE, third.id)
        assert err.value.missing_id == second.id

    run_with_store(store_url, body)


def test_update_response_replaces_status_body_and_outputs(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        r = StoredResponse(new_id("resp"), ALICE, StateStore.now(), "queued", '{"status":"queued"}')
        await store.put_response(r, [item("q")], [])
        out = [item("done")]
        assert await store.update_response(ALICE, r.id, "completed", '{"status":"completed"}', out)
        got = await store.get_response(ALICE, r.id)
        assert got is not None and (got.status, got.body) == ("completed", '{"status":"completed"}')
        page = await store.list_response_items(ALICE, r.id, "output")
        assert page is not None and page.items == out
        assert await store.stored_bytes() == len(got.body) + len(got.request) + len(out[0].data) + len(
            (await store.history(ALICE, r.id) or [])[0].data
        )

    run_with_store(store_url, body)


def test_conversation_items_create_list_get_delete(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        conv = StoredConversation(new_id("conv"), ALICE, StateStore.now(), '{"topic":"demo"}')
        first = [item("a"), item("b")]
        await store.put_conversation(conv, first)
        more = [item("c")]
        assert await store.add_conversation_items(ALICE, conv.id, more)
        assert await store.conversation_items(ALICE, conv.id) == [*first, *more]
        page = await store.list_conversation_items(ALICE, conv.id, limit=2)
        assert page is not None and page.items == [more[0], first[1]] and page.has_more
        assert await store.get_conversation_item(ALICE, conv.id, first[0].item_id) == first[0]
        assert await store.find_item(ALICE, first[1].item_id) == first[1]
        assert await store.delete_conversation_item(ALICE, conv.id, first[0].item_id)
        assert not await store.delete_conversation_item(ALICE, conv.id, first[0].item_id)
        assert await store.conversation_items(ALICE, conv.id) == [first[1], more[0]]
        assert await store.update_conversation(ALICE, conv.id, '{"topic":"other"}')
        got = await store.get_conversation(ALICE, conv.id)
        assert got is not None and got.metadata == '{"topic":"other"}'
        assert await store.stored_bytes() == len('{"topic":"other"}') + len(first[1].data) + len(more[0].data)
        assert await store.delete_conversation(ALICE, conv.id)
        assert await store.get_conversation(ALICE, conv.id) is None
        assert await store.stored_bytes() == 0

    run_with_store(store_url, body)


def test_concurrent_appends_get_distinct_places(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        conv = StoredConversation(new_id("conv"), ALICE, StateStore.now())
        await store.put_conversation(conv, [])
        batches = [[item(f"{n}-{k}") for k in range(3)] for n in range(24)]
        assert all(await asyncio.gather(*(store.add_conversation_items(ALICE, conv.id, b) for b in batches)))
        stored = await store.conversation_items(ALICE, conv.id) or []
        assert len(stored) == 72
        # each batch stays together and in its order
        for batch in batches:
            start = stored.index(batch[0])
            assert stored[start : start + 3] == batch

    run_with_store(store_url, body)


def test_expired_objects_are_invisible_then_purged(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        r = response(ALICE)
        await store.put_response(r, [item("old")], [])
        conv = StoredConversation(new_id("conv"), ALICE, StateStore.now())
        await store.put_conversation(conv, [item("c")])
        await store.put_reasoning(ALICE, "fp", "thoughts")
        later = StateStore.now() + 120
        store.now = lambda: later  # type: ignore[method-assign]
        assert await store.get_response(ALICE, r.id) is None
        assert await store.get_conversation(ALICE, conv.id) is None
        assert await store.get_reasoning(ALICE, "fp") is None
        assert await store.purge(later) == 3
        assert await store.stored_bytes() == 0

    run_with_store(store_url, body, Retention(ttl_s=60, max_bytes=None))


def test_size_budget_evicts_the_oldest_at_each_write(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        start = StateStore.now()
        made = []
        for n in range(6):
            r = response(ALICE, created=start + n)
            await store.put_response(r, [item("x" * 400)], [])
            made.append(r)
            assert await store.stored_bytes() <= 2000  # held by the write itself, not a later purge
        alive = [await store.get_response(ALICE, r.id) is not None for r in made]
        kept = alive.count(True)
        assert 0 < kept < 6 and alive == [False] * (6 - kept) + [True] * kept  # the oldest went first
        assert await store.purge() == 0  # nothing left over for the purge

    run_with_store(store_url, body, Retention(ttl_s=None, max_bytes=2000))


def test_reasoning_is_kept_per_owner_and_replaced(store_url: str) -> None:
    async def body(store: StateStore) -> None:
        await store.put_reasoning(ALICE, "turn-1", "first")
        await store.put_reasoning(ALICE, "turn-1", "second")
        await store.put_reasoning(BOB, "turn-1", "bob's")
        assert await store.get_reasoning(ALICE, "turn-1") == "second"
        assert await store.get_reasoning(BOB, "turn-1") == "bob's"
        assert await store.get_reasoning(ALICE, "turn-2") is None
        await store.put_reasoning(ALICE, "turn-3", "third")
        assert await store.get_reasonings(ALICE, ["turn-1", "turn-2", "turn-3"]) == {
            "turn-1": "second",
            "turn-3": "third",
        }
        assert await store.get_reasonings(BOB, ["turn-3"]) == {}
        assert await store.get_reasonings(ALICE, []) == {}

    run_with_store(store_url, body)


def test_ids_are_random_and_owner_keys_hide_the_key() -> None:
    ids = {new_id("resp") for _ in range(1000)}
    assert len(ids) == 1000
    assert all(i.startswith("resp_") and len(i) == 5 + 48 and int(i[5:], 16) >= 0 for i in ids)
    assert "alice-key" not in ALICE and ALICE != BOB and owner_key(b"alice-key") == ALICE
    assert owner_key(None) == owner_key("") == "anonymous"
