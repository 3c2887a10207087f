"""OpenAI's Files and Batch APIs through the official SDK against a real `serve` (SQLite): every
line answered as its endpoint answers the same body, malformed lines reported and the rest run,
cancel, expiry, isolation between API keys and the keys' limits."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.servers import Server
from tests.support.waiting import wait_until

from .conftest import (
    CHAT,
    MAIN_KEY,
    MODEL,
    OTHER_KEY,
    SMALL_KEY,
    SMALL_LINES,
    chat,
    in_flight,
    jsonl,
    line,
    oai,
    results,
    upload,
    wait_batch,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
#: the fields of an answer that differ between two runs of the same request, sent directly or not:
#: ids and times; cached tokens (the second run finds its prompt in the KV cache); reasoning tokens
#: (the endpoint's count of a tool-calling answer's reasoning varies by a token or two with how the
#: engine's chunks fall, run to run)
_VOLATILE = {
    "id",
    "created",
    "created_at",
    "call_id",
    "system_fingerprint",
    "completed_at",
    "cached_tokens",
    "reasoning_tokens",
}


def _same(value: Any) -> Any:
    """``value`` without its per-run fields (ids, times)."""
    if isinstance(value, dict):
        return {k: _same(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_same(v) for v in value]
    return value


def test_the_sdk_file_calls(server: Server) -> None:
    client = oai(server)
    content = jsonl([line("a", chat("hi"))])
    created = client.files.create(file=("mine.jsonl", content), purpose="batch")
    assert (created.object, created.purpose, created.filename, created.bytes) == (
        "file",
        "batch",
        "mine.jsonl",
        len(content),
    )
    assert created.id.startswith("file-") and created.status == "processed" and created.expires_at
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).content == content
    second = upload(client, [line("b", chat("hi"))])
    listed = client.files.list(limit=1)
    assert [f.id for f in listed.data] == [second.id] and listed.has_more
    assert [f.id for f in client.files.list(limit=1, after=second.id).data] == [created.id]
    ids = [f.id for f in client.files.list(order="asc", purpose="batch")]
    assert ids.index(created.id) < ids.index(second.id)
    assert client.files.delete(created.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as info:
        client.files.create(file=("x.jsonl", content), purpose="fine-tune")
    assert info.value.body["param"] == "purpose"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="no lines"):
        client.files.create(file=("x.jsonl", b"\n\n"), purpose="batch")


def test_every_line_is_answered_as_its_endpoint_answers_it(server: Server) -> None:
    """Chat (with tools and reasoning), completions and responses lines: each line's body in the
    output file equals the endpoint's answer to the same request sent directly."""
    client = oai(server)
    cases = {
        CHAT: [
            chat("Reply with exactly: batch one"),
            {**chat("What is the weather in Paris? Use get_weather"), "tools": [WEATHER]},
            chat("write 12 words", reasoning_effort="high"),
        ],
        "/v1/completions": [{"model": MODEL, "prompt": "Reply with exactly: raw", "max_tokens": 10}],
        "/v1/responses": [{"model": MODEL, "input": "Reply with exactly: stored", "store": False}],
    }
    for endpoint, bodies in cases.items():
        file = upload(client, [line(f"{endpoint}-{i}", body, url=endpoint) for i, body in enumerate(bodies)])
        batch = client.batches.create(
            input_file_id=file.id,
            endpoint=endpoint,
            completion_window="24h",
            metadata={"case": endpoint},  # type: ignore[arg-type]
        )
        assert batch.status == "validating" and batch.metadata == {"case": endpoint}
        done = wait_batch(client, batch.id)
        assert done.status == "completed" and done.error_file_id is None, results(client, done.error_file_id)
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
            len(bodies),
            len(bodies),
            0,
        )
        for stamp in ("in_progress_at", "finalizing_at", "completed_at"):
            assert getattr(done, stamp) >= done.created_at
        assert done.usage is not None and done.usage.output_tokens > 0
        out = results(client, done.output_file_id)
        assert [r["custom_id"] for r in out] == [f"{endpoint}-{i}" for i in range(len(bodies))]
        for result, body in zip(out, bodies, strict=True):
            assert result["error"] is None and result["response"]["status_code"] == 200
            assert result["id"].startswith("batch_req_") and result["response"]["request_id"]
            direct = httpx.post(
                server.url + endpoint, json=body, headers={"authorization": f"Bearer {MAIN_KEY}"}
            )
            answer, direct_answer = result["response"]["body"], direct.json()
            # the line ran at the lowest priority and says so (the flex tier); the direct request did not
            assert answer.pop("service_tier", "flex") == "flex"
            assert direct_answer.pop("service_tier", "default") == "default"
            assert _same(answer) == _same(direct_answer)
    tool_line = results(client, client.batches.list(limit=3).data[2].output_file_id)[1]
    assert (
        tool_line["response"]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]["name"]
        == "get_weather"
    )


