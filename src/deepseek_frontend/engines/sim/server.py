"""The simulated engine behind SGLang's HTTP protocol (``deepseek-frontend sim-engine``).

A Starlette app that speaks the subset of SGLang's native API the frontend uses, backed by
a :class:`SimulatedEngine`, so the frontend's real SGLang client runs over real HTTP:

* ``POST /generate`` -- token mode (``input_ids`` in, ``output_ids`` out), SSE when
  ``stream`` is true (incremental chunks, or cumulative ones with ``cumulative=True`` like
  SGLang without ``--incremental-streaming-output``), one JSON object otherwise;
* ``POST /abort_request`` ``{"rid"}``; ``GET /health``; ``GET /health_generate`` (503 while
  every request would fail); ``GET /get_model_info``; ``GET /get_server_info``; ``GET /get_load``;
* test hooks: ``GET /sim/stats`` (started / finished / aborted counters and recent aborted
  rids -- an abort is an ``/abort_request`` or a client that went away mid-stream -- how many
  prompts were read past a recent one's shared prefix, ``prompts_reused``, or whole, and the W3C
  trace context headers of the last generate requests that carried one, ``trace_headers``) and
  ``POST /sim/fault`` ``{"fail_after": N|null, "fail_mode": ...}`` to change faults live.

A prefill or decode role (``disagg``, engines/sim/pd_roles.py) answers ``/generate`` as SGLang's
PD workers do; ``/server_info`` reports ``disaggregation_mode`` and ``disaggregation_bootstrap_port``
(``"null"`` and 8998 on an aggregated worker, as SGLang does) and ``chunked_prefill_size``.

Behaviour (:class:`~deepseek_frontend.engines.sim.behavior.SimBehavior`, default: the engine's own,
else ``ideal``): what SGLang would refuse is refused the way SGLang does -- a grammar without a grammar
backend as one abort chunk with ``status_code`` 400, an over-long request (context length with the
speculative reservation) as HTTP 200 plus one in-stream error event ``{"error": {"message", "type",
"code": 400, "retryable": false}}``, both followed by ``data: [DONE]``; without streaming, HTTP 400.
A ``sampling_params`` field SGLang does not know is an HTTP 400 ``{"error": "unknown field ..."}``
(its contract check). ``sampling_seed`` is dropped unless the behaviour is deterministic; the health
endpoints wait ``health_delay_s``; ``GET /server_info`` (and ``/get_server_info``) report the
behaviour in SGLang's field names.

Faults (``fail_after`` output tokens, ``fail_mode``): ``error-event`` sends
``data: {"error": ...}`` and ends the stream; ``disconnect`` drops the connection without
finishing the body; ``http-500`` answers HTTP 500 when the failure comes before the first
token (and disconnects otherwise, since the status line is already sent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from deepseek_frontend._tasks import DisconnectWatch
from deepseek_frontend.engines.sim.behavior import PRESETS, SimBehavior, SimRefusal
from deepseek_frontend.engines.sim.disagg import DEFAULT_BOOTSTRAP_PORT, KvArrival
from deepseek_frontend.engines.sim.engine import INPUT_IDS_ERROR, SimulatedEngine
from deepseek_frontend.engines.sim.kv_publish import RankPublishers
from deepseek_frontend.engines.sim.pd_roles import PdLeg, SimDisagg
from deepseek_frontend.engines.sim.prompts import RecentPrompts, SimPrompt
from deepseek_frontend.engines.sim.scheduler import QueueAbortError, SchedulerSettings
from deepseek_frontend.errors import EngineError, EngineUnavailableError, RequestError
from deepseek_frontend.generation import DecodingConstraint, EngineChunk, GenerateRequest, SamplingParams

__all__ = ["FailMode", "SimFaults", "build_sim_app"]

FailMode = Literal["error-event", "disconnect", "http-500"]
FAIL_MODES: tuple[str, ...] = ("error-event", "disconnect", "http-500")
_CONSTRAINT_KINDS = ("ebnf", "json_schema", "regex", "structural_tag")
#: SSE events per body write when the engine has no inter-token delay
ZERO_DELAY_BATCH = 16
#: the range of SGLang's ``priority`` field (a signed 64-bit integer)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class SimFaults:
    """Mutable fault settings shared by the app's handlers (``pd_transfer``: ``hang`` makes a prefill
    worker never send a prefilled room's KV)."""

    def __init__(self, fail_after: int | None = None, fail_mode: FailMode = "error-event") -> None:
        self.fail_after = fail_after
        self.fail_mode: FailMode = fail_mode
        self.pd_transfer: Literal["ok", "hang"] = "ok"


