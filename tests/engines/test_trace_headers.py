"""The vLLM client sends a request's W3C trace context as headers (the SGLang client's are checked end
to end over the sim-engine in tests/server/test_tracing.py): on the streamed request and on the
prefill leg of a disaggregated pair; a request without trace context sends none."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deepseek_frontend.engines.vllm import VLLMClient

from .conftest import collect, request_for, serve_app

TRACE = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "vendor=opaque1",
}


def recording_vllm() -> tuple[Starlette, list[dict[str, Any]]]:
    """A vLLM ``/v1/completions`` that records each request's trace headers and whether it streamed."""
    seen: list[dict[str, Any]] = []

    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        headers = {k: request.headers[k] for k in ("traceparent", "tracestate") if k in request.headers}
        seen.append({"stream": body.get("stream", False), "headers": headers})
        finish = {"index": 0, "text": "", "token_ids": [7], "finish_reason": "length", "stop_reason": None}
        if not body.get("stream"):
            return JSONResponse({"choices": [finish], "kv_transfer_params": {"remote_engine_id": "e1"}})
        events = [
            {"id": "cmpl-1", "object": "text_completion", "choices": [finish], "usage": None},
            {"id": "cmpl-1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
        ]
        text = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
        return Response(text, media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])]), seen


def test_the_vllm_client_sends_the_trace_context_it_is_given() -> None:
    app, seen = recording_vllm()

    async def run() -> None:
        async with serve_app(app) as url:
            client = VLLMClient(url, model="deepseek-v4", token_api=False)
            try:
                traced = dataclasses.replace(request_for([10, 11, 12], max_new_tokens=1), trace_headers=TRACE)
                ids, _ = await collect(client, traced)
                assert ids == [7]
                params = await client.remote_prefill(traced)
                assert params == {"remote_engine_id": "e1"}
                await collect(client, request_for([10, 11, 12], max_new_tokens=1))
            finally:
                await client.aclose()

    asyncio.run(run())
    assert seen == [
        {"stream": True, "headers": TRACE},
        {"stream": False, "headers": TRACE},
        {"stream": True, "headers": {}},
    ]