def test_a_responses_line_is_stored_for_the_batchs_key(server: Server) -> None:
    client = oai(server)
    file = upload(
        client, [line("kept", {"model": MODEL, "input": "Reply with exactly: kept"}, url="/v1/responses")]
    )
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/responses", completion_window="24h")
    (result,) = results(client, wait_batch(client, batch.id).output_file_id)
    response_id = result["response"]["body"]["id"]
    assert client.responses.retrieve(response_id).output_text == "kept"
    with pytest.raises(openai.NotFoundError):
        oai(server, OTHER_KEY).responses.retrieve(response_id)


def test_malformed_lines_are_reported_and_the_rest_runs(server: Server) -> None:
    client = oai(server)
    file = upload(
        client,
        [
            line("ok-1", chat("Reply with exactly: one")),
            "this is not json",
            line("ok-1", chat("again")),  # duplicate custom_id
            {"method": "POST", "url": CHAT, "body": chat("x")},  # no custom_id
            line("wrong-method", chat("x"), method="GET"),
            line("other-url", {"input": "x"}, url="/v1/embeddings"),
            line("no-body", None),
            line("streams", chat("x", stream=True)),
            line("refused", {"model": MODEL, "messages": "not a list"}),
            line("ok-2", chat("Reply with exactly: two")),
        ],
    )
    assert file.status_details and "line 2" in file.status_details
    batch = wait_batch(
        client, client.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h").id
    )
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        10,
        2,
        8,
    )
    assert [r["custom_id"] for r in results(client, batch.output_file_id)] == ["ok-1", "ok-2"]
    errors = {r["error"]["line"]: r for r in results(client, batch.error_file_id)}
    expected = {
        2: ("invalid_json_line", None),
        3: ("duplicate_custom_id", "custom_id"),
        4: ("missing_required_parameter", "custom_id"),
        5: ("invalid_method", "method"),
        6: ("invalid_url", "url"),
        7: ("missing_required_parameter", "body"),
        8: ("unsupported_parameter", "body.stream"),
        9: ("invalid_request_error", "messages"),
    }
    assert {n: (r["error"]["code"], r["error"]["param"]) for n, r in errors.items()} == expected
    assert errors[9]["response"]["status_code"] == 400  # the endpoint's own answer is kept
    assert errors[9]["response"]["body"]["error"]["param"] == "messages"
    assert all(errors[n]["response"] is None for n in range(2, 9))


def test_batches_are_listed_newest_first(server: Server) -> None:
    client = oai(server)
    file = upload(client, [line("a", chat("hi"))])
    ids = [
        client.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h").id
        for _ in range(3)
    ]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    assert client.batches.list(limit=1, after=ids[1]).data[0].id == ids[0]
    for batch_id in ids:
        wait_batch(client, batch_id)


