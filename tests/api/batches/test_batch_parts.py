"""The Batch APIs' parts alone: a file's lines checked as JSONL while they arrive, a batch's lines
read and judged, the result lines in each SDK's types, and a line run through its endpoint's own
route in-process -- on the batch's owner's behalf, at the lowest priority, outside the key's rate
limits."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator
from typing import Any

import anthropic.types.messages as anthropic_types
import orjson
import pytest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from deepseek_frontend.api.batches.common import completion_window_seconds
from deepseek_frontend.api.batches.execute import BATCH_PRIORITY, call_route, classify
from deepseek_frontend.api.batches.lines import anthropic_requests, file_lines, openai_line
from deepseek_frontend.api.batches.results import endpoint_result, openai_unrun_line, usage_of
from deepseek_frontend.api.batches.upload import JsonlChunker
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.errors import RequestError
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig
from deepseek_frontend.generation import DEFAULT_PRIORITY, LOWEST_PRIORITY
from deepseek_frontend.keys.tenants import Tenant, TenantLimits, TenantTable
from deepseek_frontend.server.app import create_app
from deepseek_frontend.state import StoredFile, new_id, open_store_url
from deepseek_frontend.tokenization import PromptTokenizer

CHAT = "/v1/chat/completions"


def _line(custom_id: Any = "a", **fields: Any) -> bytes:
    body = {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": {"messages": []}, **fields}
    return orjson.dumps({k: v for k, v in body.items() if v is not None})


# ---------------------------------------------------------------- uploads


def test_the_chunker_checks_lines_across_pieces_and_cuts_chunks() -> None:
    data = b'{"a": 1}\r\n\n[1]\nnot json\n{"b": 2}'
    chunker = JsonlChunker(max_line_bytes=64, chunk_bytes=8)
    for i in range(0, len(data), 3):  # pieces that split lines anywhere
        chunker.feed(data[i : i + 3])
    chunker.close()
    assert b"".join(chunker.ready) == data and all(len(c) == 8 for c in chunker.ready[:-1])
    assert (chunker.line, chunker.lines, chunker.invalid, chunker.first_invalid) == (5, 4, 2, 3)
    assert chunker.details() is not None and "line 3" in chunker.details()  # type: ignore[operator]


def test_a_line_longer_than_a_request_may_be_stops_the_upload() -> None:
    chunker = JsonlChunker(max_line_bytes=10)
    chunker.feed(b'{"a": 1}\n')
    with pytest.raises(RequestError, match="line 2 is longer than 10 bytes"):
        for _ in range(4):
            chunker.feed(b"xxxx")  # caught while the line is still arriving, not when it ends


# ---------------------------------------------------------------- lines


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"{nope", "invalid_json_line", None),
        (b"[1, 2]", "invalid_json_line", None),
        (_line(None), "missing_required_parameter", "custom_id"),
        (_line(7), "invalid_type", "custom_id"),
        (_line("seen"), "duplicate_custom_id", "custom_id"),
        (_line(method="GET"), "invalid_method", "method"),
        (_line(url="/v1/embeddings"), "invalid_url", "url"),
        (_line(url="/v1/completions"), "invalid_url", "url"),
        (_line(body="text"), "invalid_type", "body"),
        (_line(body={"messages": [], "stream": True}), "unsupported_parameter", "body.stream"),
    ],
)
def test_a_malformed_line_is_reported_with_its_number_and_field(raw: bytes, code: str, param: str) -> None:
    record = openai_line(7, raw, CHAT, {"seen": 2})
    assert record.outcome == "errored" and record.result is not None
    error = json.loads(record.result)["error"]
    assert (error["code"], error["param"], error["line"]) == (code, param, 7)
    assert error["message"].startswith("line 7: ")


def test_a_good_line_is_pending_with_its_body() -> None:
    seen: dict[str, int] = {}
    record = openai_line(
        1, _line("x", body={"model": "m", "messages": [{"role": "user", "content": "é"}]}), CHAT, seen
    )
    assert record.outcome == "pending" and record.custom_id == "x" and seen == {"x": 1}
    assert json.loads(record.body) == {"model": "m", "messages": [{"role": "user", "content": "é"}]}


def test_a_file_is_read_line_by_line_with_physical_line_numbers(tmp_path: Any) -> None:
    async def body() -> list[tuple[int, bytes]]:
        store = await open_store_url(f"sqlite:///{tmp_path}/s.db")
        file = StoredFile(new_id("file"), "o", store.now(), "batch", "f")
        await store.begin_file(file)
        for seq, part in enumerate([b'{"a"', b": 1}\r\n\n", b'{"b": 2}\n  \n{"c"', b": 3}"]):
            await store.put_file_chunk(file.id, seq, part)
        found = [item async for item in file_lines(store, file.id)]
        await store.close()
        return found

    assert asyncio.run(body()) == [(1, b'{"a": 1}'), (3, b'{"b": 2}'), (5, b'{"c": 3}')]


def test_anthropic_requests_name_what_is_wrong() -> None:
    good = {"custom_id": "a", "params": {"max_tokens": 1, "messages": []}}
    lines = anthropic_requests([good, {"custom_id": "b", "params": {"stream": True}}], 10)
    assert [line.outcome for line in lines] == ["pending", "errored"]
    result = anthropic_types.MessageBatchIndividualResponse.model_validate_json(lines[1].result or "")
    assert (
        result.result.type == "errored" and "requests[1].params.stream" in result.result.error.error.message
    )
    for requests, param in [
        ([], "requests"),
        ([good, good], "requests[1].custom_id"),
        ([{"custom_id": "has space", "params": {}}], "requests[0].custom_id"),
        ([{"custom_id": "a"}], "requests[0].params"),
        ([good] * 3, "requests"),
    ]:
        with pytest.raises(RequestError) as info:
            anthropic_requests(requests, 2)
        assert info.value.param == param


def test_the_completion_window_is_24h_or_shorter() -> None:
    assert completion_window_seconds("24h") == 86400
    assert completion_window_seconds("90s") == 90 and completion_window_seconds("5m") == 300
    for bad in ("25h", "0h", "1d", "", 24):
        with pytest.raises(RequestError, match="completion_window"):
            completion_window_seconds(bad)


# ---------------------------------------------------------------- results


def test_result_lines_are_what_the_sdks_read() -> None:
    import openai.types.chat as chat_types

    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 2,
            "total_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": 1},
        },
    }
    ok = endpoint_result("openai", 3, "c", 200, "req-1", orjson.dumps(answer))
    line = json.loads(ok.result)
    assert ok.outcome == "succeeded" and line["error"] is None and line["custom_id"] == "c"
    assert line["response"]["status_code"] == 200 and line["response"]["request_id"] == "req-1"
    assert (
        chat_types.ChatCompletion.model_validate(line["response"]["body"]).choices[0].message.content == "hi"
    )
    assert (ok.input_tokens, ok.output_tokens, ok.reasoning_tokens) == (5, 2, 1)

    refused = {
        "error": {
            "message": "messages: expected an array",
            "type": "invalid_request_error",
            "param": "messages",
        }
    }
    bad = json.loads(endpoint_result("openai", 4, "d", 400, "req-2", orjson.dumps(refused)).result)
    assert bad["response"]["body"] == refused
    assert bad["error"] == {
        "code": "invalid_request_error",
        "message": refused["error"]["message"],
        "param": "messages",
        "line": 4,
    }
    unrun = json.loads(openai_unrun_line(9, "e", "expired"))
    assert (
        unrun["response"] is None
        and unrun["error"]["code"] == "batch_expired"
        and unrun["error"]["line"] == 9
    )

    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1, "cache_read_input_tokens": 2},
    }
    won = endpoint_result("anthropic", 1, "m1", 200, "", orjson.dumps(message))
    parsed = anthropic_types.MessageBatchIndividualResponse.model_validate_json(won.result)
    assert parsed.result.type == "succeeded" and parsed.result.message.content[0].text == "hi"  # type: ignore[union-attr]
    assert usage_of(message) == (3, 2, 1, 0)
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: required"}}
    lost = endpoint_result("anthropic", 2, "m2", 400, "", orjson.dumps(error))
    parsed = anthropic_types.MessageBatchIndividualResponse.model_validate_json(lost.result)
    assert parsed.result.type == "errored" and parsed.result.error.error.message == "max_tokens: required"  # type: ignore[union-attr]


def test_load_is_retried_uncounted_and_other_server_faults_a_few_times() -> None:
    assert classify(200, 1) == classify(400, 1) == classify(404, 5) == "result"
    assert classify(429, 9) == classify(503, 9) == "retry-uncounted"
    assert classify(500, 1) == classify(504, 2) == "retry" and classify(500, 3) == "result"


# ---------------------------------------------------------------- running a line in-process


@pytest.fixture()
def app_client(prompt_tokenizer: PromptTokenizer) -> Iterator[TestClient]:
    limited = Tenant("alice", b"\x01" * 32, limits=TenantLimits(requests_per_minute=1))
    config = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash", context_length=8192))
    from deepseek_frontend.fleet.config_file import Fleet

    app = create_app(config, tokenizer=prompt_tokenizer, fleet=Fleet((config,), TenantTable([limited])))

    @api_route("/probe")
    async def probe(ctx: RequestContext) -> Response:
        return JSONResponse(
            {"priority": ctx.priority, "owner": ctx.owner, "tenant": ctx.tenant and ctx.tenant.name}
        )

    app.router.routes.append(Route("/probe", probe, methods=["POST"]))
    with TestClient(app) as client:
        client.app_under_test = app  # type: ignore[attr-defined]
        yield client


def test_a_line_runs_through_the_route_as_its_owner_at_the_lowest_priority(app_client: TestClient) -> None:
    app: Any = app_client.app_under_test  # type: ignore[attr-defined]
    tenant = app.frontend.tenants.by_name("alice")
    run = functools.partial(call_route, app, app.router, tenant=tenant, owner="sha256:batch-owner")
    assert BATCH_PRIORITY == LOWEST_PRIORITY < DEFAULT_PRIORITY
    for _ in range(3):  # the key allows one request a minute: batch lines are not charged to it
        answer = app_client.portal.call(run, "/probe", b"{}")  # type: ignore[union-attr]
        assert answer.status == 200
        assert json.loads(answer.body) == {
            "priority": BATCH_PRIORITY,
            "owner": "sha256:batch-owner",
            "tenant": "alice",
        }
    body = {"messages": [{"role": "user", "content": "Reply with exactly: same"}]}
    answer = app_client.portal.call(run, CHAT, orjson.dumps(body))  # type: ignore[union-attr]
    assert answer.status == 200 and answer.request_id.startswith("chatcmpl-")
    assert json.loads(answer.body)["choices"][0]["message"]["content"] == "same"
    refused = app_client.portal.call(run, CHAT, b'{"messages": "no"}')  # type: ignore[union-attr]
    assert refused.status == 400 and json.loads(refused.body)["error"]["param"] == "messages"


def test_a_line_whose_process_keeps_dying_is_given_up(tmp_path: Any) -> None:
    """A line claimed more than MAX_CLAIMS times without a result (each process running it died)
    is not run again: its result is a server error, so it cannot take down process after process."""
    from types import SimpleNamespace

    from deepseek_frontend.api.batches.execute import MAX_CLAIMS
    from deepseek_frontend.api.batches.runner import BatchRunner
    from deepseek_frontend.fleet.batch_config import BatchOptions
    from deepseek_frontend.state import BatchLineRecord, StoredBatch

    async def body() -> dict[str, Any]:
        store = await open_store_url(f"sqlite:///{tmp_path}/s.db")
        now = store.now()
        batch = StoredBatch("batch_x", "o", "openai", "", CHAT, "24h", "in_progress", now, now + 3600)
        await store.create_batch(batch, [BatchLineRecord(1, "c", CHAT, "{}")], None)
        for run in range(MAX_CLAIMS + 1):  # each claim's lease runs out: its process died
            at = now + run * 100
            (claimed,) = await store.claim_lines("dead", f"k{run}", at, at + 30, 1)
        runner = BatchRunner(SimpleNamespace(store=store, tenants=None), None, None, BatchOptions())  # type: ignore[arg-type]
        await runner._run_line(claimed, f"k{MAX_CLAIMS}")
        ((_, result),) = await store.line_results("batch_x", ["errored"], 0, 10)
        await store.close()
        return json.loads(result)

    result = asyncio.run(body())
    assert result["response"]["status_code"] == 500
    assert f"started {MAX_CLAIMS} times and never finished" in result["error"]["message"]


def test_a_batch_whose_file_is_gone_fails_and_a_cancelled_one_ends_cancelled(tmp_path: Any) -> None:
    from deepseek_frontend.api.batches.lifecycle import do_batch_work
    from deepseek_frontend.state import StoredBatch

    async def body() -> tuple[Any, Any]:
        store = await open_store_url(f"sqlite:///{tmp_path}/s.db")
        now = store.now()
        gone = StoredBatch(
            "batch_gone", "o", "openai", "", CHAT, "24h", "validating", now, now + 60, "file-gone"
        )
        stopped = StoredBatch(
            "batch_stop", "o", "openai", "", CHAT, "24h", "validating", now + 1, now + 60, "file-x"
        )
        for batch in (gone, stopped):
            await store.create_batch(batch, [], None)
        await store.cancel_batch("o", "openai", stopped.id, now + 2)
        while (work := await store.claim_batch_work("r", store.now(), store.now() + 30)) is not None:
            await do_batch_work(store, work, "r", 30)
        found = (
            await store.get_batch("o", "openai", gone.id),
            await store.get_batch("o", "openai", stopped.id),
        )
        await store.close()
        return found

    failed, cancelled = asyncio.run(body())
    assert failed.status == "failed" and "failed" in failed.times
    (error,) = json.loads(failed.errors)
    assert error["code"] == "invalid_input_file" and error["param"] == "input_file_id"
    assert cancelled.status == "cancelled" and cancelled.times.keys() >= {"cancelling", "cancelled"}
