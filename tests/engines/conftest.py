"""Shared helpers for engine tests: real DeepSeek prompts, local HTTP servers (the tokenizer is the
``prompt_tokenizer`` fixture, tests/support/tokenizers.py)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from deepseek_frontend.engines.base import EngineChunk, EngineClient, GenerateRequest, SamplingParams
from deepseek_frontend.formats import attach_request_tools, get_chat_format
from tests.support.tokenizers import bundled_tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a location",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["location"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 3},
                "num_results": {"type": "integer", "minimum": 5, "maximum": 20},
                "filters": {
                    "type": "object",
                    "properties": {
                        "safe": {"type": "boolean"},
                        "sites": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                        "score": {"type": "number", "exclusiveMinimum": 2.5},
                        "lang": {"const": "en"},
                    },
                    "required": ["safe", "sites"],
                },
            },
            "required": ["query", "filters"],
        },
    },
}
TOOLS = [WEATHER_TOOL, SEARCH_TOOL]


def render_prompt(
    user: str,
    *,
    tools: Sequence[dict[str, Any]] = (),
    thinking: bool = False,
    tool_result: str | None = None,
    family: str = "deepseek_v4",
) -> str:
    """A real DeepSeek prompt from the project's renderer (one user turn, optional tool round trip)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
    if tool_result is not None:
        call = {"name": "get_weather", "arguments": json.dumps({"location": "Paris"})}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c1", "type": "function", "function": call}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": "c1", "content": tool_result})
    if tools:
        messages = attach_request_tools(messages, list(tools))
    return get_chat_format(family).encode_messages(messages, thinking_mode="thinking" if thinking else "chat")


def prompt_ids(user: str, **kwargs: Any) -> list[int]:
    return bundled_tokenizer().encode_raw(render_prompt(user, **kwargs))


def request_for(ids: list[int], rid: str = "req-1", **sampling: Any) -> GenerateRequest:
    sampling.setdefault("max_new_tokens", 1000)
    return GenerateRequest(rid, ids, SamplingParams(**sampling))


async def collect(client: EngineClient, request: GenerateRequest) -> tuple[list[int], list[EngineChunk]]:
    """All output ids and chunks of one request."""
    ids: list[int] = []
    chunks: list[EngineChunk] = []
    async for chunk in client.generate(request):
        ids.extend(chunk.token_ids)
        chunks.append(chunk)
    return ids, chunks


@asynccontextmanager
async def serve_app(
    app: Any, host: str = "127.0.0.1", port: int = 0, *, lifespan: bool = False
) -> AsyncIterator[str]:
    """Serve an ASGI app on ``host:port`` (default: a free localhost port) in this event loop, its
    lifespan run when ``lifespan``; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="critical", lifespan="on" if lifespan else "off", access_log=False)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


async def wait_until(predicate: Any, timeout_s: float = 5.0) -> None:
    """Poll ``predicate()`` until true (conditions, not fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)
