"""The simulated engine behind SGLang's HTTP protocol (``deepseek-frontend sim-engine``).

A Starlette app that speaks the subset of SGLang's native API the frontend uses, backed by
a :class:`SimulatedEngine`, so the frontend's real SGLang client runs over real HTTP:

* ``POST /generate`` -- token mode (``input_ids`` in, ``output_ids`` out), SSE when
  ``stream`` is true (incremental chunks, or cumulative ones with ``cumulative=True`` like
  SGLang without ``--incremental-streaming-output``), one JSON object otherwise;
* ``POST /abort_request`` ``{"rid"}``; ``GET /health``; ``GET /health_generate`` (503 while
  every request would fail); ``GET /get_model_info``; ``GET /get_server_info``; ``GET /get_load``;
* test hooks: ``GET /sim/stats`` (started / finished / aborted counters and recent aborted
  rids -- an abort is an ``/abort_request`` or a client that went away mid-stream) and
  ``POST /sim/fault`` ``{"fail_after": N|null, "fail_mode": ...}`` to change faults live.

Faults (``fail_after`` output tokens, ``fail_mode``): ``error-event`` sends
``data: {"error": ...}`` and ends the stream; ``disconnect`` drops the connection without
finishing the body; ``http-500`` answers HTTP 500 when the failure comes before the first
token (and disconnects otherwise, since the status line is already sent).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from deepseek_frontend.engines.base import (
    DecodingConstraint,
    EngineChunk,
    GenerateRequest,
    SamplingParams,
)
from deepseek_frontend.engines.sim.engine import SimulatedEngine
from deepseek_frontend.errors import EngineError, EngineUnavailableError, RequestError

__all__ = ["FailMode", "SimFaults", "build_sim_app"]

FailMode = Literal["error-event", "disconnect", "http-500"]
FAIL_MODES: tuple[str, ...] = ("error-event", "disconnect", "http-500")
_CONSTRAINT_KINDS = ("ebnf", "json_schema", "regex", "structural_tag")
#: SSE events per body write when the engine has no inter-token delay
ZERO_DELAY_BATCH = 16


class SimFaults:
    """Mutable fault settings shared by the app's handlers."""

    def __init__(self, fail_after: int | None = None, fail_mode: FailMode = "error-event") -> None:
        self.fail_after = fail_after
        self.fail_mode: FailMode = fail_mode


class _Disconnect(Exception):
    """Raised inside the body iterator to make the server drop the connection mid-body."""


async def _batched(events: AsyncGenerator[bytes, None], size: int) -> AsyncIterator[bytes]:
    """Join up to ``size`` SSE events per body write (events stay separate on the wire format).

    One socket write per token costs more than the whole simulated engine; batching keeps a
    zero-delay sim server from being the bottleneck of a load test. Events produced before a
    simulated disconnect are still delivered.
    """
    buffer: list[bytes] = []
    try:
        try:
            async for event in events:
                buffer.append(event)
                if len(buffer) >= size:
                    yield b"".join(buffer)
                    buffer = []
        except _Disconnect:
            if buffer:
                yield b"".join(buffer)
            raise
        if buffer:
            yield b"".join(buffer)
    finally:
        # a client that went away closes this iterator; pass the close on to the engine stream
        await events.aclose()


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=400)


def _sampling_from(body: dict[str, Any]) -> SamplingParams:
    """SGLang ``sampling_params`` -> :class:`SamplingParams` (raises RequestError)."""
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise RequestError("sampling_params must be an object")
    if params.get("stop"):
        raise RequestError("stop strings are not supported in token mode (skip_tokenizer_init)")
    constraints = [k for k in _CONSTRAINT_KINDS if params.get(k) is not None]
    if len(constraints) > 1:
        raise RequestError("only one of json_schema, regex, ebnf, structural_tag may be set")
    constraint = DecodingConstraint(constraints[0], params[constraints[0]]) if constraints else None  # type: ignore[arg-type]
    seed = params.get("sampling_seed")
    return SamplingParams(
        max_new_tokens=int(params.get("max_new_tokens", 128)),
        temperature=float(params.get("temperature", 1.0)),
        seed=int(seed) if seed is not None else None,
        stop_token_ids=tuple(int(t) for t in params.get("stop_token_ids") or ()),
        constraint=constraint,
        logprobs=bool(body.get("return_logprob", False)),
        top_logprobs=int(body.get("top_logprobs_num", 0) or 0),
    )


