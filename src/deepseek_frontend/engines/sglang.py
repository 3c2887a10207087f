"""SGLang client: ``POST /generate`` in token mode over Server-Sent Events.

The frontend sends ``input_ids`` and reads ``output_ids``. SGLang 0.5.23 does both whether it
runs with ``--skip-tokenizer-init`` (no tokenizer, no detokenizer, no grammar backend) or with
its tokenizer loaded (then each chunk also carries ``text``, which is ignored, and the output ids
are the same: the detokenizer trims a matched stop only from the text). The request body is
valid in both modes: only ``input_ids``, no string stops. With ``--incremental-streaming-output``
each chunk carries only the new ids; without it each chunk repeats the whole output so far.
:class:`SGLangClient` copes with both (``cumulative=None`` detects the form, see
:class:`_ChunkDiffer`).

Capabilities (:meth:`SGLangClient.discover`, :func:`capabilities_from_server_info`) come from
``GET /server_info`` (``/get_server_info`` on older SGLangs): the grammar backend, the context
length, the output slots EAGLE reserves, whether seeds take effect, the KV page size, whether the
worker schedules by priority.

Priority (engine-facts E1): the request's ``priority`` goes out only to a worker whose
``/server_info`` says ``enable_priority_scheduling`` -- always then, 0 included, since SGLang gives
a request without one the least-preferred value -- as the frontend's value (higher first, SGLang's
default) or its negation under ``schedule_low_priority_values_first``. Never otherwise: a worker
without priority scheduling ignores the field, or with ``--abort-on-priority-when-disabled`` aborts
the request (503). Until the worker's ``/server_info`` was read, no priority is sent.

Failure mapping (the pool decides by type, never by message):

* connect error, timeout, HTTP 5xx / 408 / 429, or a worker-side error event / broken stream before
  any token -> :class:`EngineUnavailableError` (retry on another worker, counts against it); no
  response headers within the stream session's ``response_timeout_s`` ->
  :class:`~deepseek_frontend.errors.WorkerSilentError` (a subclass; SGLang's streaming ``/generate``
  sends its headers before the request reaches the tokenizer manager, so they never wait for a
  prefill), after which the request is aborted in the background;
* HTTP 4xx otherwise, an error event with a 4xx ``code`` or ``"retryable": false``, or an abort
  finish ``{"type": "abort", "status_code": 4xx}`` (how SGLang refuses a grammar it cannot compile,
  or any grammar without a backend), before or after the first token ->
  :class:`EngineRejectedRequestError` with the engine's status and message (the client's error);
* an abort finish with a 5xx ``status_code`` -> the worker's failure, like an error event;
* a worker-side error event or a broken stream after tokens were yielded -> :class:`EngineStreamError`.

Health (:meth:`SGLangClient.check_health`) is ``GET /server_info``: it does not generate, yet
it round-trips through the scheduler (``get_internal_state``), so a hung scheduler fails it while
a busy one answers. SGLang's ``/health`` and ``/health_generate`` both run a one-token generation
(``/health`` too unless ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0``) and wait up to
``SGLANG_HEALTH_CHECK_TIMEOUT`` (20 s) for the scheduler, polling once a second.

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
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson

from deepseek_frontend.engines._http import (
    CONTROL_TIMEOUT_S,
    HTTP_ERRORS,
    HTTPEngineClient,
    StreamProgress,
    StreamSession,
    drain_events,
    is_client_status,
    new_http_client,
    open_event_stream,
    read_chunks,
    sampling_fields,
)
from deepseek_frontend.errors import EngineRejectedRequestError, EngineUnavailableError, WorkerSilentError
from deepseek_frontend.generation import (
    DEFAULT_PRIORITY,
    ConstraintKind,
    EngineChunk,
    EngineFinishReason,
    GenerateRequest,
    TokenLogprob,
    WorkerCapabilities,
    engine_rid,
    id_list,
)

__all__ = ["GRAMMAR_BACKEND_KINDS", "SGLangClient", "capabilities_from_server_info", "new_http_client"]

#: seconds a health probe may take: above SGLang's own 20 s SGLANG_HEALTH_CHECK_TIMEOUT, so a busy
#: worker whose scheduler answers between long batches is never taken for a dead one
PROBE_TIMEOUT_S = 30.0

_ALL_KINDS: frozenset[ConstraintKind] = frozenset({"ebnf", "json_schema", "regex", "structural_tag"})
#: what each SGLang 0.5.23 grammar backend compiles (``srt/constrained/*_backend.py``: outlines has
#: no ``dispatch_ebnf`` / ``dispatch_structural_tag``); ``none`` compiles nothing
GRAMMAR_BACKEND_KINDS: dict[str, frozenset[ConstraintKind]] = {
    "xgrammar": _ALL_KINDS,
    "llguidance": _ALL_KINDS,
    "outlines": frozenset({"json_schema", "regex"}),
    "none": frozenset(),
}
#: speculative algorithms that keep draft tokens in the output slots (SGLang's ``is_eagle()``;
#: NEXTN is an alias of EAGLE)
_EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN", "FROZEN_KV_MTP"})
#: server_info fields kept in ``WorkerCapabilities.extra`` (routing reads ``kv_events_config``)
_EXTRA_FIELDS = (
    "kv_events_config",
    "kv_events",
    # routing: one radix cache, scheduler and KV event publisher per data-parallel rank
    "dp_size",
    "attn_dp_size",
    "enable_dp_attention",
    # routing: DeepSeek-V4's sliding-window cache gates prefix hits (routing/swa.py)
    "attention_backend",
    "swa_full_tokens_ratio",
    "max_total_num_tokens",
    "enable_decoder_swa_bounded_replay",
    "disaggregation_decode_enable_radix_cache",  # a PD decode worker caches nothing without it
    "disaggregation_mode",  # "null", "prefill" or "decode": PD serving checks each worker's role
    "disaggregation_bootstrap_port",  # where a prefill worker's bootstrap server listens
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "skip_tokenizer_init",
    "incremental_streaming_output",
    "enable_deterministic_inference",
    "version",
    # priority scheduling (engine-facts E1): operators see in /health how each worker orders requests
    "enable_priority_scheduling",
    "schedule_low_priority_values_first",
    "priority_scheduling_preemption_threshold",
    "disable_priority_preemption",
    "schedule_policy",
)


def _int_field(info: dict[str, Any], key: str) -> int | None:
    value = info.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reserved_output_tokens(info: dict[str, Any]) -> int:
    """Output slots SGLang reserves per request on top of its input (``compute_num_reserved_tokens``).

    SGLang 0.5.23 checks ``input + reserved < context_length`` and ``input + reserved +
    max_new_tokens <= context_length``; only EAGLE-family algorithms reserve, as
    ``max(speculative_eagle_topk * speculative_num_steps, speculative_num_draft_tokens)``
    (the recipe's EAGLE with 3 steps, top-k 1 and 4 draft tokens reserves 4).
    """
    algorithm = str(info.get("speculative_algorithm") or "").upper()
    if algorithm not in _EAGLE_ALGORITHMS:
        return 0
    topk = _int_field(info, "speculative_eagle_topk") or 0
    steps = _int_field(info, "speculative_num_steps") or 0
    drafts = max(
        _int_field(info, "speculative_num_draft_tokens") or 0,
        _int_field(info, "max_speculative_num_draft_tokens") or 0,
    )
    return max(topk * steps, drafts)


def capabilities_from_server_info(info: dict[str, Any]) -> WorkerCapabilities:
    """What an SGLang worker can serve, from its ``/server_info`` JSON (a pure function).

    * ``constraint_kinds``: none with ``skip_tokenizer_init`` (SGLang then builds no grammar
      backend at all, ``grammar_manager.py``) or ``grammar_backend`` ``none``; else what the
      backend compiles (:data:`GRAMMAR_BACKEND_KINDS`; a custom registered backend is assumed to
      compile every kind, and the worker's answer decides). A missing ``grammar_backend`` with a
      tokenizer loaded means SGLang's default, ``xgrammar``.
    * ``context_length``: the ``context_length`` server arg when set (None: the model's, which
      server_info does not report, so the frontend's own setting applies).
    * ``reserved_output_tokens``: :func:`reserved_output_tokens`.
    * ``honours_seed``: ``enable_deterministic_inference`` (without it SGLang's sampler ignores
      ``sampling_seed``).
    * ``page_size``; ``extra`` keeps the speculative settings, ``kv_events_config`` and the
      priority-scheduling settings.
    * ``priority_order``: "high_first" with ``enable_priority_scheduling`` ("low_first" with
      ``schedule_low_priority_values_first`` too), else None (no ``priority`` field is sent).
    """
    skip = bool(info.get("skip_tokenizer_init"))
    backend_field = info.get("grammar_backend", "xgrammar")
    backend = str(backend_field) if backend_field is not None else "xgrammar"
    if skip or backend == "none":
        kinds: frozenset[ConstraintKind] = frozenset()
        grammar_backend = None
    else:
        kinds = GRAMMAR_BACKEND_KINDS.get(backend, _ALL_KINDS)
        grammar_backend = backend
    context = _int_field(info, "context_length")
    return WorkerCapabilities(
        constraint_kinds=kinds,
        grammar_backend=grammar_backend,
        context_length=context if context else None,
        reserved_output_tokens=reserved_output_tokens(info),
        honours_seed=bool(info.get("enable_deterministic_inference")),
        page_size=_int_field(info, "page_size") or None,
        priority_order=(
            ("low_first" if info.get("schedule_low_priority_values_first") is True else "high_first")
            if info.get("enable_priority_scheduling") is True
            else None
        ),
        extra={key: info[key] for key in _EXTRA_FIELDS if info.get(key) is not None},
    )


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


def _abort_status(meta: dict[str, Any]) -> tuple[int, str] | None:
    """``(status_code, message)`` of an abort finish that carries an HTTP status, else None.

    SGLang finishes a request it refuses in the scheduler (no grammar backend, a grammar that does
    not compile, ...) with ``{"type": "abort", "message", "status_code": 400, "err_type"}``; an
    abort without a status (``/abort_request``, a client that left) is an ordinary abort finish.
    """
    reason = meta.get("finish_reason")
    if not isinstance(reason, dict) or reason.get("type") != "abort":
        return None
    status = reason.get("status_code")
    if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status < 600:
        return None
    message = reason.get("message")
    return status, message if isinstance(message, str) and message else "aborted by the engine"


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


class SGLangClient(HTTPEngineClient):
    """One SGLang worker at ``base_url`` (see module docstring for the protocol and failures).

    ``http`` may be shared between clients (the pool does); a client only closes an
    ``httpx.AsyncClient`` it created itself. ``cumulative``: None = detect per request.
    Health is ``GET /server_info`` answering 200 within ``probe_timeout_s`` (it does not generate;
    see the module docstring). :attr:`capabilities` holds what :meth:`discover` last learned
    (None before it ran or when the worker did not say); :meth:`supports_constraint` follows it.
    """

    health_path = "/server_info"

    def __init__(
        self,
        base_url: str,
        *,
        http: httpx.AsyncClient | None = None,
        streams: StreamSession | None = None,
        cumulative: bool | None = None,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        super().__init__(base_url, http=http, streams=streams, control_timeout_s=control_timeout_s)
        self.cumulative = cumulative
        self.probe_timeout_s = probe_timeout_s
        self.capabilities: WorkerCapabilities | None = None
        #: the server-info path this worker answers ("/get_server_info" on SGLangs before /server_info)
        self._info_path = "/server_info"

    def __repr__(self) -> str:
        return f"SGLangClient({self.base_url!r})"

    @staticmethod
    def request_body(request: GenerateRequest, priority_order: str | None = None) -> dict[str, Any]:
        """The ``/generate`` JSON body for ``request`` (engine-protocols.md); ``priority_order``: the
        worker's (:attr:`WorkerCapabilities.priority_order`), None for a worker that does not
        schedule by priority (then no ``priority`` is sent, see the module docstring)."""
        s = request.sampling
        params: dict[str, Any] = {"max_new_tokens": s.max_new_tokens, **sampling_fields(s)}
        if s.seed is not None:
            params["sampling_seed"] = s.seed
        # Sent only when set, so ordinary bodies stay as they were (and as older SGLangs take them).
        if s.ignore_eos:
            params["ignore_eos"] = True
        if s.min_new_tokens:
            params["min_new_tokens"] = s.min_new_tokens
        if s.constraint is not None:
            params[s.constraint.kind] = s.constraint.value
        body: dict[str, Any] = {
            "rid": engine_rid(request.request_id),
            "input_ids": id_list(request.input_ids),
            "sampling_params": params,
            "stream": True,
            "return_logprob": s.logprobs,
            "top_logprobs_num": s.top_logprobs if s.logprobs else 0,
        }
        if request.images:
            # one data: URL per image placeholder id of input_ids, in order; SGLang expands them
            body["image_data"] = list(request.images)
        if priority_order is not None:
            priority = request.priority if request.priority is not None else DEFAULT_PRIORITY
            body["priority"] = -priority if priority_order == "low_first" else priority
        if request.extra_fields:
            # prefill/decode legs: the bootstrap trio and DP rank hints (disagg/pool.py)
            body.update(request.extra_fields)
        return body

    @property
    def priority_order(self) -> str | None:
        """How this worker orders requests by priority, as its last ``/server_info`` said (None:
        not by priority, or not read yet)."""
        caps = self.capabilities
        return caps.priority_order if caps is not None else None

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        rid = engine_rid(request.request_id)
        body = orjson.dumps(self.request_body(request, self.priority_order))
        differ = _ChunkDiffer(self.cumulative)
        progress = StreamProgress(self.name)
        #: True once the worker has the request running; False again when it finished
        running = False
        finished = False
        consumer_left = False
        silent = False
        try:
            async with open_event_stream(
                self._streams, self.name, self.base_url + "/generate", body, request.trace_headers
            ) as response_body:
                running = True
                try:
                    ended = False

                    def chunks_of(batch: list[bytes]) -> Iterator[EngineChunk]:
                        """The chunks of one read's events, up to the finish or ``[DONE]``."""
                        nonlocal finished, ended
                        for data in batch:
                            if data == b"[DONE]":
                                ended = True
                                return
                            if not data:
                                continue
                            obj = progress.decode(data)
                            if "error" in obj:
                                progress.error_event(obj["error"])
                            meta = obj.get("meta_info") or {}
                            refused = _abort_status(meta)
                            if refused is not None:
                                status, message = refused
                                finished = True  # the worker already dropped the request: no abort to send
                                if is_client_status(status):
                                    raise EngineRejectedRequestError(
                                        f"the engine rejected the request: {message}", status_code=status
                                    )
                                raise progress.broken(f"engine aborted the request ({status}): {message}")
                            ids = obj.get("output_ids")
                            if ids is None:
                                ids = obj.get("token_ids") or []
                            completion = meta.get("completion_tokens")
                            new = differ.new_ids(ids, completion)
                            reason, matched, message = _finish(meta)
                            if not new and reason is None:
                                continue
                            yield EngineChunk(
                                new,
                                reason,
                                matched,
                                meta.get("prompt_tokens"),
                                completion,
                                meta.get("cached_tokens"),
                                _logprobs(meta, len(new)) if meta.get("output_token_logprobs") else None,
                                message,
                            )
                            if reason is not None:
                                finished = True
                                return

                    # the events of one read are one chunk: one detokenize, parse and client write
                    async with read_chunks(response_body, chunks_of, progress, lambda: ended) as (
                        batches,
                        reads,
                    ):
                        async for chunk in reads:
                            yield chunk
                            if finished:
                                await drain_events(batches)
                                return
                    raise progress.broken("stream ended without a finish reason")
                except HTTP_ERRORS as exc:
                    raise progress.broken(f"stream broke: {exc!r}") from exc
        except (GeneratorExit, asyncio.CancelledError):
            consumer_left = True
            raise
        except WorkerSilentError:
            silent = True
            raise
        finally:
            if not running and (silent or consumer_left):
                # sent but unanswered: the worker may hold the request, or take it up later
                self._abort_unanswered(rid)
            if running and not finished:
                await self._abort_unfinished(rid, consumer_left=consumer_left)

    async def _send_abort(self, engine_id: str) -> None:
        """``/abort_request`` for the rid the worker runs the request under (:func:`engine_rid`)."""
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(
                self.base_url + "/abort_request",
                content=orjson.dumps({"rid": engine_id}),
                headers={"content-type": "application/json"},
                timeout=self.control_timeout_s,
            )

    async def abort(self, request_id: str) -> None:
        """Best effort: errors are swallowed (the worker also aborts on disconnect). SGLang aborts
        every live rid that starts with this one's; :func:`engine_rid` makes that this one alone."""
        await self._send_abort(engine_rid(request_id))

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        """Per the discovered grammar backend; True while nothing was discovered (the worker decides)."""
        caps = self.capabilities
        return caps is None or kind in caps.constraint_kinds

    async def _server_info(self, timeout: float) -> httpx.Response:
        """``GET /server_info``, falling back once to ``/get_server_info`` (older SGLangs) on a 404."""
        response = await self._http.get(self.base_url + self._info_path, timeout=timeout)
        if response.status_code == 404 and self._info_path == "/server_info":
            fallback = await self._http.get(self.base_url + "/get_server_info", timeout=timeout)
            if fallback.status_code != 404:
                self._info_path = "/get_server_info"
                return fallback
        return response

    async def check_health(self) -> bool:
        """``GET /server_info`` answers 200 within ``probe_timeout_s`` (no generation)."""
        try:
            response = await self._server_info(self.probe_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def discover(self) -> WorkerCapabilities | None:
        """Read ``/server_info`` into :class:`WorkerCapabilities` (:func:`capabilities_from_server_info`).

        None when the worker cannot be reached or answers something other than a JSON object
        (the pool keeps what it knew and asks again when the worker is re-admitted).
        """
        try:
            response = await self._server_info(self.probe_timeout_s)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            info = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(info, dict):
            return None
        self.capabilities = capabilities_from_server_info(info)
        return self.capabilities

    async def get_model_info(self) -> dict[str, Any]:
        """``GET /get_model_info`` (model path, ...); raises EngineUnavailableError."""
        try:
            response = await self._http.get(self.base_url + "/get_model_info", timeout=self.control_timeout_s)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"{self.name}: get_model_info failed: {exc!r}") from exc
        data = orjson.loads(response.content)
        return data if isinstance(data, dict) else {}
