"""Fake prefill/decode workers for the orchestrator's tests (served over real HTTP by uvicorn).

:class:`FakeSGLangPd` speaks SGLang 0.5.23's PD protocol as the orchestrator sees it: ``/server_info``
with ``disaggregation_mode`` and ``disaggregation_bootstrap_port``, ``/generate`` (SSE) that refuses a
body without ``bootstrap_room`` (abort ``status_code`` 400, as SGLang's scheduler does), and
``/abort_request``. A prefill leg answers only once the decode leg of its room has arrived, and a
decode leg starts only once the prefill leg of its room has arrived (:class:`Rendezvous`), so an
orchestrator that does not send both legs at once never finishes. ``mode`` scripts a fault.

:class:`FakeVllmPd` is a vLLM worker with a KV connector on ``/v1/completions``: a prefill request
(``kv_transfer_params.do_remote_decode``) answers unstreamed with ``kv_transfer_params`` for the
decode; a decode request must carry exactly those params (else it fails, as a decode whose KV
cannot be found would) and streams its tokens.

Both count streams open now (``open``) and keep every body and abort they saw.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.engines.conftest import serve_app

#: the first token every fake prefill samples, and the tokens a decode streams after it
FIRST = 1000
TOKENS = [FIRST, 1001, 1002, 1003, 1004]
#: the fake vLLM model's EOS
EOS = 1
#: seconds a leg waits for its partner before failing like SGLang's bootstrap / transfer timeout
PARTNER_WAIT_S = 5.0


class Rendezvous:
    """Which rooms each role's fakes have seen (prefill and decode fakes share one)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, int], asyncio.Event] = {}

    def arrive(self, role: str, room: int) -> None:
        self.seen.setdefault((role, room), asyncio.Event()).set()

    async def partner(self, role: str, room: int) -> bool:
        other = "decode" if role == "prefill" else "prefill"
        event = self.seen.setdefault((other, room), asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), PARTNER_WAIT_S)
        except TimeoutError:
            return False
        return True


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _chunk(ids: list[int], count: int, finish: dict[str, Any] | None) -> bytes:
    meta = {"prompt_tokens": 3, "completion_tokens": count, "cached_tokens": 0, "finish_reason": finish}
    return _sse({"output_ids": ids, "meta_info": meta})


def _abort(status: int, message: str) -> bytes:
    finish = {"type": "abort", "message": message, "status_code": status, "err_type": None}
    return _chunk([], 0, finish)


