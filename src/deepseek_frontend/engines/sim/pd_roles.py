"""``/generate`` on a prefill or a decode simulated worker, as SGLang 0.5.23 answers it in PD mode.

Both roles need ``bootstrap_room``: without it the request is refused like SGLang's scheduler
refuses it (an abort with ``status_code`` 400, "Invalid request: Disaggregated request received
without bootstrap room id. req.rid='...'"). Every other failure is an abort with ``status_code``
500 and SGLang's message. A stream (``"stream": true``) answers HTTP 200 at once and carries the
outcome as SSE events: the abort is one chunk ``{"output_ids": [], "meta_info": {"id",
"finish_reason": {"type": "abort", "message", "status_code", "err_type": null}, ...}}`` then
``data: [DONE]``. Without streaming, a 400 is ``{"error": {"message"}}`` and a 500 is FastAPI's
``{"object": "error", "message", "type": "500", "param": null, "code": 500}``.

* **prefill**: the prompt is prefilled (the engine's prefill cost, with ``max_new_tokens`` 1 as
  SGLang sets it), its KV waits in the room (engines/sim/disagg.py), and the answer comes once a
  decode worker has received it: one chunk ``output_ids: [first token]``, ``finish_reason
  {"type": "length", "length": 0}``, ``completion_tokens`` 1. No decode within the bootstrap
  timeout: "Prefill bootstrap failed ... Request R timed out after Xs in KVPoll.Bootstrapping".
* **decode**: the room's KV is fetched from ``bootstrap_host:bootstrap_port`` first, then the
  engine decodes without a prefill of its own; the output is the aggregated worker's, first token
  included, and ``cached_tokens`` is the prefill's. A room that never arrives: "Decode transfer
  failed ... Request R timed out after Xs in KVPoll.WaitingForInput"; an unreachable bootstrap
  port: "Decode handshake failed ... Aborted by AbortReq.".
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response

from deepseek_frontend.engines.sim.disagg import (
    ABORTED,
    BootstrapServer,
    DisaggSettings,
    KvArrival,
    KvTransferError,
    decode_failure_message,
    fetch_kv,
    missing_room_message,
    prefill_failure_message,
)
from deepseek_frontend.errors import EngineError, RequestError
from deepseek_frontend.generation import EngineChunk, GenerateRequest

__all__ = ["PdLeg", "SimDisagg"]

#: recent transfers a decode worker lists in /sim/stats
RECENT_TRANSFERS = 64


@dataclass(frozen=True, slots=True)
class PdLeg:
    """What the sim server lends a PD role for one request.

    ``plan(request)`` is the output the engine's model writes for it (engines/sim/engine.py
    ``plan_request``); ``open(request, transferred)`` starts the engine's stream (``transferred``:
    the KV that arrived from a prefill worker, or None); ``respond(first, stream)`` is
    the aggregated worker's answer from there (JSON or SSE, faults applied); ``events(first,
    stream)`` its SSE events alone.
    """

    plan: Callable[[GenerateRequest], list[int]]
    open: Callable[[GenerateRequest, KvArrival | None], AsyncIterator[EngineChunk]]
    respond: Callable[[EngineChunk, AsyncIterator[EngineChunk]], Any]
    events: Callable[[EngineChunk, AsyncIterator[EngineChunk]], AsyncGenerator[bytes, None]]
    sse: Callable[[AsyncGenerator[bytes, None]], Response]


#: where a decode leg's KV is: (bootstrap_room, bootstrap_host, bootstrap_port, disagg_prefill_dp_rank)
_Source = tuple[int, str | None, int | None, int | None]


@dataclass(frozen=True, slots=True)
class _Abort:
    message: str
    status_code: int


def _abort_event(rid: str, abort: _Abort, prompt_tokens: int) -> list[bytes]:
    finish = {"type": "abort", "message": abort.message, "status_code": abort.status_code, "err_type": None}
    meta = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 0,
        "cached_tokens": 0,
    }
    return [b"data: " + orjson.dumps({"output_ids": [], "meta_info": meta}) + b"\n\n", b"data: [DONE]\n\n"]


def _abort_response(abort: _Abort) -> Response:
    if abort.status_code == 400:
        return JSONResponse({"error": {"message": abort.message}}, status_code=400)
    error = {"object": "error", "message": abort.message, "type": str(abort.status_code), "param": None}
    return JSONResponse({**error, "code": abort.status_code}, status_code=abort.status_code)


def _error_event(message: str) -> bytes:
    error = {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


def _room_fields(body: dict[str, Any]) -> tuple[int | None, str | None, int | None]:
    """``(bootstrap_room, bootstrap_host, bootstrap_port)``; raises ValueError for wrong types."""
    room, host, port = body.get("bootstrap_room"), body.get("bootstrap_host"), body.get("bootstrap_port")
    if room is not None and (isinstance(room, bool) or not isinstance(room, int) or room < 0):
        raise ValueError("bootstrap_room must be a non-negative integer")
    if host is not None and not isinstance(host, str):
        raise ValueError("bootstrap_host must be a string")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)):
        raise ValueError("bootstrap_port must be an integer")
    return room, host, port


class SimDisagg:
    """A simulated worker's PD role (see the module docstring); ``None`` in place of it is aggregated."""

    def __init__(self, settings: DisaggSettings) -> None:
        if settings.mode == "null":
            raise ValueError("an aggregated worker has no PD role")
        self.settings = settings
        self.bootstrap = BootstrapServer(settings) if settings.mode == "prefill" else None
        self._fetches: dict[str, asyncio.Task[Any]] = {}
        self._aborted: set[str] = set()
        #: decode-side counters for /sim/stats
        self.transfers: deque[dict[str, Any]] = deque(maxlen=RECENT_TRANSFERS)
        self.bytes_received = 0
        self.failures: dict[str, int] = {"handshake": 0, "transfer": 0, "missing_room": 0}

    @property
    def mode(self) -> str:
        return self.settings.mode

    async def start(self, host: str) -> None:
        """Serve the bootstrap port of a prefill role (no-op for decode)."""
        if self.bootstrap is not None:
            await self.bootstrap.start(host)

    async def aclose(self) -> None:
        if self.bootstrap is not None:
            await self.bootstrap.aclose()

    def server_info(self) -> dict[str, Any]:
        """SGLang's ``/server_info`` keys for the role."""
        port = self.bootstrap.port if self.bootstrap is not None else self.settings.bootstrap_port
        return {"disaggregation_mode": self.settings.mode, "disaggregation_bootstrap_port": port}

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pd_mode": self.settings.mode, "pd_failures": dict(self.failures)}
        if self.bootstrap is not None:
            out.update(self.bootstrap.stats())
        else:
            out["pd_fetching"] = len(self._fetches)
            out["pd_bytes_received"] = self.bytes_received
            out["pd_transfers"] = list(self.transfers)
        return out

    async def abort(self, rid: str) -> None:
        """``/abort_request``: a decode leg still fetching gives its room up; a prefill leg's room fails."""
        task = self._fetches.get(rid)
        if task is not None:
            self._aborted.add(rid)
            task.cancel()
        if self.bootstrap is not None:
            self.bootstrap.abort(rid)

    async def generate(self, body: dict[str, Any], request: GenerateRequest, leg: PdLeg) -> Response:
        rid, stream = request.request_id, bool(body.get("stream", False))
        try:
            room, host, port = _room_fields(body)
            rank = body.get("disagg_prefill_dp_rank")
            if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)):
                raise ValueError("disagg_prefill_dp_rank must be an integer")
        except ValueError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        if room is None:
            self.failures["missing_room"] += 1
            abort = _Abort(missing_room_message(rid), 400)
            if stream:
                return leg.sse(_iterate(_abort_event(rid, abort, len(request.input_ids))))
            return _abort_response(abort)
        if self.bootstrap is not None:
            return await self._prefill(request, room, stream, leg)
        return await self._decode(request, (room, host, port, rank), stream, leg)

    # ------------------------------------------------------------------ prefill

    async def _prefill(self, request: GenerateRequest, room: int, stream: bool, leg: PdLeg) -> Response:
        if stream:
            return leg.sse(self._prefill_events(request, room, leg))
        outcome = await self._run_prefill(request, room, leg)
        if isinstance(outcome, _Abort):
            return _abort_response(outcome)
        if isinstance(outcome, str):
            return JSONResponse({"error": {"message": outcome}}, status_code=400)
        return Response(orjson.dumps(outcome), media_type="application/json")

    async def _prefill_events(
        self, request: GenerateRequest, room: int, leg: PdLeg
    ) -> AsyncGenerator[bytes, None]:
        outcome = await self._run_prefill(request, room, leg)
        if isinstance(outcome, _Abort):
            for event in _abort_event(request.request_id, outcome, len(request.input_ids)):
                yield event
            return
        if isinstance(outcome, str):
            yield _error_event(outcome)
        else:
            yield b"data: " + orjson.dumps(outcome) + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def _run_prefill(
        self, request: GenerateRequest, room: int, leg: PdLeg
    ) -> dict[str, Any] | _Abort | str:
        """The prefill leg: an answer object, an abort, or a refusal message (in-stream error / 400)."""
        assert self.bootstrap is not None
        rid = request.request_id
        try:
            self.bootstrap.open(room, rid)
        except KvTransferError as exc:
            self.failures["handshake"] += 1
            return _Abort(prefill_failure_message(rid, exc), 500)
        # SGLang's prefill scheduler sets max_new_tokens to 1: the decode worker writes the rest
        one = dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, max_new_tokens=1))
        try:
            plan = leg.plan(one)
        except (RequestError, EngineError) as exc:
            self.bootstrap.close(room)
            return str(exc)
        chunks = leg.open(one, None)
        try:
            first = await anext(chunks)
            if first.finish_reason == "abort":  # aborted while prefilling
                meta = {"type": "abort", "message": first.message}
                return _answer(rid, [], meta, first.prompt_tokens, 0, first.cached_tokens)
            token = first.token_ids[0] if first.token_ids else 0
            self.bootstrap.publish(room, request.input_ids, first.cached_tokens, token, plan)
            failure = await self.bootstrap.handed_over(room)
            if failure is not None:
                self.failures[failure.stage] += 1
                return _Abort(prefill_failure_message(rid, failure), 500)
            finish = {"type": "length", "length": 0}
            return _answer(rid, [token], finish, first.prompt_tokens, 1, first.cached_tokens)
        except (RequestError, EngineError) as exc:
            return str(exc)
        finally:
            self.bootstrap.close(room)
            await chunks.aclose()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ decode

    async def _decode(self, request: GenerateRequest, source: _Source, stream: bool, leg: PdLeg) -> Response:
        if stream:
            return leg.sse(self._decode_events(request, source, leg))
        outcome = await self._fetch(request, source)
        if isinstance(outcome, _Abort):
            return _abort_response(outcome)
        chunks = leg.open(request, outcome)
        try:
            first = await anext(chunks)
        except RequestError as exc:
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        return await leg.respond(first, chunks)

    async def _decode_events(
        self, request: GenerateRequest, source: _Source, leg: PdLeg
    ) -> AsyncGenerator[bytes, None]:
        outcome = await self._fetch(request, source)
        if isinstance(outcome, _Abort):
            for event in _abort_event(request.request_id, outcome, len(request.input_ids)):
                yield event
            return
        chunks = leg.open(request, outcome)
        try:
            first = await anext(chunks)
        except RequestError as exc:
            await chunks.aclose()  # type: ignore[attr-defined]
            yield _error_event(str(exc))
            yield b"data: [DONE]\n\n"
            return
        events = leg.events(first, chunks)
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()

    async def _fetch(self, request: GenerateRequest, source: _Source) -> KvArrival | _Abort:
        """The room's KV received, or the abort SGLang's decode sends."""
        rid = request.request_id
        room, host, port, rank = source
        started = time.monotonic()
        fetch = fetch_kv(host, port, room, rid, request.input_ids, self.settings, rank)
        task = asyncio.ensure_future(fetch)
        self._fetches[rid] = task
        try:
            arrival = await task
        except KvTransferError as exc:
            self.failures[exc.stage] += 1
            return _Abort(decode_failure_message(rid, exc), 500)
        except asyncio.CancelledError:
            if rid not in self._aborted:
                raise  # the client went away: the fetch was cancelled with it
            self.failures["transfer"] += 1
            return _Abort(decode_failure_message(rid, KvTransferError(room, ABORTED)), 500)
        finally:
            self._fetches.pop(rid, None)
            self._aborted.discard(rid)
            if not task.done():
                task.cancel()
        self.bytes_received += arrival.nbytes
        self.transfers.append(
            {
                "room": room,
                "tokens": arrival.tokens,
                "bytes": arrival.nbytes,
                "transfer_ms": round(arrival.seconds * 1000, 3),
                "wait_ms": round((time.monotonic() - started) * 1000, 3),
            }
        )
        return arrival


def _answer(
    rid: str, ids: list[int], finish: dict[str, Any], prompt_tokens: int, completion: int, cached: int
) -> dict[str, Any]:
    meta = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "cached_tokens": cached,
    }
    return {"output_ids": ids, "meta_info": meta}


async def _iterate(events: list[bytes]) -> AsyncGenerator[bytes, None]:
    for event in events:
        yield event
