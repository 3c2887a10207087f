"""Streams to a worker reuse keep-alive connections: one TCP connection for sequential requests.

A stream left before the end of its body (the chunked-encoding terminator after ``[DONE]``) is
closed instead of pooled; a frontend streaming hundreds of requests would then open a connection
per request. Each fake worker below records the client port of every generate request it serves.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import AsyncIterator
from typing import Any

from deepseek_frontend.engines.sglang import SGLangClient
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.engines.sim.server import build_sim_app
from deepseek_frontend.engines.vllm import VLLMClient

from .conftest import collect, prompt_ids, request_for, serve_app
from .test_vllm_client import choice, fake_vllm, sse


class PortRecorder:
    """ASGI middleware: the client port (one per TCP connection) of every POST to ``path``."""

    def __init__(self, app: Any, path: str) -> None:
        self.app = app
        self.path = path
        self.ports: list[int] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == self.path:
            self.ports.append(scope["client"][1])
        await self.app(scope, receive, send)


def test_sequential_sglang_streams_share_one_connection(prompt_tokenizer: Any) -> None:
    app = PortRecorder(build_sim_app(SimulatedEngine(prompt_tokenizer)), "/generate")

    async def scenario() -> None:
        async with serve_app(app) as url:
            client = SGLangClient(url)
            try:
                for i in range(5):
                    out, _ = await collect(client, request_for(prompt_ids("write 5 words"), rid=f"r{i}"))
                    assert out
            finally:
                await client.aclose()

    asyncio.run(scenario())
    assert len(app.ports) == 5 and len(set(app.ports)) == 1, app.ports


async def _late_end() -> AsyncIterator[bytes]:
    """Nothing, a little later: the body's end (the chunked terminator) arrives after ``[DONE]``
    in a read of its own, as it does when an engine's response generator finishes a moment later."""
    await asyncio.sleep(0.05)
    return
    yield b""


def test_sequential_vllm_streams_share_one_connection() -> None:
    chunks = [sse(choice([5, 6])), sse(choice([1], "stop", 1)), b"data: [DONE]\n\n", _late_end]
    app = PortRecorder(fake_vllm(chunks), "/v1/completions")

    async def scenario() -> None:
        async with serve_app(app) as url:
            client = VLLMClient(url, model="deepseek-v4")
            try:
                for i in range(5):
                    out, _ = await collect(client, request_for([10, 11, 12], rid=f"r{i}"))
                    assert out == [5, 6, 1]
            finally:
                await client.aclose()

    asyncio.run(scenario())
    assert len(app.ports) == 5 and len(set(app.ports)) == 1, app.ports


def _finalised_generators(run: Any) -> list[str]:
    """The async generators that the event loop had to finalise (they were dropped unclosed) while
    ``run()`` ran: each one costs the loop a task, and its ``finally`` runs late."""
    finalised: list[str] = []

    async def scenario() -> None:
        firstiter, finalizer = sys.get_asyncgen_hooks()

        def record(agen: Any) -> None:
            finalised.append(agen.__qualname__)
            if finalizer is not None:
                finalizer(agen)

        sys.set_asyncgen_hooks(firstiter=firstiter, finalizer=record)
        await run()
        gc.collect()  # a generator dropped without aclose() is finalised now at the latest
        await asyncio.sleep(0)

    asyncio.run(scenario())
    return finalised


def test_finished_streams_close_their_generators_themselves(prompt_tokenizer: Any) -> None:
    sglang_app = build_sim_app(SimulatedEngine(prompt_tokenizer))
    vllm_app = fake_vllm([sse(choice([5, 6])), sse(choice([1], "stop", 1)), b"data: [DONE]\n\n"])

    async def run() -> None:
        async with serve_app(sglang_app) as sglang_url, serve_app(vllm_app) as vllm_url:
            clients = [SGLangClient(sglang_url), VLLMClient(vllm_url, model="deepseek-v4")]
            try:
                for i in range(3):
                    out, _ = await collect(clients[0], request_for(prompt_ids("write 5 words"), rid=f"s{i}"))
                    assert out
                    out, _ = await collect(clients[1], request_for([10, 11, 12], rid=f"v{i}"))
                    assert out == [5, 6, 1]
            finally:
                for client in clients:
                    await client.aclose()

    finalised = _finalised_generators(run)
    ours = [name for name in finalised if name in {"read_chunks", "merge_reads", "iter_sse_batches"}]
    assert not ours, f"engine-stream generators left to the loop's finaliser: {finalised}"