class _Disconnect(Exception):
    """Raised inside the body iterator to make the server drop the connection mid-body."""


async def _batched(events: AsyncGenerator[bytes, None], size: int) -> AsyncIterator[bytes]:
    """Join up to ``size`` SSE events per body write (events stay separate on the wire format),
    except the first, which is written alone at once.

    One socket write per token costs more than the whole simulated engine; batching keeps a
    zero-delay sim server from being the bottleneck of a load test. The first token is what a
    client waits for (time to first token): it never waits for the ones after it. Events
    produced before a simulated disconnect are still delivered.
    """
    buffer: list[bytes] = []
    first = True
    try:
        try:
            async for event in events:
                buffer.append(event)
                if first or len(buffer) >= size:
                    first = False
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


class _SseResponse(Response):
    """``text/event-stream`` written straight onto the server's ``send``, for ``/generate``.

    Starlette's ``StreamingResponse`` runs an anyio task group per request and its middleware
    wraps ``send`` in three Python layers per body part; at 256 streams x 1 token per chunk those
    layers cost more than the simulated engine. Here one watcher task per request waits for the
    client's disconnect and cancels the writer (as Starlette does), and the body iterator is
    always closed (its ``finally`` closes the engine stream, counting an abort).
    """

    media_type = "text/event-stream"

    def __init__(self, body: AsyncGenerator[bytes, None]) -> None:
        # not Response.__init__: it would send "content-length: 0" for the missing body
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        self.body_iterator = body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        watch = DisconnectWatch(receive)
        body = self.body_iterator
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
            async for part in body:
                await send({"type": "http.response.body", "body": part, "more_body": True})
            watch.stop()  # the server answers http.disconnect once the response is complete
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watch.absorb():  # the client went away: a normal end for a stream, not an error
                raise
        finally:
            watch.stop()
            await body.aclose()


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=400)


#: ``sampling_params`` fields SGLang 0.5.23 accepts; it answers 400 to any other (its API contract
#: rejects unknown keys there, while unknown top-level keys are ignored)
SGLANG_SAMPLING_FIELDS = frozenset(
    {
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
        "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
        "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
        "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
        "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
    }
)  # fmt: skip


def _unknown_sampling_field(body: dict[str, Any]) -> str | None:
    """SGLang's contract error for an unknown ``sampling_params`` key, or None."""
    params = body.get("sampling_params")
    if not isinstance(params, dict):
        return None
    for key in params:
        if key not in SGLANG_SAMPLING_FIELDS:
            return f"unknown field `{key}`"
    return None


def _refusal_events(rid: str, refusal: SimRefusal, prompt_tokens: int) -> list[bytes]:
    """The SSE events SGLang streams for a request it refuses (then ``[DONE]``)."""
    if refusal.kind == "abort":
        meta = {
            "id": rid,
            "finish_reason": {
                "type": "abort",
                "message": refusal.message,
                "status_code": refusal.status_code,
                "err_type": "BadRequestError",
            },
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 0,
            "cached_tokens": 0,
        }
        event = orjson.dumps({"output_ids": [], "meta_info": meta})
    else:
        error = {
            "message": refusal.message,
            "type": "invalid_request_error",
            "code": refusal.status_code,
            "retryable": False,
        }
        event = orjson.dumps({"error": error})
    return [b"data: " + event + b"\n\n", b"data: [DONE]\n\n"]


def _queue_abort_events(rid: str, exc: QueueAbortError, prompt_tokens: int) -> list[bytes]:
    """The abort finish SGLang streams for a request its scheduler aborted (503), then ``[DONE]``."""
    meta = {
        "id": rid,
        "finish_reason": {"type": "abort", "message": exc.message, "status_code": exc.status_code},
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 0,
        "cached_tokens": 0,
    }
    return [b"data: " + orjson.dumps({"output_ids": [], "meta_info": meta}) + b"\n\n", b"data: [DONE]\n\n"]