def test_a_cancel_stops_the_batch_and_aborts_its_engine_requests(server: Server) -> None:
    client = oai(server)
    lines = [line(f"long-{i}", chat("write 3000 words", max_tokens=4000)) for i in range(6)]
    batch = client.batches.create(
        input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h"
    )
    wait_until(lambda: in_flight(server) == 2, "two lines run (--batch-concurrency 2)", timeout=30)
    assert max(in_flight(server) for _ in range(20)) == 2  # never more than --batch-concurrency
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    wait_until(lambda: in_flight(server) == 0, "the lines' engine requests were aborted", timeout=10)
    done = wait_batch(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at and done.output_file_id is None
    errors = results(client, done.error_file_id)
    assert sorted(r["custom_id"] for r in errors) == sorted(f"long-{i}" for i in range(6))
    assert {r["error"]["code"] for r in errors} == {"batch_cancelled"}
    assert client.batches.cancel(batch.id).status == "cancelled"  # a finished batch stays as it is


def test_lines_not_done_within_the_window_expire(server: Server) -> None:
    client = oai(server)
    lines = [line("quick", chat("Reply with exactly: in time"))] + [
        line(f"slow-{i}", chat("write 3000 words", max_tokens=4000)) for i in range(3)
    ]
    file = upload(client, lines)
    batch = client.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="3s")  # type: ignore[arg-type]
    done = wait_batch(client, batch.id, timeout=30)
    assert done.status == "expired" and done.expired_at and done.expires_at == done.created_at + 3
    assert [r["custom_id"] for r in results(client, done.output_file_id)] == ["quick"]
    expired = results(client, done.error_file_id)
    assert {r["error"]["code"] for r in expired} == {"batch_expired"} and len(expired) == 3
    wait_until(lambda: in_flight(server) == 0, "the expired lines' engine requests were aborted", timeout=10)


def test_another_key_sees_none_of_it(server: Server) -> None:
    mine, theirs = oai(server), oai(server, OTHER_KEY)
    file = upload(mine, [line("a", chat("hi"))])
    batch = mine.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h")
    for call in (
        lambda: theirs.files.retrieve(file.id),
        lambda: theirs.files.content(file.id),
        lambda: theirs.files.delete(file.id),
        lambda: theirs.batches.retrieve(batch.id),
        lambda: theirs.batches.cancel(batch.id),
        lambda: theirs.batches.create(input_file_id=file.id, endpoint=CHAT, completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert file.id not in [f.id for f in theirs.files.list()]
    assert batch.id not in [b.id for b in theirs.batches.list()]
    done = wait_batch(mine, batch.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.content(done.output_file_id)  # type: ignore[arg-type]


def test_a_keys_batch_limits(server: Server) -> None:
    small = oai(server, SMALL_KEY)
    too_many = upload(small, [line(f"l{i}", chat("hi")) for i in range(SMALL_LINES + 1)])
    with pytest.raises(openai.BadRequestError, match="batch_max_lines") as info:
        small.batches.create(input_file_id=too_many.id, endpoint=CHAT, completion_window="24h")
    assert info.value.body["param"] == "input_file_id"  # type: ignore[index]
    too_big = upload(small, [line("big", chat("x" * 5000))])
    with pytest.raises(openai.BadRequestError, match="batch_max_bytes"):
        small.batches.create(input_file_id=too_big.id, endpoint=CHAT, completion_window="24h")
    slow = upload(small, [line("slow", chat("write 3000 words", max_tokens=4000))])
    first = small.batches.create(input_file_id=slow.id, endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.RateLimitError, match="max_active_batches") as refused:
        small.batches.create(input_file_id=slow.id, endpoint=CHAT, completion_window="24h")
    assert refused.value.code == "too_many_active_batches"
    small.batches.cancel(first.id)
    wait_batch(small, first.id)
    second = small.batches.create(input_file_id=slow.id, endpoint=CHAT, completion_window="24h")
    small.batches.cancel(second.id)
    wait_batch(small, second.id)


def test_an_upload_over_the_limit_is_413(server: Server) -> None:
    client = oai(server)
    with pytest.raises(openai.APIStatusError) as info:
        client.files.create(file=("big.jsonl", jsonl([line("x", chat("y" * 7_000_000))])), purpose="batch")
    assert info.value.status_code == 413 and info.value.code == "payload_too_large"
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.create(input_file_id="file-nope", endpoint="/v1/embeddings", completion_window="24h")  # type: ignore[arg-type]
    assert bad.value.body["param"] == "endpoint"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as window:
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="48h")  # type: ignore[arg-type]
    assert window.value.body["param"] == "completion_window"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
