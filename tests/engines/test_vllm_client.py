"""The vLLM client against a fake ``/v1/completions`` speaking vLLM's documented stream shape."""

from __future__ import annotations

import asyncio
from array import array
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from deepseek_frontend.engines.base import DecodingConstraint
from deepseek_frontend.engines.vllm import GENERATE_ABORT_PATH, GENERATE_PATH, VLLMClient
from deepseek_frontend.errors import (
    EngineStreamError,
    EngineUnavailableError,
    RequestError,
    UnsupportedFeatureError,
)

from .conftest import collect, request_for, serve_app, wait_until

# Field names of vLLM 0.32's request models (CompletionRequest, the token-in GenerateRequest and
# its SamplingParams), so the fakes below refuse anything a real vLLM would not know.
COMPLETION_FIELDS = frozenset(
    [
        "model",
        "prompt",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
        "use_beam_search",
        "top_k",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "allowed_token_ids",
        "prompt_logprobs",
        "bad_words",
        "add_special_tokens",
        "response_format",
        "structured_outputs",
        "priority",
        "request_id",
        "return_tokens_as_token_ids",
        "return_token_ids",
        "cache_salt",
        "kv_transfer_params",
        "vllm_xargs",
        "thinking_token_budget",
    ]
)
GENERATE_FIELDS = frozenset(
    [
        "request_id",
        "token_ids",
        "token_offsets",
        "features",
        "content_parts",
        "sampling_params",
        "model",
        "reasoning_ended",
        "return_token_ids",
        "output_mode",
        "stream",
        "stream_options",
        "cache_salt",
        "priority",
        "kv_transfer_params",
        "ec_transfer_params",
    ]
)
SAMPLING_FIELDS = frozenset(
    [
        "n",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "max_tokens",
        "min_tokens",
        "logprobs",
        "prompt_logprobs",
        "detokenize",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "structured_outputs",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "thinking_token_budget",
    ]
)


def sse(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def choice(ids: list[int], finish: str | None = None, stop_reason: Any = None, **extra: Any) -> dict:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": "",
                "token_ids": ids,
                "finish_reason": finish,
                "stop_reason": stop_reason,
                **extra,
            }
        ],
        "usage": None,
    }


def fake_vllm(chunks: list[Any], *, status: int = 200, healthy: bool = True) -> Starlette:
    seen: dict[str, Any] = {}

    async def completions(request: Request) -> Response:
        seen["body"] = orjson.loads(await request.body())
        if status != 200:
            return JSONResponse(
                {"object": "error", "message": f"status {status}", "code": status}, status_code=status
            )

        async def body() -> AsyncIterator[bytes]:
            for part in chunks:
                if callable(part):  # an async generator function: its parts, when it gives them
                    async for late in part():
                        yield late
                else:
                    yield part

        return StreamingResponse(body(), media_type="text/event-stream")

    async def health(_: Request) -> Response:
        return Response(status_code=200 if healthy else 503)

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    app.state.seen = seen
    return app


async def run_against(app: Starlette, **sampling: Any) -> tuple[list[int], list[Any]]:
    async with serve_app(app) as url:
        client = VLLMClient(url, model="deepseek-v4")
        try:
            return await collect(client, request_for([10, 11, 12], **sampling))
        finally:
            await client.aclose()