def _routed_rank(body: dict[str, Any]) -> int | None:
    """``routed_dp_rank``, or its deprecated alias ``data_parallel_rank`` (``managers/io_struct.py``
    ``normalize_batch_and_arguments`` copies the alias over when the field is unset)."""
    rank = body.get("routed_dp_rank")
    if rank is None:
        rank = body.get("data_parallel_rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _dp_rank_refusal(body: dict[str, Any], ranks: int = 1) -> SimRefusal | None:
    """SGLang's tokenizer-manager check of the routed rank (``managers/tokenizer_manager.py:915-924``):
    with one DP rank, 0 is ignored; any rank outside ``[0, ranks)`` is a ValueError -- HTTP 400, or
    an in-stream error event -- ``routed_dp_rank=R out of range [0, N)``."""
    rank = _routed_rank(body)
    if rank is None or (ranks <= 1 and rank == 0) or 0 <= rank < ranks:
        return None
    return SimRefusal("error", f"routed_dp_rank={rank} out of range [0, {ranks})")


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
    min_new = int(params.get("min_new_tokens", 0) or 0)
    if not 0 <= min_new <= int(params.get("max_new_tokens", 128)):
        # SGLang's SamplingParams.verify rejects the same range
        raise RequestError("min_new_tokens must be in [0, max_new_tokens]")
    return SamplingParams(
        max_new_tokens=int(params.get("max_new_tokens", 128)),
        temperature=float(params.get("temperature", 1.0)),
        seed=int(seed) if seed is not None else None,
        stop_token_ids=tuple(int(t) for t in params.get("stop_token_ids") or ()),
        constraint=constraint,
        logprobs=bool(body.get("return_logprob", False)),
        top_logprobs=int(body.get("top_logprobs_num", 0) or 0),
        ignore_eos=bool(params.get("ignore_eos", False)),
        min_new_tokens=min_new,
    )


def _finish_json(chunk: EngineChunk) -> dict[str, Any] | None:
    if chunk.finish_reason is None:
        return None
    if chunk.finish_reason == "length":
        return {"type": "length", "length": chunk.completion_tokens}
    if chunk.finish_reason == "abort":
        return {"type": "abort", "message": chunk.message}
    return {"type": "stop", "matched": chunk.matched_stop}


def _chunk_event(rid_json: bytes, chunk: EngineChunk, output_ids: list[int]) -> bytes:
    """``data: {chunk}\\n\\n`` of a mid-stream chunk without logprobs, from pre-encoded pieces.

    The same bytes :func:`_chunk_json` writes (field order included) without building and
    dumping a meta dict per token.
    """
    return b"".join(
        (
            b'data: {"output_ids":',
            orjson.dumps(output_ids),
            b',"meta_info":{"id":',
            rid_json,
            b',"finish_reason":null,"prompt_tokens":',
            b'%d,"completion_tokens":%d,"cached_tokens":%d}}\n\n'
            % (chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens),
        )
    )


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


class _SimApp(Starlette):
    """Starlette, with ``POST /generate`` dispatched ahead of the middleware stack.

    The per-token path of a load test should pay for the engine and the socket only: the
    handler's response (:class:`_SseResponse` for streams) is called with the server's own
    ``send``. Every other route goes through Starlette as usual.
    """

    def __init__(self, generate: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._generate = generate

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/generate" and scope["method"] == "POST":
            scope["app"] = self
            response = await self._generate(Request(scope, receive))
            await response(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def build_sim_app(
    engine: SimulatedEngine,
    *,
    model_path: str = "deepseek-ai/DeepSeek-V4-Flash",
    cumulative: bool = False,
    faults: SimFaults | None = None,
    behavior: SimBehavior | None = None,
    disagg: SimDisagg | None = None,
    attn_dp_size: int | None = None,
    kv_publishers: RankPublishers | None = None,
    tokenizer_worker_num: int = 1,
) -> Starlette:
    """The Starlette app serving ``engine`` over SGLang's protocol (see module docstring).

    ``tokenizer_worker_num``: SGLang's ``--tokenizer-worker-num``; with more than one, an
    ``/abort_request`` whose exact rid this worker does not hold is still matched by prefix.

    ``behavior``: what the worker refuses and reports (default: ``engine.behavior``, else ``ideal``).
    ``disagg``: a prefill or decode role (engines/sim/pd_roles.py); None for an aggregated worker.
    ``attn_dp_size``: data-parallel ranks (default: one per cache model of the engine). A request
    goes to its ``routed_dp_rank``, else to the next rank in turn (SGLang's DP controller:
    ``maybe_external_dp_rank_routing``, then ``round_robin``, the ``auto`` load-balance method of an
    aggregated worker; ``managers/data_parallel_controller.py:865, 880``). ``kv_publishers``: the
    ranks' KV event publishers, described in ``/server_info`` as SGLang describes them.
    """
    faults = faults or SimFaults()
    ranks = max(1, attn_dp_size or len(getattr(engine, "kvs", ()) or ()) or 1)
    next_rank = [0]
    behavior = behavior or getattr(engine, "behavior", None) or PRESETS["ideal"]

    def live(rid: str) -> bool:
        """Whether ``rid`` is a request this worker holds (SGLang's ``rid_to_state``)."""
        return engine.is_running(rid) or (disagg is not None and disagg.holds(rid))

    def abort_prefix(rid: str) -> None:
        """SGLang's scheduler abort: every stream and PD leg whose rid starts with ``rid``."""
        engine.abort_rid(rid)
        if disagg is not None:
            disagg.abort_prefix(rid)

    # a stream closed before its finish aborts by prefix here as /abort_request does
    engine.on_close_abort = abort_prefix
    if disagg is not None:
        disagg.on_close_abort = abort_prefix
    prompts = RecentPrompts()
    #: the trace context of recent generate requests (what a traced frontend sent), newest last
    traced: deque[dict[str, str]] = deque(maxlen=64)

    async def generate(request: Request) -> Response:
        raw = await request.body()
        parent = request.headers.get("traceparent")
        if parent is not None:
            traced.append({"traceparent": parent, "tracestate": request.headers.get("tracestate", "")})
        # a follow-up's ids are parsed, packed and hashed only past what it shares with a recent one
        read = prompts.read(raw)
        prompt: SimPrompt | None = None
        if read is not None:
            body, prompt = read
        else:
            try:
                body = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                return _bad_request(f"invalid JSON: {exc}")
            if not isinstance(body, dict):
                return _bad_request("body must be an object")
        ids = body.get("input_ids")
        # that every id is an int the engine checks as it packs them (one C loop, not two)
        if not isinstance(ids, list) or not ids:
            return _bad_request(INPUT_IDS_ERROR)
        contract_error = _unknown_sampling_field(body)
        if contract_error is not None:
            return JSONResponse({"error": contract_error}, status_code=400)
        try:
            sampling = _sampling_from(body)
        except (RequestError, ValueError, TypeError) as exc:
            return _bad_request(str(exc))
        rid = str(body.get("rid") or uuid.uuid4().hex)
        refusal = _dp_rank_refusal(body, ranks) or behavior.refusal(len(ids), sampling)
        if refusal is not None:
            if not body.get("stream", False):
                return JSONResponse({"error": {"message": refusal.message}}, status_code=refusal.status_code)
            events = _refusal_events(rid, refusal, len(ids))
            return StreamingResponse(iter(events), media_type="text/event-stream")
        if sampling.seed is not None and not behavior.deterministic_inference:
            # SGLang's sampler reads sampling_seed only with --enable-deterministic-inference
            sampling = dataclasses.replace(sampling, seed=None)
        images = body.get("image_data")
        if isinstance(images, str):
            images = [images]  # SGLang takes one image as a bare string too
        if images is not None and (
            not isinstance(images, list) or not all(isinstance(i, str) and i for i in images)
        ):
            return _bad_request("image_data must be a list of data: URLs or base64 strings")
        priority = body.get("priority")
        if priority is not None and (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not _INT64_MIN <= priority <= _INT64_MAX
        ):
            # SGLang's tokenizer manager checks the same (a signed 64-bit integer)
            return _bad_request(f"priority must be a signed 64-bit integer, got {priority!r}")
        gen_request = GenerateRequest(rid, ids, sampling, images=tuple(images or ()), priority=priority)
        if disagg is not None and live(rid):
            # tokenizer_manager.py: a rid already held is refused before anything runs
            return _bad_request(f"Duplicate request ID detected: {rid}")
        if disagg is not None:
            return await disagg.generate(body, gen_request, _pd_leg(rid, prompt, sampling.logprobs))
        # the engine's own fault setting is off; faults are applied here, per mode
        fail_after, fail_mode = faults.fail_after, faults.fail_mode
        rank = _routed_rank(body)
        if rank is None or ranks == 1:
            rank = next_rank[0] % ranks
            next_rank[0] += 1
        stream = (
            engine.run(gen_request, prompt, dp_rank=rank) if ranks > 1 else engine.run(gen_request, prompt)
        )
        streaming = bool(body.get("stream", False))
        scheduler = getattr(engine, "scheduler", None)
        if streaming and fail_after is None and scheduler is not None and scheduler.would_wait():
            # SGLang sends a stream's headers before the request reaches its scheduler: a request
            # that waits for a place in the batch must not look like a silent worker meanwhile
            return _SseResponse(_after_wait(rid, stream, sampling.logprobs))
        try:
            first = await anext(stream)
        except RequestError as exc:
            return _bad_request(str(exc))
        except QueueAbortError as exc:
            if not streaming:
                return JSONResponse({"error": {"message": exc.message}}, status_code=exc.status_code)
            return StreamingResponse(
                iter(_queue_abort_events(rid, exc, len(ids))), media_type="text/event-stream"
            )
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
        if engine.itl_s == 0:
            return _SseResponse(_batched(events, ZERO_DELAY_BATCH))
        return _SseResponse(events)

    async def _after_wait(
        rid: str, stream: AsyncGenerator[EngineChunk, None], logprobs: bool
    ) -> AsyncGenerator[bytes, None]:
        """A stream whose headers went out before its first chunk: a refusal or an abort from the
        queue comes in the stream, as SGLang sends it."""
        try:
            try:
                first = await anext(stream)
            except QueueAbortError as exc:
                for event in _queue_abort_events(rid, exc, 0):
                    yield event
                return
            except RequestError as exc:
                error = {"message": str(exc), "code": 400, "retryable": False}
                yield b"data: " + orjson.dumps({"error": error}) + b"\n\n"
                yield b"data: [DONE]\n\n"
                return
            events = _sse(rid, first, stream, None, faults.fail_mode, logprobs)
            async for event in _batched(events, ZERO_DELAY_BATCH) if engine.itl_s == 0 else events:
                yield event
        finally:
            await stream.aclose()

    def _pd_leg(rid: str, prompt: SimPrompt | None, logprobs: bool) -> PdLeg:
        """The aggregated answer's parts, for a PD role to run after (decode) or around (prefill) it."""
        fail_after, fail_mode = faults.fail_after, faults.fail_mode

        def plan(request: GenerateRequest) -> list[int]:
            return engine.plan_request(request, prompt)

        def open_stream(
            request: GenerateRequest, transferred: KvArrival | None
        ) -> AsyncIterator[EngineChunk]:
            if transferred is None:
                return engine.run(request, prompt)
            return engine.run(
                request,
                prompt,
                transferred_cached=transferred.cached_tokens,
                transferred_plan=transferred.plan,
            )

        async def respond(first: EngineChunk, stream: AsyncIterator[EngineChunk]) -> Response:
            return await _non_streaming(rid, first, stream, fail_after)

        def events(first: EngineChunk, stream: AsyncIterator[EngineChunk]) -> AsyncGenerator[bytes, None]:
            return _sse(rid, first, stream, fail_after, fail_mode, logprobs)

        def sse(body: AsyncGenerator[bytes, None]) -> Response:
            return _SseResponse(_batched(body, ZERO_DELAY_BATCH) if engine.itl_s == 0 else body)

        return PdLeg(plan, open_stream, respond, events, sse, engine.after_forward)

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
        rid_json = orjson.dumps(rid)
        try:
            chunk = first
            while chunk is not None:
                ids = chunk.token_ids
                if (
                    chunk.finish_reason is None
                    and fail_after is None
                    and not logprobs
                    and not cumulative
                    and chunk.logprobs is None
                ):
                    # the per-token fast path: no fault, no logprobs, incremental chunks
                    all_ids.extend(ids)
                    yield _chunk_event(rid_json, chunk, ids)
                    chunk = await anext(stream, None)
                    continue
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
        if not isinstance(body, dict):
            return Response(status_code=200)
        if body.get("abort_all") is True:
            engine.abort_all()
            if disagg is not None:
                disagg.abort_prefix("")
            return Response(status_code=200)
        rid = body.get("rid")
        # SGLang's tokenizer manager ignores an empty rid ("would startswith-match every request")
        # and, with one tokenizer worker, a rid it does not hold; the scheduler then aborts by
        # prefix (tokenizer_manager.py abort_request, scheduler.py Scheduler.abort_request)
        if isinstance(rid, str) and rid and (tokenizer_worker_num > 1 or live(rid)):
            abort_prefix(rid)
        return Response(status_code=200)

    async def health(_: Request) -> Response:
        if behavior.health_delay_s:
            await asyncio.sleep(behavior.health_delay_s)  # SGLang's /health generates one token too
        return Response(status_code=200)

    async def health_generate(_: Request) -> Response:
        if behavior.health_delay_s:
            await asyncio.sleep(behavior.health_delay_s)
        healthy = faults.fail_after != 0
        return Response(status_code=200 if healthy else 503)

    async def model_info(_: Request) -> Response:
        return JSONResponse({"model_path": model_path, "tokenizer_path": model_path, "is_generation": True})

    async def server_info(_: Request) -> Response:
        info = behavior.server_info(model_path=model_path, cumulative=cumulative)
        info["internal_states"] = [{"num_reqs": engine.stats.running}]
        if getattr(engine, "kv", None) is not None:
            info.update(engine.kv.server_info())  # page_size, max_total_num_tokens (engines/sim/kv.py)
        # SGLang's resolved DP args: --attn-dp-size N reports attn_dp_size N and dp_size 1
        info["dp_size"], info["attn_dp_size"] = 1, ranks
        info["kv_events"] = None
        if kv_publishers is not None:
            page = engine.kv.page_size if getattr(engine, "kv", None) is not None else 256
            info["kv_events"] = kv_publishers.descriptor(page)
            info["kv_events_config"] = kv_publishers.config_json()  # a JSON string, as SGLang reports it
        scheduler = getattr(engine, "scheduler", None)
        # the scheduling flags (engines/sim/scheduler.py), SGLang's defaults without a scheduler
        info.update((scheduler.settings if scheduler is not None else SchedulerSettings()).server_info())
        info["chunked_prefill_size"] = getattr(engine, "chunked_prefill_size", None)
        info["enable_mixed_chunk"] = getattr(engine, "enable_mixed_chunk", False)
        # SGLang's PD keys: "null" and the default port on an aggregated worker
        info["disaggregation_mode"] = "null"
        info["disaggregation_bootstrap_port"] = DEFAULT_BOOTSTRAP_PORT
        if disagg is not None:
            info.update(disagg.server_info())
        return JSONResponse(info)

    async def load(_: Request) -> Response:
        waiting = engine.stats.waiting
        return JSONResponse({"num_reqs": engine.stats.running - waiting, "num_waiting_reqs": waiting})

    async def stats(_: Request) -> Response:
        kvs = getattr(engine, "kvs", None) or []
        memo = {"prompts_reused": prompts.reused, "prompts_read_whole": prompts.read_whole}
        cache: dict[str, Any] = {}
        for kv in kvs:  # every rank's counters summed; per rank under "ranks"
            for key, value in kv.stats().items():
                cache[key] = cache.get(key, 0) + value
        if len(kvs) > 1:
            cache["ranks"] = [kv.stats() for kv in kvs]
        pd = disagg.stats() if disagg is not None else {}
        trace = {"trace_headers": list(traced)}
        scheduler = getattr(engine, "scheduler", None)
        sched = scheduler.stats() if scheduler is not None else {}
        return JSONResponse({**engine.stats.as_dict(), **memo, **cache, **pd, **trace, **sched})

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
        if "pd_transfer" in body:
            if body["pd_transfer"] not in ("ok", "hang"):
                return _bad_request('pd_transfer must be "ok" or "hang"')
            faults.pd_transfer = body["pd_transfer"]
            if disagg is not None and disagg.bootstrap is not None:
                disagg.bootstrap.hold_transfers = faults.pd_transfer == "hang"
        return JSONResponse(
            {
                "fail_after": faults.fail_after,
                "fail_mode": faults.fail_mode,
                "pd_transfer": faults.pd_transfer,
            }
        )

    routes = [
        Route("/generate", generate, methods=["POST"]),
        Route("/abort_request", abort_request, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_load", load, methods=["GET"]),
        Route("/sim/stats", stats, methods=["GET"]),
        Route("/sim/fault", set_fault, methods=["POST"]),
    ]
    app = _SimApp(generate, routes=routes)
    app.state.engine = engine
    app.state.faults = faults
    app.state.behavior = behavior
    return app
