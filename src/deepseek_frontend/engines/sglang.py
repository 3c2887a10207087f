"""SGLang client: ``POST /generate`` in token mode over Server-Sent Events.

The worker runs with ``--skip-tokenizer-init`` (ids in, ids out). With
``--incremental-streaming-output`` each chunk carries only the new ids; without it each
chunk repeats the whole output so far. :class:`SGLangClient` copes with both
(``cumulative=None`` detects the form, see :class:`_ChunkDiffer`).

Failure mapping (the pool decides by type, never by message):

* connect error, timeout, HTTP 5xx / 429, or an error event / broken stream before any
  token -> :class:`EngineUnavailableError` (retry on another worker);
* HTTP 400 / 422 -> :class:`RequestError` carrying the worker's message;
* an error event or a broken stream after tokens were yielded -> :class:`EngineStreamError`.

Closing the generator early (client disconnect, ``aclose()``, cancellation) closes the
HTTP stream -- which SGLang treats as an abort -- and also sends ``/abort_request`` in
``finally``, shielded from cancellation, because a proxy between us and the worker may keep
the upstream connection open. After a failed stream the abort goes out in the background
(the worker may be dead; the error must not wait for it); :meth:`SGLangClient.aclose`
waits for such aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from deepseek_frontend.engines._http import (
    CONTROL_TIMEOUT_S,
    HTTPEngineClient,
    StreamProgress,
    iter_sse_data,
    new_http_client,
    open_event_stream,
    sampling_fields,
)
from deepseek_frontend.engines.base import EngineChunk, EngineFinishReason, GenerateRequest, TokenLogprob
from deepseek_frontend.errors import EngineUnavailableError

__all__ = ["SGLangClient", "new_http_client"]


class _ChunkDiffer:
    """Turns incremental or cumulative id lists into new ids.

    ``cumulative`` True/False fixes the form. ``None`` detects it: with ``E`` ids emitted
    and a chunk of ``n`` ids reporting ``completion_tokens == C``, the incremental form
    predicts ``C == E + n`` and the cumulative form ``C == n``; the two agree only while
    ``E == 0``, so the first later chunk decides, and the decision sticks. Without a
    usable ``completion_tokens`` a chunk that starts with the whole output so far is taken
    as cumulative.
    """

    __slots__ = ("count", "cumulative", "emitted")

    def __init__(self, cumulative: bool | None) -> None:
        self.cumulative = cumulative
        self.count = 0
        #: the output so far; kept only while it may be needed (cumulative or undecided)
        self.emitted: list[int] = []

    def new_ids(self, ids: list[int], completion_tokens: int | None) -> list[int]:
        seen = self.count
        if self.cumulative is None and seen:
            if completion_tokens == len(ids):
                self.cumulative = True
            elif completion_tokens == seen + len(ids):
                self.cumulative = False
            else:
                self.cumulative = len(ids) >= seen and ids[:seen] == self.emitted
            if not self.cumulative:
                self.emitted = []
        if self.cumulative:
            new = ids[seen:]
            self.emitted = ids
            self.count = len(ids)
            return new
        if self.cumulative is None:
            self.emitted = list(ids)
        self.count += len(ids)
        return ids


def _finish(meta: dict[str, Any]) -> tuple[EngineFinishReason | None, int | str | None, str | None]:
    reason = meta.get("finish_reason")
    if reason is None:
        return None, None, None
    if isinstance(reason, str):
        kind, matched, message = reason, None, None
    else:
        kind = reason.get("type")
        matched = reason.get("matched")
        message = reason.get("message")
    if kind == "length":
        return "length", None, None
    if kind == "abort":
        return "abort", None, message if isinstance(message, str) else "aborted by the engine"
    return "stop", matched if isinstance(matched, int | str) else None, None


def _logprobs(meta: dict[str, Any], count: int) -> list[TokenLogprob] | None:
    triples = meta.get("output_token_logprobs")
    if not triples or count == 0:
        return None
    tops = meta.get("output_top_logprobs") or []
    # cumulative or not, the last ``count`` entries belong to the new ids
    triples = triples[-count:]
    tops = tops[-count:] if tops else [None] * len(triples)
    out = []
    for triple, top in zip(triples, tops, strict=False):
        alts = tuple((int(t[1]), float(t[0])) for t in top or () if t and t[0] is not None)
        out.append(TokenLogprob(int(triple[1]), float(triple[0]) if triple[0] is not None else 0.0, alts))
    return out


async def _drain(events: AsyncIterator[bytes]) -> None:
    """Read what follows the finish chunk (``[DONE]``) so the connection can be reused.

    Closing a response with unread body makes httpx drop the keep-alive connection, and a
    frontend streaming hundreds of requests would then open one TCP connection per request.
    """
    with contextlib.suppress(httpx.HTTPError):
        async for data in events:
            if data == b"[DONE]":
                break


class SGLangClient(HTTPEngineClient):
    """One SGLang worker at ``base_url`` (see module docstring for the protocol and failures).

    ``http`` may be shared between clients (the pool does); a client only closes an
    ``httpx.AsyncClient`` it created itself. ``cumulative``: None = detect per request.
    Health is ``GET /health_generate`` (the worker generates one token): 200 = healthy.
    """

    health_path = "/health_generate"

    def __init__(
        self,
        base_url: str,
        *,
        http: httpx.AsyncClient | None = None,
        cumulative: bool | None = None,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
    ) -> None:
        super().__init__(base_url, http=http, control_timeout_s=control_timeout_s)
        self.cumulative = cumulative
        self._pending_aborts: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"SGLangClient({self.base_url!r})"

    @staticmethod
    def request_body(request: GenerateRequest) -> dict[str, Any]:
        """The ``/generate`` JSON body for ``request`` (engine-protocols.md)."""
        s = request.sampling
        params: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, **sampling_fields(s)}
        if s.seed is not None:
            params["sampling_seed"] = s.seed
        if s.constraint is not None:
            params[s.constraint.kind] = s.constraint.value
        return {
            "rid": request.request_id,
            "input_ids": request.input_ids,
            "sampling_params": params,
            "stream": True,
            "return_logprob": s.logprobs,
            "top_logprobs_num": s.top_logprobs if s.logprobs else 0,
        }

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        rid = request.request_id
        body = orjson.dumps(self.request_body(request))
        differ = _ChunkDiffer(self.cumulative)
        progress = StreamProgress(self.name)
        #: True once the worker has the request running; False again when it finished
        running = False
        finished = False
        consumer_left = False
        try:
            async with open_event_stream(
                self._http, self.name, self.base_url + "/generate", body
            ) as response:
                running = True
                try:
                    events = iter_sse_data(response)
                    async for data in events:
                        if data == b"[DONE]":
                            break
                        if not data:
                            continue
                        obj = progress.decode(data)
                        if "error" in obj:
                            progress.error_event(obj["error"])
                        meta = obj.get("meta_info") or {}
                        ids = obj.get("output_ids")
                        if ids is None:
                            ids = obj.get("token_ids") or []
                        completion = meta.get("completion_tokens")
                        new = differ.new_ids(ids, completion)
                        reason, matched, message = _finish(meta)
                        if not new and reason is None:
                            continue
                        chunk = EngineChunk(
                            new,
                            reason,
                            matched,
                            meta.get("prompt_tokens"),
                            completion,
                            meta.get("cached_tokens"),
                            _logprobs(meta, len(new)) if meta.get("output_token_logprobs") else None,
                            message,
                        )
                        progress.yielded = True
                        if reason is not None:
                            finished = True
                        yield chunk
                        if finished:
                            await _drain(events)
                            return
                    raise progress.broken("stream ended without a finish reason")
                except httpx.HTTPError as exc:
                    raise progress.broken(f"stream broke: {exc!r}") from exc
        except (GeneratorExit, asyncio.CancelledError):
            consumer_left = True
            raise
        finally:
            if running and not finished:
                if consumer_left:
                    # the client went away: make sure the worker stops before we return
                    await self._abort_shielded(rid)
                else:
                    # the stream failed: the worker may be gone, so do not hold the error back
                    self._abort_in_background(rid)

    def _abort_in_background(self, rid: str) -> asyncio.Task[None]:
        """Start ``/abort_request``; :meth:`aclose` waits for the ones still running."""
        task = asyncio.ensure_future(self.abort(rid))
        self._pending_aborts.add(task)
        task.add_done_callback(self._pending_aborts.discard)
        return task

    async def _abort_shielded(self, rid: str) -> None:
        """Send ``/abort_request`` even when the caller is being cancelled."""
        task = self._abort_in_background(rid)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # the abort goes on in the background; the caller's cancellation proceeds
            raise
        except Exception:
            pass

    async def abort(self, request_id: str) -> None:
        """Best effort: errors are swallowed (the worker also aborts on disconnect)."""
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(
                self.base_url + "/abort_request",
                content=orjson.dumps({"rid": request_id}),
                headers={"content-type": "application/json"},
                timeout=self.control_timeout_s,
            )

    async def get_model_info(self) -> dict[str, Any]:
        """``GET /get_model_info`` (model path, ...); raises EngineUnavailableError."""
        try:
            response = await self._http.get(self.base_url + "/get_model_info", timeout=self.control_timeout_s)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"{self.name}: get_model_info failed: {exc!r}") from exc
        data = orjson.loads(response.content)
        return data if isinstance(data, dict) else {}

    async def aclose(self) -> None:
        if self._pending_aborts:
            await asyncio.gather(*self._pending_aborts, return_exceptions=True)
        await super().aclose()