class _Fake:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.aborts: list[str] = []
        self.open = 0
        self.url = ""
        self._stack = contextlib.AsyncExitStack()

    async def start(self, app: Starlette, host: str | None = None, port: int = 0) -> str:
        """Serve on a free localhost port, or on ``host:port`` (a DNS test puts workers on several
        loopback addresses behind one port)."""
        if host is None:
            self.url = await self._stack.enter_async_context(serve_app(app))
        else:
            self.url = await self._stack.enter_async_context(serve_app(app, host, port))
        return self.url

    async def close(self) -> None:
        await self._stack.aclose()

    async def _counted(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        self.open += 1
        try:
            async for part in body:
                yield part
        finally:
            self.open -= 1


class FakeSGLangPd(_Fake):
    """One SGLang worker in ``role`` (see module docstring). ``mode``:

    ``ok``; ``fail`` (an abort with status 500 before any token); ``http_500``; ``hang`` (headers, then
    nothing until the client leaves); ``reject`` (an abort with status 400); decode only:
    ``fail_after`` (one token, then the connection breaks), ``slow`` (``itl_s`` between tokens).
    A prefill given ``hold`` answers only once it is set (after its decode partner has arrived),
    with an abort (status 500) when ``late`` is ``fail``.

    Aborts are SGLang's (``managers/tokenizer_manager.py`` ``abort_request``, ``managers/scheduler.py``
    ``Scheduler.abort_request``): ``/abort_request`` is forwarded only for a rid the worker holds,
    and then ends every live request whose rid *starts with* it (an abort finish without a status);
    a stream whose client left is aborted the same way. The scheduler applies an abort at its next
    step, ``step_s`` later (0: at once), and a request whose client left stays held for
    ``linger_s`` (until the scheduler has confirmed the abort). ``aborted`` lists the rids ended so.
    """

    def __init__(
        self,
        role: str,
        rendezvous: Rendezvous,
        *,
        bootstrap_port: int | None = 8998,
        report: str | None = None,
    ) -> None:
        super().__init__()
        self.role = role
        self.rendezvous = rendezvous
        self.bootstrap_port = bootstrap_port
        self.report = report if report is not None else role
        self.mode = "ok"
        #: requests to fail (``fail`` mode) before ``mode`` applies again
        self.fail_times = 0
        #: decode requests to break after their first token (``fail_after``) before ``mode`` applies again
        self.break_times = 0
        self.itl_s = 0.05
        self.dp_size = 1
        self.hold: asyncio.Event | None = None
        self.late = "ok"
        #: live requests by rid: set when an abort reaches them
        self.live: dict[str, asyncio.Event] = {}
        self.step_s = 0.0
        self.linger_s = 0.0
        self.aborted: list[str] = []

    async def start(self, host: str | None = None, port: int = 0) -> str:  # type: ignore[override]
        app = Starlette(
            routes=[
                Route("/server_info", self._info, methods=["GET"]),
                Route("/generate", self._generate, methods=["POST"]),
                Route("/abort_request", self._abort, methods=["POST"]),
            ]
        )
        return await super().start(app, host, port)

    async def _info(self, request: Request) -> Response:
        info: dict[str, Any] = {"disaggregation_mode": self.report, "page_size": 64, "dp_size": self.dp_size}
        if self.bootstrap_port is not None:
            info["disaggregation_bootstrap_port"] = self.bootstrap_port
        return JSONResponse(info)

    async def _abort(self, request: Request) -> Response:
        rid = orjson.loads(await request.body())["rid"]
        self.aborts.append(rid)
        if rid in self.live:  # the tokenizer manager forwards an abort only for a rid it holds
            self._abort_prefix(rid)
        return JSONResponse({})

    def _abort_prefix(self, rid: str) -> None:
        """The scheduler's abort, at its next step: every live rid that starts with ``rid``."""

        def apply() -> None:
            for other, flag in self.live.items():
                if other.startswith(rid):
                    flag.set()

        if self.step_s:
            asyncio.get_running_loop().call_later(self.step_s, apply)
        else:
            apply()

    async def _generate(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.bodies.append(body)
        if self.mode == "http_500":
            return JSONResponse({"error": {"message": "worker down"}}, status_code=500)
        rid = str(body.get("rid"))
        if rid in self.live:
            return JSONResponse(
                {"error": {"message": f"Duplicate request ID detected: {rid}"}}, status_code=400
            )
        self.live[rid] = asyncio.Event()
        events = self._abortable(rid, self._events(body))
        return StreamingResponse(self._counted(events), media_type="text/event-stream")

    async def _abortable(self, rid: str, events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``events`` until an abort reaches ``rid``: then SGLang's abort finish (no status)."""
        flag = self.live[rid]
        ended = False
        step: asyncio.Future[bytes] | None = None
        try:
            while True:
                step = asyncio.ensure_future(anext(events))  # type: ignore[arg-type]
                aborted = asyncio.ensure_future(flag.wait())
                await asyncio.wait({step, aborted}, return_when=asyncio.FIRST_COMPLETED)
                aborted.cancel()
                if not step.done():
                    self.aborted.append(rid)
                    yield _chunk([], 0, {"type": "abort", "message": "Aborted", "status_code": None})
                    yield b"data: [DONE]\n\n"
                    ended = True
                    return
                try:
                    part = step.result()
                except StopAsyncIteration:
                    ended = True
                    return
                yield part
        finally:
            if step is not None and not step.done():
                step.cancel()
                with contextlib.suppress(BaseException):
                    await step
            with contextlib.suppress(BaseException):
                await events.aclose()  # type: ignore[attr-defined]
            if ended or not self.linger_s:
                self.live.pop(rid, None)
            else:
                asyncio.get_running_loop().call_later(self.linger_s, self.live.pop, rid, None)
            if not ended:
                self._abort_prefix(rid)  # the client left (or the stream broke): SGLang aborts it

    async def _events(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        room = body.get("bootstrap_room")
        if room is None:
            rid = body["rid"]
            yield _abort(
                400, f"Invalid request: Disaggregated request received without bootstrap room id. {rid=}"
            )
            yield b"data: [DONE]\n\n"
            return
        mode = self.mode
        if self.fail_times > 0:
            self.fail_times -= 1
            mode = "fail"
        if mode == "fail_after" or self.break_times > 0:
            self.break_times = max(0, self.break_times - 1)
            mode = "fail_after"
        if mode not in ("fail", "reject") and not (self.role == "prefill" and mode == "hang"):
            # a failing leg never reaches the bootstrap handshake: its partner waits in vain
            self.rendezvous.arrive(self.role, room)
        if mode == "reject":
            yield _abort(400, "the sampling parameters are invalid")
            return
        if mode == "hang":
            await asyncio.Event().wait()  # until the client leaves (the response task is cancelled)
        if mode == "fail":
            yield _abort(500, f"KVTransferError(bootstrap_room={room}): failed")
            yield b"data: [DONE]\n\n"
            return
        if not await self.rendezvous.partner(self.role, room):
            yield _abort(500, f"KVTransferError(bootstrap_room={room}): the partner never arrived")
            return
        if self.role == "prefill":
            if self.hold is not None:
                await self.hold.wait()
                if self.late == "fail":
                    yield _abort(500, f"KVTransferError(bootstrap_room={room}): failed after the transfer")
                    return
            yield _chunk([FIRST], 1, {"type": "length", "length": 1})
            yield b"data: [DONE]\n\n"
            return
        limit = int(body["sampling_params"]["max_new_tokens"])
        out = TOKENS[:limit]
        for i, tid in enumerate(out, 1):
            last = i == len(out)
            yield _chunk([tid], i, {"type": "length", "length": limit} if last else None)
            if mode == "fail_after":
                raise RuntimeError("the decode worker died")  # uvicorn drops the connection mid-body
            if mode == "slow" and not last:
                await asyncio.sleep(self.itl_s)
        yield b"data: [DONE]\n\n"


class FakeVllmPd(_Fake):
    """A vLLM worker with a KV connector (see module docstring); ``role`` is ``prefill`` or
    ``decode``. ``mode``: ``ok``, ``http_500`` (prefill), ``hang`` (no answer, no first token).

    ``connector`` ``nixl`` (NixlConnector's flow, above) or ``mooncake`` (MooncakeConnector,
    vLLM's ``mooncake_connector.py``): a prefill needs the router's ``transfer_id``, answers no
    ``kv_transfer_params`` and keeps the KV only when it finishes by length -- with EOS (``EOS``) as
    its one token it finishes by stop, unless ``ignore_eos``; a decode needs ``transfer_id``,
    ``remote_engine_id`` (one its prefill's bootstrap server lists) and ``remote_bootstrap_addr``.
    ``ranks``: the prefill's data-parallel ranks (its bootstrap server lists ``{engine_id}_dp{r}``
    each; the rank is pinned with ``X-data-parallel-rank``). ``report``: what a dev-mode
    ``/server_info`` says of the KV transfer config (None: no such route, as without
    ``VLLM_SERVER_DEV_MODE``). Both check ``min_tokens <= max_tokens`` as vLLM does (400).
    """

    def __init__(
        self,
        role: str,
        engine_id: str,
        *,
        connector: str = "nixl",
        ranks: int = 1,
        report: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.role = role
        self.engine_id = engine_id
        self.connector = connector
        self.ranks = ranks
        self.report = report
        self.mode = "ok"
        #: the one token a prefill samples (EOS: a Mooncake prefill that may stop there does)
        self.first = FIRST
        #: the kv_transfer_params a prefill answered (Nixl) or kept the KV for (Mooncake), by request id
        self.issued: dict[str, dict[str, Any]] = {}
        #: Mooncake: transfer ids whose KV a prefill holds, with the engine id that holds it
        self.held: dict[str, str] = {}
        #: the prefill fakes whose issued params a decode accepts
        self.prefills: list[FakeVllmPd] = []
        #: the headers of every request
        self.headers: list[dict[str, str]] = []
        self.bootstrap_url = ""

    async def start(self) -> str:  # type: ignore[override]
        routes = [
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
        ]
        if self.report is not None:
            routes.append(Route("/server_info", self._server_info, methods=["GET"]))
        url = await super().start(Starlette(routes=routes))
        if self.connector == "mooncake" and self.role == "prefill":
            query = Starlette(routes=[Route("/query", self._query, methods=["GET"])])
            self.bootstrap_url = await self._stack.enter_async_context(serve_app(query))
        return url

    async def _server_info(self, request: Request) -> Response:
        env = (
            {"VLLM_MOONCAKE_BOOTSTRAP_PORT": int(self.bootstrap_url.rsplit(":", 1)[1])}
            if self.bootstrap_url
            else {}
        )
        return JSONResponse({"vllm_config": {"kv_transfer_config": self.report}, "vllm_env": env})

    async def _query(self, request: Request) -> Response:
        addr = {"0": {"0": "127.0.0.1:17000"}}
        engines = (
            [self.engine_id] if self.ranks == 1 else [f"{self.engine_id}_dp{r}" for r in range(self.ranks)]
        )
        return JSONResponse({str(r): {"engine_id": e, "worker_addr": addr} for r, e in enumerate(engines)})

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"data": [{"id": "m", "max_model_len": 4096}]})

    async def _completions(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        params = body.get("kv_transfer_params") or {}
        if int(body.get("min_tokens", 0)) > int(body["max_tokens"]):
            message = (
                f"min_tokens must be less than or equal to max_tokens={body['max_tokens']}, "
                f"got {body['min_tokens']}."
            )
            return JSONResponse(
                {"error": {"message": message, "type": "BadRequestError", "code": 400}}, status_code=400
            )
        if self.connector == "mooncake":
            return await self._mooncake(request, body, params)
        if self.role == "prefill":
            if self.mode == "http_500":
                return JSONResponse({"error": {"message": "worker down"}}, status_code=500)
            if self.mode == "hang":
                self.open += 1
                try:
                    while (await request.receive())["type"] != "http.disconnect":  # until the client leaves
                        pass
                finally:
                    self.open -= 1
            if body.get("stream") or body.get("max_tokens") != 1 or not params.get("do_remote_decode"):
                return JSONResponse({"error": {"message": "not a prefill request"}}, status_code=400)
            issued = {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "remote_engine_id": self.engine_id,
                "remote_block_ids": [len(self.issued), 7, 9],
                "remote_host": "127.0.0.1",
                "remote_port": 5600,
                "remote_request_id": body["request_id"],
                "tp_size": 1,
            }
            self.issued[body["request_id"]] = issued
            answer = {"id": body["request_id"], "choices": [{"index": 0, "text": "", "token_ids": [FIRST]}]}
            return JSONResponse({**answer, "kv_transfer_params": issued})
        known = [p for f in self.prefills for p in f.issued.values()]
        return StreamingResponse(
            self._counted(self._decode(body, params in known)), media_type="text/event-stream"
        )

    async def _mooncake(self, request: Request, body: dict[str, Any], params: dict[str, Any]) -> Response:
        if self.role == "prefill":
            if body.get("stream") or body.get("max_tokens") != 1 or not params.get("do_remote_decode"):
                return JSONResponse({"error": {"message": "not a prefill request"}}, status_code=400)
            rank = int(request.headers.get("x-data-parallel-rank", "0"))
            engine = self.engine_id if self.ranks == 1 else f"{self.engine_id}_dp{rank}"
            stops = (
                {EOS, *body.get("stop_token_ids", ())}
                if not body.get("ignore_eos")
                else set(body["stop_token_ids"])
            )
            finish = "stop" if self.first in stops else "length"
            transfer = params.get("transfer_id")
            if transfer and finish == "length":  # request_finished keeps the KV only then
                self.held[transfer] = engine
            choice = {"index": 0, "text": "", "token_ids": [self.first], "finish_reason": finish}
            return JSONResponse({"id": body["request_id"], "choices": [choice], "kv_transfer_params": None})
        known = {t: e for f in self.prefills for t, e in f.held.items()}
        bootstraps = {f"http://127.0.0.1:{f.bootstrap_url.rsplit(':', 1)[1]}" for f in self.prefills}
        transferred = (
            params.get("do_remote_prefill") is True
            and known.get(params.get("transfer_id", "")) == params.get("remote_engine_id")
            and params.get("remote_bootstrap_addr") in bootstraps
        )
        return StreamingResponse(
            self._counted(self._decode(body, transferred)), media_type="text/event-stream"
        )

    async def _decode(self, body: dict[str, Any], transferred: bool) -> AsyncIterator[bytes]:
        if self.mode == "hang":
            await asyncio.Event().wait()
        if not transferred:
            yield _sse({"object": "error", "message": "KV blocks not found", "code": 500})
            return
        out = TOKENS[: int(body["max_tokens"])]
        for i, tid in enumerate(out, 1):
            finish = "length" if i == len(out) else None
            yield _sse({"id": "c", "choices": [{"index": 0, "token_ids": [tid], "finish_reason": finish}]})
        yield _sse({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(out)}})
        yield b"data: [DONE]\n\n"
