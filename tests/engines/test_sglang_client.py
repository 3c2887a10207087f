"""The SGLang client over real HTTP: against the sim server and against fake SGLang handlers."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from deepseek_frontend.engines.base import DecodingConstraint
from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import SimFaults, build_sim_app
from deepseek_frontend.errors import (
    EngineRejectedRequestError,
    EngineStreamError,
    EngineUnavailableError,
    RequestError,
)

from .conftest import TOOLS, collect, prompt_ids, request_for, serve_app, wait_until


def sim_app(
    prompt_tokenizer: Any, *, cumulative: bool = False, faults: SimFaults | None = None, **engine: Any
) -> Starlette:
    return build_sim_app(SimulatedEngine(prompt_tokenizer, **engine), cumulative=cumulative, faults=faults)


@pytest.mark.parametrize("cumulative", [False, True], ids=["incremental", "cumulative"])
@pytest.mark.parametrize("client_mode", [None, "fixed"], ids=["autodetect", "configured"])
def test_streams_the_same_ids_as_the_engine_in_process(
    prompt_tokenizer: Any, cumulative: bool, client_mode: str | None
) -> None:
    ids = prompt_ids("What's the weather in Paris and Tokyo? Both in parallel.", tools=TOOLS, thinking=True)
    expected, expected_chunks = asyncio.run(
        collect(SimulatedEngine(prompt_tokenizer), request_for(ids, rid="in-proc"))
    )

    async def scenario() -> tuple[list[int], list[Any]]:
        async with serve_app(sim_app(prompt_tokenizer, cumulative=cumulative, tokens_per_chunk=3)) as url:
            client = SGLangClient(url, cumulative=cumulative if client_mode else None)
            try:
                return await collect(client, request_for(ids))
            finally:
                await client.aclose()

    got, chunks = asyncio.run(scenario())
    assert got == expected
    # whole engine chunks: the events of one read are merged (zero delay: the sim writes several at once)
    assert all(len(c.token_ids) % 3 == 0 for c in chunks[:-1])
    last = chunks[-1]
    assert (last.finish_reason, last.matched_stop) == ("stop", prompt_tokenizer.eos_token_id)
    assert last.prompt_tokens == len(ids) and last.completion_tokens == len(expected)
    assert expected_chunks[-1].finish_reason == "stop"


def test_finish_length_and_logprobs_arrive(prompt_tokenizer: Any) -> None:
    async def scenario() -> list[Any]:
        async with serve_app(sim_app(prompt_tokenizer)) as url:
            client = SGLangClient(url)
            _, chunks = await collect(
                client, request_for(prompt_ids("write 40 words"), max_new_tokens=7, logprobs=True)
            )
            await client.aclose()
            return chunks

    chunks = asyncio.run(scenario())
    assert chunks[-1].finish_reason == "length" and chunks[-1].completion_tokens == 7
    assert [lp.token_id for c in chunks for lp in c.logprobs or ()] == [
        t for c in chunks for t in c.token_ids
    ]


def test_request_body_follows_the_documented_shape() -> None:
    request = request_for(
        [1, 2, 3],
        rid="r9",
        max_new_tokens=5,
        seed=42,
        stop_token_ids=(1,),
        constraint=DecodingConstraint("ebnf", 'root ::= "x"'),
    )
    body = SGLangClient.request_body(request)
    assert body["rid"] == "r9~" and body["input_ids"] == [1, 2, 3] and body["stream"] is True
    params = body["sampling_params"]
    assert params["max_new_tokens"] == 5 and params["sampling_seed"] == 42
    assert params["stop_token_ids"] == [1] and params["skip_special_tokens"] is False
    assert params["ebnf"] == 'root ::= "x"' and "json_schema" not in params
    assert body["return_logprob"] is False and body["top_logprobs_num"] == 0


def test_ids_held_as_an_array_go_out_as_a_json_list() -> None:
    """The pipeline hands the in-process engine the tokenizer's ``array("i")``; should such a
    request reach a worker, its body still carries the ids as a JSON list."""
    body = SGLangClient.request_body(request_for(array("i", [5, 6, 7])))  # type: ignore[arg-type]
    assert orjson.loads(orjson.dumps(body))["input_ids"] == [5, 6, 7]


# ---------------------------------------------------------------- fake SGLang handlers


def fake_sglang(
    stream_body: Callable[[dict], AsyncIterator[bytes]] | None = None, status: int = 200
) -> Starlette:
    """A /generate endpoint answering with ``status`` or with the bytes ``stream_body`` yields."""
    seen: dict[str, Any] = {"aborts": [], "closed": 0}

    async def generate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if status != 200:
            return JSONResponse({"error": {"message": f"bad thing {status}"}}, status_code=status)
        assert stream_body is not None

        async def guarded() -> AsyncIterator[bytes]:
            try:
                async for part in stream_body(body):
                    yield part
            finally:
                seen["closed"] += 1

        return StreamingResponse(guarded(), media_type="text/event-stream")

    async def abort(request: Request) -> Response:
        seen["aborts"].append(orjson.loads(await request.body())["rid"])
        return Response()

    app = Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/abort_request", abort, methods=["POST"]),
        ]
    )
    app.state.seen = seen
    return app


def chunk(ids: list[int], completion: int, finish: Any = None, key: str = "output_ids") -> bytes:
    meta = {
        "id": "x",
        "finish_reason": finish,
        "prompt_tokens": 4,
        "completion_tokens": completion,
        "cached_tokens": 2,
    }
    return b"data: " + orjson.dumps({key: ids, "meta_info": meta}) + b"\n\n"


async def run_against(app: Starlette, **client_options: Any) -> tuple[list[int], list[Any]]:
    async with serve_app(app) as url:
        client = SGLangClient(url, **client_options)
        try:
            return await collect(client, request_for([1, 2, 3, 4]))
        finally:
            await client.aclose()


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_an_http_4xx_is_the_clients_error_with_the_engines_status_and_message(status: int) -> None:
    with pytest.raises(EngineRejectedRequestError, match=f"bad thing {status}") as info:
        asyncio.run(run_against(fake_sglang(status=status)))
    assert isinstance(info.value, RequestError) and info.value.status_code == status


@pytest.mark.parametrize("status", [408, 429, 503])
def test_busy_or_timed_out_answers_are_the_workers_failure(status: int) -> None:
    with pytest.raises(EngineUnavailableError, match=f"HTTP {status}"):
        asyncio.run(run_against(fake_sglang(status=status)))


def test_http_500_before_any_token_is_retryable() -> None:
    with pytest.raises(EngineUnavailableError, match="HTTP 500"):
        asyncio.run(run_against(fake_sglang(status=500)))


def test_connection_refused_is_retryable() -> None:
    async def scenario() -> None:
        async with serve_app(fake_sglang(status=500)) as url:
            pass  # the server is gone now: its port refuses connections
        client = SGLangClient(url)
        await collect(client, request_for([1]))

    with pytest.raises(EngineUnavailableError, match="cannot reach"):
        asyncio.run(scenario())


#: what SGLang 0.5.23's http_server streams for a request it refuses after the stream started
REFUSED = {"message": "The input (70 tokens) is longer than the model's context length (64 tokens).",
           "type": "invalid_request_error", "code": 400, "retryable": False}  # fmt: skip


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (REFUSED, 400),
        ({"message": "too large", "code": 413}, 413),
        ({"message": "no code but final", "retryable": False}, 400),
    ],
    ids=["sglang-400", "code-413", "retryable-false"],
)
@pytest.mark.parametrize("after_tokens", [False, True], ids=["before-tokens", "after-tokens"])
def test_an_error_event_that_blames_the_request_is_the_clients_error(
    error: dict[str, Any], status: int, after_tokens: bool
) -> None:
    async def refused(_: dict) -> AsyncIterator[bytes]:
        if after_tokens:
            yield chunk([7, 8], 2)
        yield b"data: " + orjson.dumps({"error": error}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    with pytest.raises(EngineRejectedRequestError) as info:
        asyncio.run(run_against(fake_sglang(refused)))
    assert info.value.status_code == status
    assert error["message"] in info.value.message


@pytest.mark.parametrize(
    "error",
    [{"message": "out of memory", "code": 503, "retryable": True}, {"message": "out of memory", "code": 500}],
)
def test_an_error_event_with_a_server_code_stays_the_workers_failure(error: dict[str, Any]) -> None:
    async def failed(_: dict) -> AsyncIterator[bytes]:
        yield b"data: " + orjson.dumps({"error": error}) + b"\n\n"

    with pytest.raises(EngineUnavailableError, match="out of memory"):
        asyncio.run(run_against(fake_sglang(failed)))


def test_an_abort_finish_with_a_4xx_status_is_the_clients_error_and_5xx_the_workers() -> None:
    message = "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported"

    def aborting(status: int) -> Callable[[dict], AsyncIterator[bytes]]:
        async def body(_: dict) -> AsyncIterator[bytes]:
            reason = {
                "type": "abort",
                "message": message,
                "status_code": status,
                "err_type": "BadRequestError",
            }
            yield chunk([], 0, reason)
            yield b"data: [DONE]\n\n"

        return body

    with pytest.raises(EngineRejectedRequestError, match="Grammar-based generation") as info:
        asyncio.run(run_against(fake_sglang(aborting(400))))
    assert info.value.status_code == 400
    with pytest.raises(EngineUnavailableError, match="Grammar-based generation"):
        asyncio.run(run_against(fake_sglang(aborting(503))))


def test_error_event_before_tokens_is_retryable_and_after_tokens_is_a_stream_error() -> None:
    async def early(_: dict) -> AsyncIterator[bytes]:
        yield b'data: {"error": {"message": "out of memory"}}\n\n'

    async def late(_: dict) -> AsyncIterator[bytes]:
        yield chunk([7, 8], 2)
        yield b'data: {"error": {"message": "out of memory"}}\n\n'

    with pytest.raises(EngineUnavailableError, match="out of memory"):
        asyncio.run(run_against(fake_sglang(early)))
    with pytest.raises(EngineStreamError, match="out of memory"):
        asyncio.run(run_against(fake_sglang(late)))


def test_a_stream_that_ends_without_finishing_is_a_stream_error() -> None:
    async def truncated(_: dict) -> AsyncIterator[bytes]:
        yield chunk([7], 1)
        yield b"data: [DONE]\n\n"

    with pytest.raises(EngineStreamError, match="without a finish"):
        asyncio.run(run_against(fake_sglang(truncated)))


def test_a_dropped_connection_mid_stream_is_a_stream_error_after_the_tokens_sent(
    prompt_tokenizer: Any,
) -> None:
    received: list[int] = []

    async def scenario() -> None:
        faults = SimFaults(fail_after=4, fail_mode="disconnect")
        async with serve_app(sim_app(prompt_tokenizer, faults=faults)) as url:
            client = SGLangClient(url)
            try:
                async for c in client.generate(request_for(prompt_ids("write 30 words"))):
                    received.extend(c.token_ids)
            finally:
                await client.aclose()

    with pytest.raises(EngineStreamError, match="stream broke"):
        asyncio.run(scenario())
    assert len(received) == 4


def test_legacy_token_ids_and_string_finish_reasons_are_understood() -> None:
    async def legacy(_: dict) -> AsyncIterator[bytes]:
        yield chunk([5], 1, key="token_ids")
        yield chunk([6, 1], 3, {"type": "stop", "matched": 1}, key="token_ids")
        yield b"data: [DONE]\n\n"

    ids, chunks = asyncio.run(run_against(fake_sglang(legacy)))
    assert ids == [5, 6, 1] and chunks[-1].matched_stop == 1 and chunks[-1].cached_tokens == 2


def test_cumulative_chunks_are_diffed_even_when_ids_repeat() -> None:
    async def cumulative(_: dict) -> AsyncIterator[bytes]:
        yield chunk([5], 1)
        yield chunk([5, 5], 2)
        yield chunk([5, 5, 5, 1], 4, {"type": "stop", "matched": 1})

    ids, _ = asyncio.run(run_against(fake_sglang(cumulative)))
    assert ids == [5, 5, 5, 1]


def test_incremental_chunks_that_look_like_prefixes_are_not_diffed() -> None:
    async def incremental(_: dict) -> AsyncIterator[bytes]:
        yield chunk([5], 1)
        yield chunk([5, 5], 3)
        yield chunk([1], 4, {"type": "stop", "matched": 1})

    ids, _ = asyncio.run(run_against(fake_sglang(incremental)))
    assert ids == [5, 5, 5, 1]


def test_abort_finish_carries_the_engine_message() -> None:
    async def aborted(_: dict) -> AsyncIterator[bytes]:
        yield chunk([5], 1)
        yield chunk([], 1, {"type": "abort", "message": "server shutting down"})

    _, chunks = asyncio.run(run_against(fake_sglang(aborted)))
    assert chunks[-1].finish_reason == "abort" and chunks[-1].message == "server shutting down"


def test_closing_the_stream_early_aborts_on_the_worker(prompt_tokenizer: Any) -> None:
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=2)

    async def scenario() -> None:
        async with serve_app(build_sim_app(engine)) as url:
            client = SGLangClient(url)
            stream = client.generate(
                request_for(prompt_ids("write 500 words"), rid="gone-1", max_new_tokens=2000)
            )
            await anext(stream)
            await stream.aclose()
            await wait_until(lambda: "gone-1~" in engine.stats.aborted_ids)
            assert engine.stats.running == 0
            await client.aclose()

    asyncio.run(scenario())


def test_cancelling_the_consumer_sends_abort_request() -> None:
    async def endless(_: dict) -> AsyncIterator[bytes]:
        n = 0
        while True:
            n += 1
            yield chunk([5], n)
            await asyncio.sleep(0.01)

    app = fake_sglang(endless)

    async def scenario() -> None:
        async with serve_app(app) as url:
            client = SGLangClient(url)
            got_one = asyncio.Event()

            async def consume() -> None:
                async for _ in client.generate(request_for([1, 2], rid="cancel-me")):
                    got_one.set()

            task = asyncio.create_task(consume())
            await got_one.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_until(
                lambda: app.state.seen["aborts"] == ["cancel-me~"] and app.state.seen["closed"] == 1
            )
            await client.aclose()

    asyncio.run(scenario())


def test_health_probe_does_not_generate_and_fails_when_server_info_does() -> None:
    """The probe is GET /server_info: never /health or /health_generate (they run a generation)."""
    hits: list[str] = []
    state = {"status": 200}

    async def record(request: Request) -> Response:
        hits.append(request.url.path)
        return JSONResponse({"grammar_backend": "xgrammar"}, status_code=state["status"])

    app = Starlette(routes=[Route(p, record) for p in ("/server_info", "/health", "/health_generate")])

    async def scenario() -> tuple[bool, bool]:
        async with serve_app(app) as url:
            client = SGLangClient(url)
            healthy = await client.check_health()
            state["status"] = 503
            unhealthy = await client.check_health()
            await client.aclose()
            return healthy, unhealthy

    assert asyncio.run(scenario()) == (True, False)
    assert hits == ["/server_info", "/server_info"]


def test_health_probe_falls_back_to_get_server_info_on_older_sglang() -> None:
    async def info(_: Request) -> Response:
        return JSONResponse({"skip_tokenizer_init": True})

    app = Starlette(routes=[Route("/get_server_info", info)])

    async def scenario() -> tuple[bool, Any]:
        async with serve_app(app) as url:
            client = SGLangClient(url)
            try:
                return await client.check_health(), await client.discover()
            finally:
                await client.aclose()

    healthy, caps = asyncio.run(scenario())
    assert healthy and caps is not None and caps.constraint_kinds == frozenset()


def test_a_client_that_just_disconnects_is_counted_as_an_abort_by_the_sim_server(
    prompt_tokenizer: Any,
) -> None:
    engine = SimulatedEngine(prompt_tokenizer, itl_ms=5)

    async def scenario() -> None:
        async with serve_app(build_sim_app(engine)) as url, httpx.AsyncClient() as http:
            body = {
                "rid": "dropped",
                "input_ids": prompt_ids("write 500 words"),
                "stream": True,
                "sampling_params": {"max_new_tokens": 2000},
            }
            async with http.stream("POST", url + "/generate", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        break
            # no /abort_request: only the closed connection tells the server
            await wait_until(lambda: "dropped" in engine.stats.aborted_ids)
            assert engine.stats.running == 0

    asyncio.run(scenario())


def test_faults_can_be_switched_while_the_server_runs(prompt_tokenizer: Any) -> None:
    async def scenario() -> None:
        async with serve_app(sim_app(prompt_tokenizer)) as url, httpx.AsyncClient() as http:
            client = SGLangClient(url)
            ids = prompt_ids("write 30 words")
            await collect(client, request_for(ids, rid="before"))
            set_fault = await http.post(
                url + "/sim/fault", json={"fail_after": 3, "fail_mode": "error-event"}
            )
            assert set_fault.json() == {"fail_after": 3, "fail_mode": "error-event", "pd_transfer": "ok"}
            with pytest.raises(EngineStreamError, match="simulated failure after 3 tokens"):
                await collect(client, request_for(ids, rid="failing"))
            await http.post(url + "/sim/fault", json={"fail_after": None})
            # its own id: the failed request's abort is still on its way and names "failing"
            out, _ = await collect(client, request_for(ids, rid="after"))
            assert len(out) > 30
            stats = (await http.get(url + "/sim/stats")).json()
            assert (stats["finished"], stats["failed"], stats["aborted"]) == (2, 1, 0)
            await client.aclose()

    asyncio.run(scenario())


def _event(ids: list[int], completion: int, finish: str | None = None) -> bytes:
    meta: dict[str, Any] = {"prompt_tokens": 5, "completion_tokens": completion, "cached_tokens": 2}
    if finish is not None:
        meta["finish_reason"] = {"type": finish}
    return b"data: " + orjson.dumps({"output_ids": ids, "meta_info": meta}) + b"\n\n"


def _one_write_app(body: bytes, then: bytes = b"") -> Starlette:
    """A fake SGLang whose /generate writes ``body`` in one write (events a frontend that fell behind
    finds waiting in its socket), then ``then`` after a pause."""

    async def generate(_: Request) -> Response:
        async def parts() -> AsyncIterator[bytes]:
            yield body
            if then:
                await asyncio.sleep(0.05)
                yield then

        return StreamingResponse(parts(), media_type="text/event-stream")

    return Starlette(routes=[Route("/generate", generate, methods=["POST"])])


def _collect_from(app: Starlette) -> tuple[list[Any], BaseException | None]:
    async def scenario() -> tuple[list[Any], BaseException | None]:
        got: list[Any] = []
        async with serve_app(app) as url:
            client = SGLangClient(url, cumulative=False)
            try:
                async for chunk in client.generate(request_for([1, 2, 3, 4, 5])):
                    got.append(chunk)
            except Exception as exc:
                return got, exc
            finally:
                await client.aclose()
        return got, None

    return asyncio.run(scenario())


def test_events_that_arrive_together_become_one_chunk() -> None:
    """Steps waiting in the socket are one chunk: all their ids, the latest counters, the finish."""
    events = _event([7], 1) + _event([8], 2) + _event([9], 3)
    finish = _event([10], 4) + _event([11], 5, "stop")
    chunks, error = _collect_from(_one_write_app(events, finish))
    assert error is None
    assert [c.token_ids for c in chunks] == [[7, 8, 9], [10, 11]]
    assert [c.completion_tokens for c in chunks] == [3, 5]
    assert chunks[-1].finish_reason == "stop" and chunks[-1].prompt_tokens == 5
    assert chunks[-1].cached_tokens == 2


def test_tokens_before_an_error_in_the_same_read_are_kept_and_the_error_is_mid_stream() -> None:
    """A failure after output in the same read: the output comes first, then a mid-stream error (never
    one the pool would retry elsewhere, which would repeat those tokens)."""
    body = _event([7], 1) + _event([8], 2) + b"data: {not json\n\n"
    chunks, error = _collect_from(_one_write_app(body))
    assert [c.token_ids for c in chunks] == [[7, 8]]
    assert isinstance(error, EngineStreamError)