def _finish_json(chunk: EngineChunk) -> dict[str, Any] | None:
    if chunk.finish_reason is None:
        return None
    if chunk.finish_reason == "length":
        return {"type": "length", "length": chunk.completion_tokens}
    if chunk.finish_reason == "abort":
        return {"type": "abort", "message": chunk.message}
    return {"type": "stop", "matched": chunk.matched_stop}


def _chunk_json(
    rid: str, chunk: EngineChunk, output_ids: list[int], logprobs: list[list[Any]] | None
) -> bytes:
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": _finish_json(chunk),
        "prompt_tokens": chunk.prompt_tokens,
        "completion_tokens": chunk.completion_tokens,
        "cached_tokens": chunk.cached_tokens,
    }
    if logprobs is not None:
        meta["output_token_logprobs"] = logprobs
    return orjson.dumps({"output_ids": output_ids, "meta_info": meta})


def build_sim_app(
    engine: SimulatedEngine,
    *,
    model_path: str = "deepseek-ai/DeepSeek-V4-Flash",
    cumulative: bool = False,
    faults: SimFaults | None = None,
) -> Starlette:
    """The Starlette app serving ``engine`` over SGLang's protocol (see module docstring)."""
    faults = faults or SimFaults()

    async def generate(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _bad_request(f"invalid JSON: {exc}")
        if not isinstance(body, dict):
            return _bad_request("body must be an object")
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
            return _bad_request("input_ids must be a non-empty list of token ids (the sim serves token mode)")
        try:
            sampling = _sampling_from(body)
        except (RequestError, ValueError, TypeError) as exc:
            return _bad_request(str(exc))
        rid = str(body.get("rid") or uuid.uuid4().hex)
        gen_request = GenerateRequest(rid, ids, sampling)
        # the engine's own fault setting is off; faults are applied here, per mode
        fail_after, fail_mode = faults.fail_after, faults.fail_mode
        stream = engine.generate(gen_request)
        try:
            first = await anext(stream)
        except RequestError as exc:
            return _bad_request(str(exc))
        if fail_after == 0:
            engine.mark_failed(rid)
            await stream.aclose()
            if fail_mode == "http-500":
                return JSONResponse({"error": {"message": "simulated failure"}}, status_code=500)
            first = None
        if not body.get("stream", False):
            return await _non_streaming(rid, first, stream, fail_after)
        events = _sse(rid, first, stream, fail_after, fail_mode, sampling.logprobs)
        # with no inter-token delay there is no timing to preserve: write several events at once
        batch = ZERO_DELAY_BATCH if engine.itl_s == 0 else 1
        return StreamingResponse(_batched(events, batch), media_type="text/event-stream")

    async def _non_streaming(
        rid: str, first: EngineChunk | None, stream: AsyncIterator[EngineChunk], fail_after: int | None
    ) -> Response:
        if first is None:
            return JSONResponse({"error": {"message": "simulated failure"}}, status_code=500)
        out = list(first.token_ids)
        last = first
        async for chunk in stream:
            out.extend(chunk.token_ids)
            last = chunk
            if fail_after is not None and len(out) >= fail_after:
                engine.mark_failed(rid)
                await stream.aclose()  # type: ignore[attr-defined]
                return JSONResponse({"error": {"message": "simulated failure"}}, status_code=500)
        return Response(_chunk_json(rid, last, out, None), media_type="application/json")

    async def _sse(
        rid: str,
        first: EngineChunk | None,
        stream: AsyncIterator[EngineChunk],
        fail_after: int | None,
        fail_mode: FailMode,
        logprobs: bool,
    ) -> AsyncGenerator[bytes, None]:
        all_ids: list[int] = []
        all_lps: list[list[Any]] = []
        try:
            chunk = first
            while chunk is not None:
                ids = chunk.token_ids
                failing = fail_after is not None and len(all_ids) + len(ids) > fail_after
                if failing:
                    ids = ids[: max(fail_after - len(all_ids), 0)]  # type: ignore[operator]
                lps = [[lp.logprob, lp.token_id, None] for lp in chunk.logprobs or ()][: len(ids)]
                all_ids.extend(ids)
                all_lps.extend(lps)
                if ids or not failing:
                    if failing:
                        chunk = EngineChunk(
                            ids, None, None, chunk.prompt_tokens, len(all_ids), chunk.cached_tokens
                        )
                    out_ids = all_ids if cumulative else ids
                    out_lps = (all_lps if cumulative else lps) if logprobs else None
                    yield b"data: " + _chunk_json(rid, chunk, out_ids, out_lps) + b"\n\n"
                if failing:
                    engine.mark_failed(rid)
                    if fail_mode == "error-event":
                        message = f"simulated failure after {len(all_ids)} tokens"
                        yield b"data: " + orjson.dumps({"error": {"message": message}}) + b"\n\n"
                        return
                    raise _Disconnect(f"simulated disconnect after {len(all_ids)} tokens")
                if chunk.finish_reason is not None:
                    break
                chunk = await anext(stream, None)
            if first is None:
                # fail_after == 0 without http-500: fail before any token
                if fail_mode == "error-event":
                    yield b"data: " + orjson.dumps({"error": {"message": "simulated failure"}}) + b"\n\n"
                    return
                raise _Disconnect("simulated disconnect before the first token")
            yield b"data: [DONE]\n\n"
        except (EngineError, EngineUnavailableError) as exc:
            yield b"data: " + orjson.dumps({"error": {"message": str(exc)}}) + b"\n\n"
        finally:
            # a client that went away closes this iterator; closing the engine stream counts the abort
            await stream.aclose()  # type: ignore[attr-defined]

    async def abort_request(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body() or b"{}")
        except orjson.JSONDecodeError:
            return _bad_request("invalid JSON")
        rid = body.get("rid") if isinstance(body, dict) else None
        if isinstance(rid, str):
            await engine.abort(rid)
        return Response(status_code=200)

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def health_generate(_: Request) -> Response:
        healthy = faults.fail_after != 0
        return Response(status_code=200 if healthy else 503)

    async def model_info(_: Request) -> Response:
        return JSONResponse({"model_path": model_path, "tokenizer_path": model_path, "is_generation": True})

    async def server_info(_: Request) -> Response:
        return JSONResponse(
            {
                "model_path": model_path,
                "skip_tokenizer_init": True,
                "incremental_streaming_output": not cumulative,
                "simulated": True,
            }
        )

    async def load(_: Request) -> Response:
        return JSONResponse({"num_reqs": engine.stats.running, "num_waiting_reqs": 0})

    async def stats(_: Request) -> Response:
        return JSONResponse(engine.stats.as_dict())

    async def set_fault(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body() or b"{}")
            value = body.get("fail_after", faults.fail_after)
            fail_after = int(value) if value is not None else None
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            return _bad_request('expected {"fail_after": N|null, "fail_mode": ...}')
        faults.fail_after = fail_after
        if "fail_mode" in body:
            if body["fail_mode"] not in FAIL_MODES:
                return _bad_request(f"fail_mode must be one of {FAIL_MODES}")
            faults.fail_mode = body["fail_mode"]
        return JSONResponse({"fail_after": faults.fail_after, "fail_mode": faults.fail_mode})

    routes = [
        Route("/generate", generate, methods=["POST"]),
        Route("/abort_request", abort_request, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/get_load", load, methods=["GET"]),
        Route("/sim/stats", stats, methods=["GET"]),
        Route("/sim/fault", set_fault, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.engine = engine
    app.state.faults = faults
    return app