def test_token_ids_finish_and_trailing_usage_are_combined() -> None:
    usage = {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 2},
    }
    app = fake_vllm(
        [
            sse(choice([5], prompt_token_ids=[10, 11, 12])),
            sse(choice([6, 7])),
            sse(choice([1], "stop", 1)),
            sse({"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage}),
            b"data: [DONE]\n\n",
        ]
    )
    ids, chunks = asyncio.run(run_against(app, seed=3, stop_token_ids=(1,)))
    assert ids == [5, 6, 7, 1]
    last = chunks[-1]
    assert (last.finish_reason, last.matched_stop) == ("stop", 1)
    assert (last.prompt_tokens, last.completion_tokens, last.cached_tokens) == (3, 4, 2)
    body = app.state.seen["body"]
    assert body["prompt"] == [10, 11, 12] and body["return_token_ids"] is True
    assert body["stream_options"] == {"include_usage": True} and body["skip_special_tokens"] is False
    assert body["seed"] == 3 and body["stop_token_ids"] == [1] and body["model"] == "deepseek-v4"


def test_length_finish_is_mapped() -> None:
    app = fake_vllm([sse(choice([5, 6], "length")), b"data: [DONE]\n\n"])
    _, chunks = asyncio.run(run_against(app))
    assert chunks[-1].finish_reason == "length" and chunks[-1].token_ids == [5, 6]


def test_json_schema_goes_out_as_structured_outputs() -> None:
    app = fake_vllm([sse(choice([1], "stop")), b"data: [DONE]\n\n"])
    asyncio.run(run_against(app, constraint=DecodingConstraint("json_schema", '{"type": "object"}')))
    assert app.state.seen["body"]["structured_outputs"] == {"json": {"type": "object"}}


def test_tool_grammar_is_sent_by_default_and_refused_up_front_when_switched_off() -> None:
    constrained = request_for([1], constraint=DecodingConstraint("ebnf", 'root ::= "x"'))
    client = VLLMClient("http://127.0.0.1:1", model="m")
    assert client.supports_constraint("ebnf") and client.supports_constraint("json_schema")
    assert not client.supports_constraint("structural_tag")
    assert client.request_body(constrained)["structured_outputs"] == {"grammar": 'root ::= "x"'}
    assert client.generate_body(constrained)["sampling_params"]["structured_outputs"] == {
        "grammar": 'root ::= "x"'
    }
    disabled = VLLMClient("http://127.0.0.1:1", model="m", grammar=False)
    assert not disabled.supports_constraint("ebnf") and disabled.supports_constraint("regex")
    with pytest.raises(UnsupportedFeatureError, match="no-vllm-grammar") as info:
        disabled.request_body(constrained)
    assert info.value.param == "tool_choice"


def test_completions_body_has_only_vllm_fields() -> None:
    body = VLLMClient("http://127.0.0.1:1", model="m").request_body(request_for([1, 2]))
    # "detokenize" is not a /v1/completions field (vLLM would only warn and ignore it)
    assert "detokenize" not in body
    assert set(body) <= COMPLETION_FIELDS


def test_ids_held_as_an_array_go_out_as_a_json_list() -> None:
    """Ids handed over as the tokenizer's ``array("i")`` go out as a JSON list on both paths."""
    client = VLLMClient("http://127.0.0.1:1", model="m")
    request = request_for(array("i", [5, 6, 7]))  # type: ignore[arg-type]
    assert orjson.loads(orjson.dumps(client.request_body(request)))["prompt"] == [5, 6, 7]
    assert orjson.loads(orjson.dumps(client.generate_body(request)))["token_ids"] == [5, 6, 7]


def test_http_errors_map_to_request_and_unavailable_errors() -> None:
    with pytest.raises(RequestError, match="status 400"):
        asyncio.run(run_against(fake_vllm([], status=400)))
    with pytest.raises(EngineUnavailableError, match="status 503"):
        asyncio.run(run_against(fake_vllm([], status=503)))


def test_error_chunk_after_tokens_is_a_stream_error() -> None:
    app = fake_vllm([sse(choice([5])), sse({"object": "error", "message": "engine dead"})])
    with pytest.raises(EngineStreamError, match="engine dead"):
        asyncio.run(run_against(app))


def test_health_uses_the_health_endpoint() -> None:
    async def scenario(healthy: bool) -> bool:
        async with serve_app(fake_vllm([], healthy=healthy)) as url:
            client = VLLMClient(url, model="m")
            result = await client.check_health()
            await client.aclose()
            return result

    assert asyncio.run(scenario(True)) is True
    assert asyncio.run(scenario(False)) is False


# ---------------------------------------------------------------------------- token-in generate API


def gen_chunk(ids: list[int], finish: str | None = None, stop_reason: Any = None, **extra: Any) -> dict:
    """One streamed chunk of vLLM 0.32's ``/inference/v1/generate`` (output_mode "tokens")."""
    return {
        "request_id": "generate-tokens-req-1",
        "choices": [
            {"index": 0, "finish_reason": finish, "stop_reason": stop_reason, "token_ids": ids, **extra}
        ],
    }


def fake_vllm_032(
    chunks: list[bytes],
    *,
    token_api_status: int | None = None,
    max_model_len: int = 4096,
    server_info: dict | None = None,
    hold_open: bool = False,
) -> Starlette:
    """A vLLM 0.32 worker: the token-in API (unless ``token_api_status`` says how its probe answers
    instead: 403 without --enable-scale-out, 404 before 0.32), /v1/completions, /v1/models, /version,
    optionally /server_info, and /inference/v1/abort_requests recording what it was asked to abort.
    Request bodies with fields vLLM 0.32 does not have are refused with 400, as pydantic would.
    ``hold_open`` keeps the stream open after ``chunks`` until the request is aborted."""
    seen: dict[str, Any] = {"paths": [], "aborted": []}
    aborted = asyncio.Event()

    def stream(chunk_list: list[bytes]) -> StreamingResponse:
        async def body() -> AsyncIterator[bytes]:
            for part in chunk_list:
                yield part
            if hold_open:
                await asyncio.wait_for(aborted.wait(), 10)

        return StreamingResponse(body(), media_type="text/event-stream")

    def refuse(message: str) -> JSONResponse:
        error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
        return JSONResponse({"error": error}, status_code=400)

    async def generate(request: Request) -> Response:
        if token_api_status is not None:
            return JSONResponse(
                {"error": {"message": "disabled", "code": token_api_status}}, token_api_status
            )
        body = orjson.loads(await request.body())
        if "token_ids" not in body or "sampling_params" not in body:
            return JSONResponse({"error": {"message": "Field required", "code": 400}}, status_code=400)
        seen["paths"].append("generate")
        seen["body"] = body
        if unknown := set(body) - GENERATE_FIELDS:
            return refuse(f"unknown fields {sorted(unknown)}")
        if unknown := set(body["sampling_params"]) - SAMPLING_FIELDS:
            return refuse(f"unknown sampling_params {sorted(unknown)}")
        return stream(chunks)

    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        seen["paths"].append("completions")
        seen["body"] = body
        if unknown := set(body) - COMPLETION_FIELDS:
            return refuse(f"unknown fields {sorted(unknown)}")
        return stream(chunks)

    async def abort(request: Request) -> Response:
        seen["aborted"].extend(orjson.loads(await request.body())["request_ids"])
        aborted.set()
        return Response(status_code=200)

    async def models(_: Request) -> Response:
        cards = [
            {"id": "other", "object": "model", "max_model_len": 1},
            {"id": "deepseek-v4", "object": "model", "max_model_len": max_model_len},
        ]
        return JSONResponse({"object": "list", "data": cards})

    async def version(_: Request) -> Response:
        return JSONResponse({"version": "0.32.0"})

    async def info(_: Request) -> Response:
        if server_info is None:
            return Response(status_code=404)
        return JSONResponse(server_info)

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    app = Starlette(
        routes=[
            Route(GENERATE_PATH, generate, methods=["POST"]),
            Route(GENERATE_ABORT_PATH, abort, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/server_info", info, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
    app.state.seen = seen
    return app


async def discover_and_run(app: Starlette, **sampling: Any) -> tuple[Any, list[int], list[Any]]:
    async with serve_app(app) as url:
        client = VLLMClient(url, model="deepseek-v4")
        try:
            caps = await client.discover()
            ids, chunks = await collect(client, request_for([10, 11, 12], **sampling))
            return caps, ids, chunks
        finally:
            await client.aclose()


USAGE = {
    "prompt_tokens": 3,
    "completion_tokens": 3,
    "total_tokens": 6,
    "prompt_tokens_details": {"cached_tokens": 2},
}


def test_token_api_is_detected_and_carries_ids_finish_and_usage() -> None:
    app = fake_vllm_032(
        [
            sse(gen_chunk([5])),
            sse(gen_chunk([6])),
            sse(gen_chunk([1], "stop", 1)),
            sse({"request_id": "generate-tokens-req-1", "choices": [], "usage": USAGE}),
            b"data: [DONE]\n\n",
        ]
    )
    caps, ids, chunks = asyncio.run(discover_and_run(app, seed=3, stop_token_ids=(1,), min_new_tokens=2))
    assert caps.extra["token_api"] is True and caps.extra["version"] == "0.32.0"
    assert app.state.seen["paths"] == ["generate"]
    assert ids == [5, 6, 1]
    last = chunks[-1]
    assert (last.finish_reason, last.matched_stop) == ("stop", 1)
    assert (last.prompt_tokens, last.completion_tokens, last.cached_tokens) == (3, 3, 2)
    body = app.state.seen["body"]
    assert body["token_ids"] == [10, 11, 12] and body["model"] == "deepseek-v4"
    assert body["request_id"] == "req-1~" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    params = body["sampling_params"]
    assert params["max_tokens"] == 1000 and params["seed"] == 3 and params["stop_token_ids"] == [1]
    assert params["skip_special_tokens"] is False and params["detokenize"] is False
    assert params["min_tokens"] == 2


def test_usage_without_prompt_token_details_leaves_cached_tokens_unknown() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    app = fake_vllm_032(
        [
            sse(gen_chunk([1], "length")),
            sse({"request_id": "generate-tokens-req-1", "choices": [], "usage": usage}),
            b"data: [DONE]\n\n",
        ]
    )
    _, _, chunks = asyncio.run(discover_and_run(app))
    assert chunks[-1].finish_reason == "length" and chunks[-1].cached_tokens is None


def test_discover_reports_context_length_grammar_and_the_configured_backend() -> None:
    info = {"vllm_config": {"structured_outputs_config": {"backend": "guidance"}}}
    app = fake_vllm_032(
        [sse(gen_chunk([1], "stop")), b"data: [DONE]\n\n"], max_model_len=8192, server_info=info
    )
    caps, _, _ = asyncio.run(discover_and_run(app))
    assert caps.context_length == 8192  # the card of the model we serve, not the first card
    assert caps.grammar_backend == "guidance"
    assert caps.constraint_kinds == frozenset({"json_schema", "regex", "ebnf"})


def test_discover_without_server_info_still_reports_grammar_support() -> None:
    app = fake_vllm_032([sse(gen_chunk([1], "stop")), b"data: [DONE]\n\n"])
    caps, _, _ = asyncio.run(discover_and_run(app))
    assert caps.grammar_backend == "auto" and "ebnf" in caps.constraint_kinds


def test_grammar_switched_off_is_not_reported_as_a_capability() -> None:
    async def scenario() -> Any:
        async with serve_app(fake_vllm_032([])) as url:
            client = VLLMClient(url, model="deepseek-v4", grammar=False)
            try:
                return await client.discover(), client.supports_constraint("ebnf")
            finally:
                await client.aclose()

    caps, supported = asyncio.run(scenario())
    assert "ebnf" not in caps.constraint_kinds and supported is False


def test_discover_of_an_unreachable_worker_is_none() -> None:
    async def scenario() -> Any:
        client = VLLMClient("http://127.0.0.1:1", model="m")
        try:
            return await client.discover()
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) is None


@pytest.mark.parametrize("status", [403, 404])
def test_without_the_token_api_the_client_falls_back_to_completions(status: int) -> None:
    # 403: vLLM 0.32 started without --enable-scale-out; 404: a vLLM before 0.32
    app = fake_vllm_032(
        [sse(choice([5])), sse(choice([1], "stop", 1)), b"data: [DONE]\n\n"], token_api_status=status
    )
    caps, ids, _ = asyncio.run(discover_and_run(app))
    assert caps.extra["token_api"] is False
    assert app.state.seen["paths"] == ["completions"] and ids == [5, 1]
    assert "detokenize" not in app.state.seen["body"]


def test_the_token_api_is_probed_before_the_first_request_without_discover() -> None:
    app = fake_vllm_032([sse(gen_chunk([1], "stop")), b"data: [DONE]\n\n"])
    ids, _ = asyncio.run(run_against(app))
    assert app.state.seen["paths"] == ["generate"] and ids == [1]


def top(alternatives: list[tuple[int, float]]) -> list[dict]:
    return [{"token_id": t, "logprob": lp, "rank": r + 1} for r, (t, lp) in enumerate(alternatives)]


def test_generate_top_logprobs_are_exactly_the_k_best() -> None:
    # k = 2, so the client asks for 3. vLLM lists the sampled token (rank 7) first and cuts the list
    # at 3 entries: the two best alternatives are in it, the sampled token must not be reported.
    content = [
        {
            "token_id": 5,
            "logprob": -4.0,
            "rank": 7,
            "top_logprobs": [{"token_id": 5, "logprob": -4.0, "rank": 7}, *top([(8, -0.5), (9, -1.0)])],
        },
        {
            "token_id": 8,
            "logprob": -0.1,
            "rank": 1,
            "top_logprobs": top([(8, -0.1), (3, -2.5), (4, -3.0)]),
        },
        {  # a random model's logprobs tie: the ranks decide, not the list order
            "token_id": 6,
            "logprob": -1.0,
            "rank": 9,
            "top_logprobs": [{"token_id": 6, "logprob": -1.0, "rank": 9}, *top([(2, -1.0), (7, -1.0)])],
        },
    ]
    app = fake_vllm_032(
        [sse(gen_chunk([5, 8, 6], "length", logprobs={"content": content})), b"data: [DONE]\n\n"]
    )
    _, _, chunks = asyncio.run(discover_and_run(app, logprobs=True, top_logprobs=2))
    assert app.state.seen["body"]["sampling_params"]["logprobs"] == 3
    first, second, third = chunks[-1].logprobs
    assert (first.token_id, first.logprob, first.top) == (5, -4.0, ((8, -0.5), (9, -1.0)))
    assert (second.token_id, second.top) == (8, ((8, -0.1), (3, -2.5)))
    assert (third.token_id, third.top) == (6, ((2, -1.0), (7, -1.0)))


def test_completions_top_logprobs_drop_the_extra_sampled_entry() -> None:
    # vLLM /v1/completions returns k + 1 entries (the sampled token is added to the top k)
    logprobs = {
        "token_logprobs": [-3.0],
        "top_logprobs": [{"token_id:5": -3.0, "token_id:8": -0.4, "token_id:9": -1.2}],
    }
    app = fake_vllm_032(
        [sse(choice([5], "length", logprobs=logprobs)), b"data: [DONE]\n\n"], token_api_status=404
    )
    _, _, chunks = asyncio.run(discover_and_run(app, logprobs=True, top_logprobs=2))
    body = app.state.seen["body"]
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    assert chunks[-1].logprobs[0].top == ((8, -0.4), (9, -1.2))


def test_top_logprobs_past_the_workers_cap_go_out_on_completions() -> None:
    # k + 1 = 21 exceeds vLLM's default --max-logprobs 20 on the generate API; completions takes k = 20
    app = fake_vllm_032([sse(choice([5], "length")), b"data: [DONE]\n\n"])
    asyncio.run(discover_and_run(app, logprobs=True, top_logprobs=20))
    assert app.state.seen["paths"] == ["completions"] and app.state.seen["body"]["logprobs"] == 20


def test_client_disconnect_aborts_the_engine_request() -> None:
    app = fake_vllm_032([sse(gen_chunk([5]))], hold_open=True)

    async def scenario() -> list[str]:
        async with serve_app(app) as url:
            client = VLLMClient(url, model="deepseek-v4", token_api=True)
            stream = client.generate(request_for([10, 11]))
            first = await stream.__anext__()
            assert first.token_ids == [5]
            await stream.aclose()  # what the pipeline does when its client goes away
            await wait_until(lambda: app.state.seen["aborted"])
            await client.aclose()
            return app.state.seen["aborted"]

    # the id vLLM runs the request under, as its stream reported it
    assert asyncio.run(scenario()) == ["generate-tokens-req-1"]


def test_finished_requests_are_not_aborted() -> None:
    app = fake_vllm_032([sse(gen_chunk([1], "stop")), b"data: [DONE]\n\n"])
    asyncio.run(discover_and_run(app))
    assert app.state.seen["aborted"] == []


def test_in_stream_400_is_the_clients_error_and_500_the_workers() -> None:
    def error_event(code: int) -> bytes:
        return sse({"error": {"message": f"bad thing {code}", "type": "X", "param": None, "code": code}})

    with pytest.raises(RequestError, match="bad thing 400") as info:
        asyncio.run(discover_and_run(fake_vllm_032([error_event(400), b"data: [DONE]\n\n"])))
    assert info.value.status_code == 400
    with pytest.raises(EngineUnavailableError, match="bad thing 500"):
        asyncio.run(discover_and_run(fake_vllm_032([error_event(500), b"data: [DONE]\n\n"])))


def test_an_unreachable_worker_leaves_the_protocol_undecided() -> None:
    # a worker down at the first request must not be pinned to /v1/completions for good
    async def scenario() -> bool | None:
        client = VLLMClient("http://127.0.0.1:1", model="m")
        try:
            with pytest.raises(EngineUnavailableError):
                await collect(client, request_for([1]))
            return client.token_api
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) is None


def test_discover_warns_when_the_worker_serves_another_model_name(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with serve_app(fake_vllm_032([])) as url:
            client = VLLMClient(url, model="DeepSeek-V4-Flash")
            try:
                await client.discover()
            finally:
                await client.aclose()

    with caplog.at_level("WARNING", logger="deepseek_frontend.engines.vllm"):
        asyncio.run(scenario())
    assert "'deepseek-v4'" in caplog.text and "--worker-model" in caplog.text


def test_events_that_arrive_together_become_one_chunk() -> None:
    """Steps waiting in the socket (one write here) are one chunk; the finish still comes last, with
    the usage that follows it."""
    usage = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    together = sse(choice([5], prompt_token_ids=[10, 11, 12])) + sse(choice([6, 7])) + sse(choice([8]))
    ending = sse(choice([1], "stop", 1)) + sse({"choices": [], "usage": usage}) + b"data: [DONE]\n\n"
    app = fake_vllm([together, ending])
    ids, chunks = asyncio.run(run_against(app))
    assert ids == [5, 6, 7, 8, 1]
    assert [c.token_ids for c in chunks] == [[5, 6, 7, 8], [1]]
    assert chunks[0].completion_tokens == 4 and chunks[0].prompt_tokens == 3
    assert (chunks[-1].finish_reason, chunks[-1].completion_tokens) == ("stop", 5)


def test_a_connection_that_breaks_after_done_still_finishes_the_stream() -> None:
    """After ``[DONE]`` the body is only drained for connection reuse: a worker that drops the
    connection there (no chunked-encoding terminator) has still delivered a whole answer."""

    async def done_then_broken() -> AsyncIterator[bytes]:
        yield b"data: [DONE]\n\n"
        raise RuntimeError("the worker dropped the connection after [DONE]")

    app = fake_vllm([sse(choice([5, 6])), sse(choice([1], "stop", 1)), done_then_broken])
    ids, chunks = asyncio.run(run_against(app))
    assert ids == [5, 6, 1] and chunks[-1].finish_reason == "stop"
