"""The vLLM client against a fake ``/v1/completions`` speaking vLLM's documented stream shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from deepseek_frontend.engines.base import DecodingConstraint
from deepseek_frontend.engines.vllm import VLLMClient
from deepseek_frontend.errors import (
    EngineStreamError,
    EngineUnavailableError,
    RequestError,
    UnsupportedFeatureError,
)

from .conftest import collect, request_for, serve_app


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


def fake_vllm(chunks: list[bytes], *, status: int = 200, healthy: bool = True) -> Starlette:
    seen: dict[str, Any] = {}

    async def completions(request: Request) -> Response:
        seen["body"] = orjson.loads(await request.body())
        if status != 200:
            return JSONResponse(
                {"object": "error", "message": f"status {status}", "code": status}, status_code=status
            )

        async def body() -> AsyncIterator[bytes]:
            for part in chunks:
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


def test_tool_grammar_is_refused_up_front_unless_enabled() -> None:
    client = VLLMClient("http://127.0.0.1:1", model="m")
    assert not client.supports_constraint("ebnf") and client.supports_constraint("json_schema")
    with pytest.raises(UnsupportedFeatureError):
        client.request_body(request_for([1], constraint=DecodingConstraint("ebnf", 'root ::= "x"')))
    enabled = VLLMClient("http://127.0.0.1:1", model="m", grammar=True)
    body = enabled.request_body(request_for([1], constraint=DecodingConstraint("ebnf", 'root ::= "x"')))
    assert body["structured_outputs"] == {"grammar": 'root ::= "x"'}


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
