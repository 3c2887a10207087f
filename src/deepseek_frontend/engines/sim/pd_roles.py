"""``/generate`` on a prefill or a decode simulated worker, as SGLang 0.5.23 answers it in PD mode.

Both roles need ``bootstrap_room``: without it the request is refused like SGLang's scheduler
refuses it (an abort with ``status_code`` 400, "Invalid request: Disaggregated request received
without bootstrap room id. req.rid='...'"). Every other failure is an abort with ``status_code``
500 and SGLang's message. A stream (``"stream": true``) answers HTTP 200 at once and carries the
outcome as SSE events: the abort is one chunk ``{"output_ids": [], "meta_info": {"id",
"finish_reason": {"type": "abort", "message", "status_code", "err_type": null}, ...}}`` then
``data: [DONE]``. Without streaming, a 400 is ``{"error": {"message"}}`` and a 500 is FastAPI's
``{"object": "error", "message", "type": "500", "param": null, "code": 500}``.

The order of events is SGLang's default, ``--disaggregation-decode-allocation-policy early``
(``disaggregation/prefill.py``, ``disaggregation/decode.py``, ``disaggregation/common/conn.py``):

* **decode**: the leg handshakes with ``bootstrap_host:bootstrap_port``, pre-allocates its KV in
  the worker's pool (:class:`~deepseek_frontend.engines.sim.disagg.DecodeMemory`, ``--max-total-tokens``;
  first come, first served) and tells the prefill worker so; the room's KV then arrives, and the
  engine decodes without a prefill of its own: the output is the aggregated worker's, first token
  included, and ``cached_tokens`` is the prefill's. No KV within the waiting timeout of the
  allocation: "Decode transfer failed ... Request R timed out after Xs in KVPoll.WaitingForInput";
  an unreachable bootstrap port: "Decode handshake failed ... Aborted by AbortReq.".
* **prefill**: the leg computes nothing until its decode worker has pre-allocated (a decode that
  cannot allocate holds its prefill); that wait is bounded by the bootstrap timeout from the leg's
  arrival ("Prefill bootstrap failed ... Request R timed out after Xs in KVPoll.Bootstrapping").
  Then the prompt is prefilled (the engine's prefill cost, with ``max_new_tokens`` 1 as SGLang sets
  it), its KV sent, and the answer comes at the scheduler's next poll after the transfer -- after
  the forward in progress, which under long chunked prefills is seconds later: one chunk
  ``output_ids: [first token]``, ``finish_reason {"type": "length", "length": 0}``,
  ``completion_tokens`` 1.

Aborts match by prefix (``managers/scheduler.py`` ``Scheduler.abort_request`` searches the PD
queues with ``req.rid.startswith``): :meth:`SimDisagg.abort_prefix` ends every leg whose rid starts
with the aborted one, and a leg whose client left aborts the others that way too
(``on_close_abort``, set by the sim server).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import JSONResponse, Response

from deepseek_frontend.engines.sim.disagg import (
    ABORTED,
    BootstrapServer,
    DecodeMemory,
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
    #: returns once the engine's forward in progress is done (``SimulatedEngine.after_forward``)
    next_poll: Callable[[], Awaitable[None]]


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
        #: a decode worker's KV pool (pre-allocated per leg, first come first served)
        self.memory = DecodeMemory(settings.max_total_tokens)
        self._fetches: dict[str, asyncio.Task[Any]] = {}
        self._aborted: set[str] = set()
        #: what a leg whose client left aborts, by prefix (the sim server sets it: every stream and
        #: leg on the worker; alone, this role's legs)
        self.on_close_abort: Callable[[str], object] = self.abort_prefix
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
            out["pd_memory_used_tokens"] = self.memory.used
            out["pd_memory_waiting"] = self.memory.waiting
        return out

    def holds(self, rid: str) -> bool:
        """Whether a leg runs here under ``rid`` (a decode still fetching, a prefill's room)."""
        return rid in self._fetches or (self.bootstrap is not None and self.bootstrap.holds(rid))

    def abort_prefix(self, prefix: str) -> int:
        """SGLang's scheduler abort of the PD queues: every decode leg still fetching whose rid starts
        with ``prefix`` gives its room up; every prefill leg's room that does fails. How many."""
        hit = [rid for rid in self._fetches if rid.startswith(prefix)]
        for rid in hit:
            self._aborted.add(rid)
            self._fetches[rid].cancel()
        if self.bootstrap is not None:
            return len(hit) + self.bootstrap.abort_prefix(prefix)
        return len(hit)

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
        # SGLang's prefill scheduler sets max_new_tokens to 1: the decode worker writes the rest
        one = dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, max_new_tokens=1))
        try:
            plan = leg.plan(one)  # refused before anything is held, as the tokenizer manager refuses it
        except (RequestError, EngineError) as exc:
            return str(exc)
        try:
            self.bootstrap.open(room, rid)
        except KvTransferError as exc:
            self.failures["handshake"] += 1
            return _Abort(prefill_failure_message(rid, exc), 500)
        try:
            # early allocation: nothing is computed before the decode worker has pre-allocated
            failure = await self.bootstrap.bootstrapped(room)
            if failure is not None:
                self.failures[failure.stage] += 1
                return _Abort(prefill_failure_message(rid, failure), 500)
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
                # answered at the scheduler's next poll of its transfers: after the forward in progress
                await leg.next_poll()
                finish = {"type": "length", "length": 0}
                return _answer(rid, [token], finish, first.prompt_tokens, 1, first.cached_tokens)
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]
        except (RequestError, EngineError) as exc:
            return str(exc)
        except (asyncio.CancelledError, GeneratorExit):
            self.bootstrap.close(room)
            self.on_close_abort(rid)  # the client left: SGLang's abort of it matches by prefix
            raise
        finally:
            self.bootstrap.close(room)

    # ------------------------------------------------------------------ decode

    async def _decode(self, request: GenerateRequest, source: _Source, stream: bool, leg: PdLeg) -> Response:
        if stream:
            return leg.sse(self._decode_events(request, source, leg))
        outcome, held = await self._fetch(request, source)
        if isinstance(outcome, _Abort):
            return _abort_response(outcome)
        try:
            chunks = leg.open(request, outcome)
            try:
                first = await anext(chunks)
            except RequestError as exc:
                return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
            return await leg.respond(first, chunks)
        finally:
            self.memory.release(held)

    async def _decode_events(
        self, request: GenerateRequest, source: _Source, leg: PdLeg
    ) -> AsyncGenerator[bytes, None]:
        outcome, held = await self._fetch(request, source)
        try:
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
        finally:
            self.memory.release(held)  # the leg's KV is freed when it ends

    async def _fetch(self, request: GenerateRequest, source: _Source) -> tuple[KvArrival | _Abort, int]:
        """The room's KV received, or the abort SGLang's decode sends; and the tokens of the
        worker's pool the leg holds (released by the caller when the leg ends)."""
        rid = request.request_id
        room, host, port, rank = source
        started = time.monotonic()
        need = self.memory.need(len(request.input_ids) + request.sampling.max_new_tokens)
        held = 0

        async def allocate() -> None:
            nonlocal held
            await self.memory.allocate(need)
            held = need

        fetch = fetch_kv(host, port, room, rid, request.input_ids, self.settings, rank, allocate)
        task = asyncio.ensure_future(fetch)
        self._fetches[rid] = task
        try:
            arrival = await task
        except KvTransferError as exc:
            self.failures[exc.stage] += 1
            self.memory.release(held)
            return _Abort(decode_failure_message(rid, exc), 500), 0
        except asyncio.CancelledError:
            self.memory.release(held)
            if rid not in self._aborted:
                self._fetches.pop(rid, None)
                self.on_close_abort(rid)  # the client left: SGLang's abort of it matches by prefix
                raise  # the fetch was cancelled with it
            self.failures["transfer"] += 1
            return _Abort(decode_failure_message(rid, KvTransferError(room, ABORTED)), 500), 0
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
        return arrival, held


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
