"""Anthropic's Message Batches API through the official SDK against a real `serve`: create, retrieve,
list, results (each request answered as /v1/messages answers it), cancel, delete, errors in
Anthropic's shape, and another key's batches out of sight."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tests.support.servers import Server
from tests.support.waiting import wait_until

from .conftest import MAIN_KEY, MODEL, OTHER_KEY, claude, in_flight, wait_message_batch


def params(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": text}], **extra}


def test_a_message_batch_answers_each_request_as_messages_does(server: Server) -> None:
    client = claude(server)
    requests = [
        {"custom_id": "plain", "params": params("Reply with exactly: batched")},
        {
            "custom_id": "thinking",
            "params": params("write 10 words", thinking={"type": "enabled", "budget_tokens": 1024}),
        },
        {"custom_id": "refused", "params": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}},
        {"custom_id": "streams", "params": params("hi", stream=True)},
    ]
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert created.type == "message_batch" and created.processing_status == "in_progress"
    assert created.request_counts.processing == 3 and created.results_url is None
    assert created.id.startswith("msgbatch_") and created.expires_at > created.created_at
    done = wait_message_batch(client, created.id)
    assert (
        done.ended_at is not None and done.results_url and done.results_url.endswith(f"/{created.id}/results")
    )
    counts = done.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled, counts.expired) == (
        0,
        2,
        2,
        0,
        0,
    )
    by_id = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
    assert list(by_id) == ["plain", "thinking", "refused", "streams"]
    assert by_id["plain"].type == "succeeded" and by_id["plain"].message.content[0].text == "batched"  # type: ignore[union-attr]
    assert by_id["refused"].type == "errored" and "max_tokens" in by_id["refused"].error.error.message  # type: ignore[union-attr]
    assert by_id["streams"].type == "errored" and "stream" in by_id["streams"].error.error.message  # type: ignore[union-attr]
    thinking = by_id["thinking"].message  # type: ignore[union-attr]
    direct = httpx.post(
        server.url + "/v1/messages", json=requests[1]["params"], headers={"x-api-key": MAIN_KEY}
    ).json()
    assert [block.type for block in thinking.content] == [block["type"] for block in direct["content"]]
    assert thinking.content[-1].text == direct["content"][-1]["text"]
    assert thinking.usage.output_tokens == direct["usage"]["output_tokens"]


def test_list_cancel_and_delete(server: Server) -> None:
    client = claude(server)
    slow = [{"custom_id": f"s{i}", "params": params("write 3000 words", max_tokens=4000)} for i in range(4)]
    first = client.messages.batches.create(requests=slow)  # type: ignore[arg-type]
    second = client.messages.batches.create(requests=[{"custom_id": "q", "params": params("hi")}])  # type: ignore[list-item]
    page = client.messages.batches.list(limit=1)
    assert [b.id for b in page.data] == [second.id] and page.has_more and page.last_id == second.id
    assert client.messages.batches.list(limit=1, after_id=second.id).data[0].id == first.id
    assert client.messages.batches.list(limit=5, before_id=first.id).data[0].id == second.id
    with pytest.raises(anthropic.BadRequestError, match="still processing"):
        client.messages.batches.delete(first.id)
    wait_until(lambda: in_flight(server) >= 1, "a line of the batch runs", timeout=30)
    canceling = client.messages.batches.cancel(first.id)
    assert canceling.processing_status in ("canceling", "ended") and canceling.cancel_initiated_at
    ended = wait_message_batch(client, first.id)
    assert ended.request_counts.canceled == 4 and ended.request_counts.processing == 0
    wait_until(lambda: in_flight(server) == 0, "the canceled lines' engine requests were aborted", timeout=10)
    assert {r.result.type for r in client.messages.batches.results(first.id)} == {"canceled"}
    assert client.messages.batches.delete(first.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(first.id)
    wait_message_batch(client, second.id)


def test_errors_are_anthropics_and_another_key_sees_nothing(server: Server) -> None:
    client, theirs = claude(server), claude(server, OTHER_KEY)
    with pytest.raises(anthropic.BadRequestError) as duplicate:
        client.messages.batches.create(
            requests=[
                {"custom_id": "same", "params": params("a")},
                {"custom_id": "same", "params": params("b")},
            ]  # type: ignore[list-item]
        )
    assert duplicate.value.body["type"] == "error"  # type: ignore[index]
    assert duplicate.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "requests[1].custom_id" in duplicate.value.body["error"]["message"]  # type: ignore[index]
    batch = client.messages.batches.create(requests=[{"custom_id": "mine", "params": params("hi")}])  # type: ignore[list-item]
    for call in (
        lambda: theirs.messages.batches.retrieve(batch.id),
        lambda: theirs.messages.batches.cancel(batch.id),
        lambda: theirs.messages.batches.delete(batch.id),
    ):
        with pytest.raises(anthropic.NotFoundError) as info:
            call()
        assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert batch.id not in [b.id for b in theirs.messages.batches.list()]
    wait_message_batch(client, batch.id)
    results = httpx.get(
        server.url + f"/v1/messages/batches/{batch.id}/results", headers={"x-api-key": OTHER_KEY}
    )
    assert results.status_code == 404 and results.json()["type"] == "error"
