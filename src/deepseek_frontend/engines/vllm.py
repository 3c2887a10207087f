"""vLLM client: the token-in ``POST /inference/v1/generate`` API, ``/v1/completions`` as the fallback.

Two wire protocols, one per vLLM generation (chosen once per worker, see :meth:`VLLMClient.discover`):

* **Token-in generate** (vLLM >= 0.32 started with ``--enable-scale-out`` or ``--tokens-only``):
  ``{"token_ids", "sampling_params": {...}, "stream": true, "stream_options": {"include_usage":
  true}, "request_id", "model"}``. Each streamed choice carries its new ``token_ids``; logprobs come
  as ``{"content": [{"token_id", "logprob", "rank", "top_logprobs": [{"token_id", "logprob",
  "rank"}]}]}``, sampled token first; usage arrives in a trailing chunk with no choices. vLLM runs
  the request as ``generate-tokens-<request_id>`` (the ``request_id`` field of its chunks), and
  ``POST /inference/v1/abort_requests {"request_ids": [...]}`` stops it.
* **Completions** (any vLLM): ``"prompt": [ids]``, ``"return_token_ids": true`` (each streamed
  choice then carries the chunk's new ``token_ids``), ``stream_options.include_usage``; logprobs as
  ``token_logprobs`` plus ``top_logprobs`` dicts keyed ``token_id:N``
  (``return_tokens_as_token_ids``). There is no abort endpoint: closing the stream aborts.

Both: ``"skip_special_tokens": false``, ``stop_token_ids``, ``seed``; the frontend applies stop
strings itself, so none are sent (a ``--tokens-only`` vLLM rejects them).

Top logprobs: vLLM's per-position list is the sampled token *plus* the top ``k`` (so ``k + 1``
entries when the sampled token is not among them), and the generate API cuts that list to its
first ``k`` entries, sampled token first -- which drops the ``k``-th alternative whenever the
sampled token is not in the top ``k``. So the generate API is asked for ``k + 1`` and every answer
is reduced to exactly the ``k`` best alternatives by logprob. ``k + 1`` must fit the worker's
``--max-logprobs`` (vLLM default 20, :data:`VLLM_MAX_LOGPROBS`); a request that would not fit goes
out on ``/v1/completions``, which returns the full ``k + 1`` itself.

Constraints (vLLM always has a structured-outputs backend: ``auto`` picks xgrammar and falls back
to guidance; ``--structured-outputs-config '{"backend": ...}'`` pins one): a ``json_schema`` goes
out as ``structured_outputs: {"json": schema}``, a ``regex`` as ``{"regex": ...}`` and the DSML
tool-call grammar (``ebnf``) as ``{"grammar": ...}``. The grammar is sent by default;
``grammar=False`` (``serve --no-vllm-grammar``) refuses it up front instead (tool_choice required /
named then gets a 400), for a deployment whose backend is known not to handle it.

Capabilities (:meth:`VLLMClient.discover`): ``GET /v1/models`` gives ``max_model_len``;
``GET /server_info`` (only with ``VLLM_SERVER_DEV_MODE=1``) the structured-outputs backend;
``GET /version`` the version; a probe ``POST /inference/v1/generate`` with an empty body tells
whether the token-in API is on (422 / 400: validation ran, so the route serves; 403: vLLM has it
but was started without ``--enable-scale-out``; 404 / 405: an older vLLM).

``cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``) is reported only by a worker
started with ``--enable-prompt-tokens-details``; without it the field stays None.

Priority (engine-facts E2): both endpoints take ``priority`` (an integer, default 0); under
``--scheduling-policy priority`` a *lower* value is served earlier (ties by arrival), so the
frontend's priority (higher first) goes out negated, and only when it is not 0 (0 is the
field's default). The policy is known only from ``/server_info?config_format=json``
(``vllm_config.scheduler_config.policy``, served with ``VLLM_SERVER_DEV_MODE=1``): a worker known
to run ``fcfs`` gets no ``priority``; one whose policy is not known gets it anyway, because vLLM
0.32 and 0.33 take a nonzero priority under ``fcfs`` and ignore it (no check exists, whatever the
field's description says).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import urlsplit

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
    open_event_stream,
    read_chunks,
    sampling_fields,
)
from deepseek_frontend.errors import (
    EngineRejectedRequestError,
    EngineUnavailableError,
    UnsupportedFeatureError,
    WorkerSilentError,
)
from deepseek_frontend.generation import (
    ConstraintKind,
    EngineChunk,
    EngineFinishReason,
    GenerateRequest,
    SamplingParams,
    TokenLogprob,
    WorkerCapabilities,
    engine_rid,
    id_list,
)

__all__ = [
    "COMPLETIONS_PATH",
    "GENERATE_ABORT_PATH",
    "GENERATE_PATH",
    "VLLM_MAX_LOGPROBS",
    "VLLMClient",
    "prefill_sampling",
]

log = logging.getLogger("deepseek_frontend.engines.vllm")

#: vLLM's token-in generate endpoint (0.32+, behind ``--enable-scale-out`` / ``--tokens-only``)
GENERATE_PATH = "/inference/v1/generate"
#: its abort endpoint: ``{"request_ids": [...]}``, ids as the generate stream reports them
GENERATE_ABORT_PATH = "/inference/v1/abort_requests"
#: the OpenAI completions endpoint every vLLM has
COMPLETIONS_PATH = "/v1/completions"
#: vLLM's default ``--max-logprobs``: more alternatives than this per position are refused
VLLM_MAX_LOGPROBS = 20
#: what vLLM's generate endpoint puts before the request id it is given
_GENERATE_ID_PREFIX = "generate-tokens-"
#: constraint kinds vLLM's structured outputs take (``structural_tag`` has another shape there)
_VLLM_KINDS: frozenset[ConstraintKind] = frozenset({"json_schema", "regex", "ebnf"})


class VLLMClient(HTTPEngineClient):
    """One vLLM worker at ``base_url`` serving ``model`` (see module docstring). Health: ``GET /health``.

    ``token_api``: None detects the token-in API (at :meth:`discover`, or lazily before the first
    request); True / False force it. ``grammar``: None sends the tool-call grammar (vLLM always has a
    structured-outputs backend), False refuses it up front. ``max_logprobs`` is the worker's
    ``--max-logprobs``. :attr:`capabilities` holds what :meth:`discover` last learned.
    """

    health_path = "/health"

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        http: httpx.AsyncClient | None = None,
        streams: StreamSession | None = None,
        grammar: bool | None = None,
        token_api: bool | None = None,
        max_logprobs: int = VLLM_MAX_LOGPROBS,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
    ) -> None:
        super().__init__(base_url, http=http, streams=streams, control_timeout_s=control_timeout_s)
        self.model = model
        self.grammar = grammar
        self.token_api = token_api
        #: True when the caller chose the protocol; else every discover() asks the worker again
        self._token_api_forced = token_api is not None
        self.max_logprobs = max_logprobs
        self.capabilities: WorkerCapabilities | None = None

    def __repr__(self) -> str:
        return f"VLLMClient({self.base_url!r}, model={self.model!r})"

    # ------------------------------------------------------------------ capabilities

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        """json_schema / regex always; the DSML grammar unless ``grammar=False``; never structural_tag."""
        if kind == "ebnf" and self.grammar is False:
            return False
        caps = self.capabilities
        if caps is not None:
            return kind in caps.constraint_kinds
        return kind in _VLLM_KINDS

    async def discover(self) -> WorkerCapabilities | None:
        """Learn ``max_model_len``, the grammar backend and whether the token-in API is on.

        None when ``/v1/models`` cannot be read (worker down or not vLLM): the pool asks again
        later. The token-in probe runs only when ``token_api`` was not forced.
        """
        try:
            models = await self._get_json("/v1/models")
        except httpx.HTTPError:
            return None
        if not isinstance(models, dict):
            return None
        served = [c.get("id") for c in models.get("data") or () if isinstance(c, dict)]
        if served and self.model not in served:
            # vLLM answers every request for another name with 404: say so once, at start-up
            log.warning(
                "vLLM worker %s serves %s, not %r: its requests will be refused (set --worker-model)",
                self.name,
                ", ".join(map(repr, served)),
                self.model,
            )
        if not self._token_api_forced:
            # asked again at every discovery: a worker re-admitted after a restart may be another vLLM
            self.token_api = await self._probe_token_api()
        version = await self._optional_json("/version")
        server_info = await self._optional_json("/server_info?config_format=json")
        backend = _structured_outputs_backend(server_info)
        policy = _scheduling_policy(server_info)
        kinds = set(_VLLM_KINDS)
        if self.grammar is False:
            kinds.discard("ebnf")
        extra: dict[str, object] = {"token_api": self.token_api, **_kv_transfer(server_info)}
        if isinstance(version, dict) and isinstance(version.get("version"), str):
            extra["version"] = version["version"]
        if policy is not None:
            extra["scheduling_policy"] = policy
        self.capabilities = WorkerCapabilities(
            constraint_kinds=frozenset(kinds),
            # not reported without VLLM_SERVER_DEV_MODE: vLLM's default, "auto", is xgrammar with a
            # per-request fallback to guidance
            grammar_backend=backend or "auto",
            context_length=_max_model_len(models, self.model),
            priority_order="low_first" if policy == "priority" else None,
            extra=extra,
        )
        return self.capabilities

    async def _get_json(self, path: str) -> Any:
        response = await self._http.get(self.base_url + path, timeout=self.control_timeout_s)
        response.raise_for_status()
        try:
            return orjson.loads(response.content)
        except orjson.JSONDecodeError:
            return None

    async def _optional_json(self, path: str) -> Any:
        """``GET path`` as JSON, or None when the worker does not have it."""
        try:
            return await self._get_json(path)
        except httpx.HTTPError:
            return None

    async def _probe_token_api(self) -> bool | None:
        """Whether ``/inference/v1/generate`` serves (an empty body fails validation without generating);
        None when the worker cannot be reached (undecided: asked again before the next request)."""
        try:
            response = await self._http.post(
                self.base_url + GENERATE_PATH,
                content=b"{}",
                headers={"content-type": "application/json"},
                timeout=self.control_timeout_s,
            )
        except httpx.HTTPError:
            return None
        # 400 / 422: the route exists and validated our empty body; 403: present but not enabled
        # (no --enable-scale-out); 404 / 405: an older vLLM without it
        return response.status_code in (400, 422)

    async def _ensure_protocol(self) -> None:
        """Make the token-in decision if neither the caller nor :meth:`discover` made it yet."""
        if self.token_api is None:
            self.token_api = await self._probe_token_api()

    # ------------------------------------------------------------------ request bodies

    def _structured_outputs(self, s: SamplingParams) -> dict[str, Any] | None:
        """``structured_outputs`` for the constraint of ``s``; raises UnsupportedFeatureError."""
        if s.constraint is None:
            return None
        kind = s.constraint.kind
        if not self.supports_constraint(kind):
            raise UnsupportedFeatureError(
                f"this vLLM deployment cannot enforce a {kind} constraint"
                + (
                    " (its tool-call grammar is switched off: serve --no-vllm-grammar)"
                    if kind == "ebnf"
                    else ""
                ),
                param="tool_choice" if kind == "ebnf" else "response_format",
            )
        if kind == "json_schema":
            return {"json": orjson.loads(s.constraint.value)}
        if kind == "regex":
            return {"regex": s.constraint.value}
        return {"grammar": s.constraint.value}

    def uses_completions(self, request: GenerateRequest) -> bool:
        """Whether ``request`` goes out on ``/v1/completions`` (no token-in API, or logprobs past its cap)."""
        if not self.token_api:
            return True
        if request.images:
            return False  # only the token-in API carries images; logprobs get its capped list
        s = request.sampling
        return s.logprobs and s.top_logprobs + 1 > self.max_logprobs

    def request_body(self, request: GenerateRequest) -> dict[str, Any]:
        """The ``/v1/completions`` body; raises UnsupportedFeatureError for a constraint it cannot send."""
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": id_list(request.input_ids),
            "max_tokens": s.max_new_tokens,
            **sampling_fields(s),
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "request_id": engine_rid(request.request_id),
        }
        _add_length_and_seed(body, s)
        if s.logprobs:
            # vLLM answers with these k plus the sampled token; _alternatives keeps the k best
            body["logprobs"] = s.top_logprobs
            # logprob keys as "token_id:N" instead of text
            body["return_tokens_as_token_ids"] = True
        structured = self._structured_outputs(s)
        if structured is not None:
            body["structured_outputs"] = structured
        self._add_priority(body, request)
        if request.extra_fields:
            body.update(request.extra_fields)  # a decode leg's kv_transfer_params (disagg/pool.py)
        return body

    def _add_priority(self, body: dict[str, Any], request: GenerateRequest) -> None:
        """``priority``, negated (vLLM serves lower values first), unless it is 0 or the worker is
        known to schedule first come first served (see the module docstring)."""
        priority = request.priority
        if not priority:
            return
        caps = self.capabilities
        if caps is not None and caps.extra.get("scheduling_policy") == "fcfs":
            return
        body["priority"] = -priority

    def generate_body(self, request: GenerateRequest) -> dict[str, Any]:
        """The ``/inference/v1/generate`` body; raises UnsupportedFeatureError like :meth:`request_body`."""
        s = request.sampling
        params: dict[str, Any] = {
            "max_tokens": s.max_new_tokens,
            **sampling_fields(s),
            # the frontend detokenizes; vLLM need not (a --tokens-only worker never does)
            "detokenize": False,
        }
        _add_length_and_seed(params, s)
        if s.logprobs:
            # one more than asked: the endpoint keeps its first k entries with the sampled token
            # among them, so k + 1 always holds the k best (see the module docstring)
            params["logprobs"] = s.top_logprobs + 1 if s.top_logprobs else 0
        structured = self._structured_outputs(s)
        if structured is not None:
            params["structured_outputs"] = structured
        body: dict[str, Any] = {
            "model": self.model,
            "request_id": engine_rid(request.request_id),
            "token_ids": id_list(request.input_ids),
            "sampling_params": params,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        self._add_priority(body, request)
        if request.images:
            # vLLM's raw multimodal input (GenerateRequest.content_parts): it resolves the media and
            # expands the one placeholder id per image itself
            body["content_parts"] = [{"type": "image_url", "url": url} for url in request.images]
        if request.extra_fields:
            body.update(request.extra_fields)  # a decode leg's kv_transfer_params (disagg/pool.py)
        return body

    # ------------------------------------------------------------------ generation

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        await self._ensure_protocol()
        completions = self.uses_completions(request)
        if completions and request.images:
            raise UnsupportedFeatureError(
                "images reach vLLM workers only through the token-in /inference/v1/generate API "
                "(start vLLM with --enable-scale-out); this worker offers only /v1/completions",
                param="messages",
            )
        if completions:
            path, body = COMPLETIONS_PATH, orjson.dumps(self.request_body(request))
        else:
            path, body = GENERATE_PATH, orjson.dumps(self.generate_body(request))
        k = request.sampling.top_logprobs
        progress = StreamProgress(self.name)
        held: EngineChunk | None = None  # the finishing chunk, waiting for the usage chunk
        prompt_tokens: int | None = None
        completion = 0
        #: the id vLLM runs the request under (the generate stream says; abort needs it)
        engine_id = _GENERATE_ID_PREFIX + engine_rid(request.request_id)
        running = finished = consumer_left = silent = False
        try:
            # leaving the block closes the stream, which vLLM also treats as an abort
            url = self.base_url + path
            async with open_event_stream(
                self._streams, self.name, url, body, request.trace_headers
            ) as response_body:
                running = True
                try:
                    ended = False

                    def chunks_of(batch: list[bytes]) -> Iterator[EngineChunk]:
                        """The token chunks of one read's events (the finishing chunk is held for the
                        usage that follows it), nothing after ``[DONE]``."""
                        nonlocal ended, engine_id, prompt_tokens, completion, held, finished
                        for data in batch:
                            if data == b"[DONE]":
                                ended = True
                                return
                            if not data:
                                continue
                            obj = progress.decode(data)
                            if "error" in obj or obj.get("object") == "error":
                                progress.error_event(obj.get("error", obj))
                            if isinstance(obj.get("request_id"), str):
                                engine_id = obj["request_id"]
                            if prompt_tokens is None and isinstance(obj.get("prompt_token_ids"), list):
                                prompt_tokens = len(obj["prompt_token_ids"])
                            usage = obj.get("usage")
                            if isinstance(usage, dict) and held is not None:
                                _apply_usage(held, usage)
                            for choice in obj.get("choices") or ():
                                ids = choice.get("token_ids") or []
                                if prompt_tokens is None and choice.get("prompt_token_ids") is not None:
                                    prompt_tokens = len(choice["prompt_token_ids"])
                                completion += len(ids)
                                reason = _finish(choice.get("finish_reason"))
                                block = choice.get("logprobs")
                                chunk = EngineChunk(
                                    list(ids),
                                    reason,
                                    _matched(choice.get("stop_reason")) if reason == "stop" else None,
                                    prompt_tokens,
                                    completion,
                                    None,
                                    _completion_logprobs(block, ids, k)
                                    if completions
                                    else _generate_logprobs(block, k),
                                    "aborted by the engine" if reason == "abort" else None,
                                )
                                if reason is not None:
                                    held = chunk
                                    finished = True
                                elif ids:
                                    yield chunk

                    # the events of one read are one chunk: one detokenize, parse and client write
                    async with read_chunks(response_body, chunks_of, progress, lambda: ended) as (
                        batches,
                        reads,
                    ):
                        async for chunk in reads:
                            yield chunk
                        if ended:
                            await drain_events(batches)  # the connection goes back to the pool
                    if held is None:
                        raise progress.broken("stream ended without a finish reason")
                    yield held
                except HTTP_ERRORS as exc:
                    raise progress.broken(f"stream broke: {exc!r}") from exc
        except (GeneratorExit, asyncio.CancelledError):
            consumer_left = True
            raise
        except WorkerSilentError:
            silent = True
            raise
        finally:
            if not running and (silent or consumer_left) and not completions:
                # sent but unanswered: the worker may hold the request, or take it up later
                self._abort_unanswered(engine_id)
            # /v1/completions has no abort endpoint: closing its stream is the abort
            if running and not finished and not completions:
                await self._abort_unfinished(engine_id, consumer_left=consumer_left)

    async def remote_prefill(
        self,
        request: GenerateRequest,
        *,
        returns_params: bool = True,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """The prefill leg of vLLM's disaggregated flow; the answer's ``kv_transfer_params``.

        ``request`` (its ``extra_fields`` holding ``kv_transfer_params`` with ``do_remote_decode``
        true) goes out unstreamed, on the endpoint :meth:`generate` would use, with
        :func:`prefill_sampling` (``max_tokens`` 1 and nothing that conflicts with it or lets the
        one token stop the request). ``returns_params``: the connector answers with the params the
        decode leg must carry verbatim (NixlConnector) -- an answer without them is the worker's
        failure; MooncakeConnector never returns any (the orchestrator builds the decode's), but
        needs the prefill to finish by length, so any other finish is the worker's failure.
        ``headers``: extra request headers (``X-data-parallel-rank``). Failures follow the client
        contract: a refusal (4xx) is ``EngineRejectedRequestError``, anything else (no connection,
        5xx, a missing answer) ``EngineUnavailableError``.
        """
        await self._ensure_protocol()
        one = dataclasses.replace(request, sampling=prefill_sampling(request.sampling))
        if self.uses_completions(one):
            path, body = COMPLETIONS_PATH, self.request_body(one)
            body.pop("stream_options", None)
        else:
            path, body = GENERATE_PATH, self.generate_body(one)
            body.pop("stream_options", None)
        body["stream"] = False
        try:
            response = await self._http.post(
                self.base_url + path,
                content=orjson.dumps(body),
                headers={
                    "content-type": "application/json",
                    **(request.trace_headers or {}),
                    **(headers or {}),
                },
                timeout=None,  # a long prompt's prefill takes minutes; the orchestrator bounds it
            )
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"{self.name}: prefill request failed: {exc!r}") from exc
        if is_client_status(response.status_code):
            raise EngineRejectedRequestError(
                f"the engine rejected the request: {response.text[:500]}", status_code=response.status_code
            )
        if response.status_code != 200:
            raise EngineUnavailableError(f"{self.name}: prefill answered HTTP {response.status_code}")
        try:
            answer = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            raise EngineUnavailableError(f"{self.name}: prefill answer is not JSON") from exc
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not returns_params:
            choices = answer.get("choices") if isinstance(answer, dict) else None
            first = (
                choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
            )
            finish = first.get("finish_reason")
            if finish != "length":
                # MooncakeConnector keeps the KV for the decode only after a length finish
                # (mooncake_connector.py request_finished): any other frees it
                raise EngineUnavailableError(
                    f"{self.name}: the prefill finished {finish!r}, not by length: its KV was freed"
                )
            return params if isinstance(params, dict) else {}
        if not isinstance(params, dict) or not params:
            raise EngineUnavailableError(
                f"{self.name}: the prefill answer carries no kv_transfer_params "
                "(is the worker started with a KV connector, --kv-transfer-config?)"
            )
        return params

    async def mooncake_engines(self, port: int) -> dict[int, str]:
        """The engine id of each data-parallel rank of this prefill worker's MooncakeConnector, from
        its bootstrap server (``GET http://HOST:port/query``, ``mooncake_utils.py``
        ``MooncakeBootstrapServer.query``: ``{rank: {"engine_id", "worker_addr"}}``; a DP rank's id
        is ``{engine_id}_dp{rank}``). Raises ``EngineUnavailableError`` when it cannot be read."""
        host = urlsplit(self.base_url).hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        url = f"http://{netloc}:{port}/query"
        try:
            response = await self._http.get(url, timeout=self.control_timeout_s)
            response.raise_for_status()
            data = orjson.loads(response.content)
        except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
            raise EngineUnavailableError(f"{self.name}: Mooncake bootstrap server {url}: {exc!r}") from exc
        engines: dict[int, str] = {}
        if isinstance(data, dict):
            for rank, entry in data.items():
                engine_id = entry.get("engine_id") if isinstance(entry, dict) else None
                if isinstance(engine_id, str) and str(rank).isdigit():
                    engines[int(rank)] = engine_id
        if not engines:
            raise EngineUnavailableError(f"{self.name}: Mooncake bootstrap server {url} lists no engine")
        return engines

    async def _send_abort(self, engine_id: str) -> None:
        """``/inference/v1/abort_requests`` for the id vLLM runs the request under."""
        with contextlib.suppress(httpx.HTTPError):
            await self._http.post(
                self.base_url + GENERATE_ABORT_PATH,
                content=orjson.dumps({"request_ids": [engine_id]}),
                headers={"content-type": "application/json"},
                timeout=self.control_timeout_s,
            )

    async def abort(self, request_id: str) -> None:
        """Best effort: ``/inference/v1/abort_requests`` when the worker has the token-in API, else a
        no-op (``/v1/completions`` aborts when its stream closes, which the generator's ``finally`` does)."""
        if self.token_api:
            await self._send_abort(_GENERATE_ID_PREFIX + engine_rid(request_id))


# ---------------------------------------------------------------------- wire helpers


def prefill_sampling(s: SamplingParams) -> SamplingParams:
    """The sampling of a prefill leg: one token, and nothing that conflicts with that or lets it
    finish otherwise than by length. Field by field (vLLM 0.32/0.33 ``sampling_params.py``
    ``_verify_args``, ``v1/core/sched/utils.py`` ``check_stop``):

    * ``max_tokens`` 1;
    * ``min_tokens`` dropped: above ``max_tokens`` it is a 400 ("min_tokens must be less than or
      equal to max_tokens");
    * ``ignore_eos`` on and ``stop_token_ids`` dropped: an EOS or stop id sampled as the one token
      finishes the request STOPPED, and MooncakeConnector then frees the KV instead of keeping it
      for the decode (only a LENGTH_CAPPED prefill keeps it; NixlConnector keeps both);
    * logprobs and the decoding constraint dropped: the prefill's token is discarded (the decode
      samples the first token itself), so they would only cost (a grammar compiled per request);
    * temperature, top-p/k, min-p, penalties, seed: valid whatever ``max_tokens`` is; kept.
    """
    return dataclasses.replace(
        s,
        max_new_tokens=1,
        min_new_tokens=0,
        ignore_eos=True,
        stop_token_ids=(),
        logprobs=False,
        top_logprobs=0,
        constraint=None,
    )


def _add_length_and_seed(params: dict[str, Any], s: SamplingParams) -> None:
    """Add ``seed``, ``ignore_eos`` and ``min_tokens`` to a request's sampling fields, each only
    when set (both vLLM endpoints take them under these names)."""
    if s.seed is not None:
        params["seed"] = s.seed
    if s.ignore_eos:
        params["ignore_eos"] = True
    if s.min_new_tokens:
        params["min_tokens"] = s.min_new_tokens


def _max_model_len(models: dict[str, Any], model: str) -> int | None:
    """``max_model_len`` of the card named ``model`` in a ``/v1/models`` answer (else the first card's)."""
    cards = [c for c in models.get("data") or () if isinstance(c, dict)]
    chosen = next((c for c in cards if c.get("id") == model), cards[0] if cards else None)
    value = chosen.get("max_model_len") if chosen is not None else None
    return value if isinstance(value, int) and value > 0 else None


def _structured_outputs_backend(server_info: Any) -> str | None:
    """The backend in a ``/server_info?config_format=json`` answer, or None."""
    if not isinstance(server_info, dict):
        return None
    config = server_info.get("vllm_config")
    section = config.get("structured_outputs_config") if isinstance(config, dict) else None
    backend = section.get("backend") if isinstance(section, dict) else None
    return backend if isinstance(backend, str) and backend else None


def _scheduling_policy(server_info: Any) -> str | None:
    """``scheduler_config.policy`` ("fcfs" or "priority") in a ``/server_info?config_format=json``
    answer, or None."""
    if not isinstance(server_info, dict):
        return None
    config = server_info.get("vllm_config")
    section = config.get("scheduler_config") if isinstance(config, dict) else None
    policy = section.get("policy") if isinstance(section, dict) else None
    return policy if isinstance(policy, str) and policy else None


def _kv_transfer(server_info: Any) -> dict[str, object]:
    """The KV connector settings in a ``/server_info?config_format=json`` answer (only with
    ``VLLM_SERVER_DEV_MODE=1``): ``kv_connector``, ``kv_role``, ``kv_engine_id`` and the Mooncake
    bootstrap port (``vllm_env`` ``VLLM_MOONCAKE_BOOTSTRAP_PORT``); empty when it does not say."""
    if not isinstance(server_info, dict):
        return {}
    config = server_info.get("vllm_config")
    section = config.get("kv_transfer_config") if isinstance(config, dict) else None
    out: dict[str, object] = {}
    if isinstance(section, dict):
        for key, name in (
            ("kv_connector", "kv_connector"),
            ("kv_role", "kv_role"),
            ("engine_id", "kv_engine_id"),
        ):
            if isinstance(section.get(key), str) and section[key]:
                out[name] = section[key]
    env = server_info.get("vllm_env")
    port = env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT") if isinstance(env, dict) else None
    if isinstance(port, int | str) and str(port).isdigit():
        out["mooncake_bootstrap_port"] = int(port)
    return out


def _apply_usage(chunk: EngineChunk, usage: dict[str, Any]) -> None:
    chunk.prompt_tokens = usage.get("prompt_tokens", chunk.prompt_tokens)
    chunk.completion_tokens = usage.get("completion_tokens", chunk.completion_tokens)
    details = usage.get("prompt_tokens_details")
    # only a worker run with --enable-prompt-tokens-details reports it
    chunk.cached_tokens = details.get("cached_tokens") if isinstance(details, dict) else None


def _finish(reason: object) -> EngineFinishReason | None:
    if reason is None:
        return None
    if reason == "length":
        return "length"
    if reason == "abort":
        return "abort"
    return "stop"


def _matched(stop_reason: object) -> int | str | None:
    return stop_reason if isinstance(stop_reason, int | str) else None


def _best(alternatives: list[tuple[int, float, int | None]], k: int) -> tuple[tuple[int, float], ...]:
    """The ``k`` most likely of ``(token_id, logprob, rank)`` alternatives, best first.

    vLLM adds the sampled token to its top ``k``, so there may be one too many. Ranks decide when
    vLLM gives them (a random model's logprobs tie often); otherwise the logprobs do.
    """
    if k <= 0:
        return ()
    unique: dict[int, tuple[int, float, int | None]] = {}
    for alt in alternatives:
        unique.setdefault(alt[0], alt)
    ordered = sorted(unique.values(), key=lambda a: (a[2] is None, a[2] or 0, -a[1]))
    return tuple((token_id, logprob) for token_id, logprob, _ in ordered[:k])


def _completion_logprobs(block: object, ids: list[int], k: int) -> list[TokenLogprob] | None:
    """Completions-API logprobs (``token_logprobs``, ``top_logprobs`` keyed ``token_id:N``)."""
    if not isinstance(block, dict) or not ids:
        return None
    values = block.get("token_logprobs") or []
    tops = block.get("top_logprobs") or [None] * len(values)
    out = []
    for token_id, value, top in zip(ids, values, tops, strict=False):
        alts: list[tuple[int, float, int | None]] = []
        if isinstance(top, dict):
            alts = [
                (int(key.split(":", 1)[1]), float(lp), None)
                for key, lp in top.items()
                if isinstance(key, str) and key.startswith("token_id:")
            ]
        out.append(TokenLogprob(int(token_id), float(value) if value is not None else 0.0, _best(alts, k)))
    return out


def _generate_logprobs(block: object, k: int) -> list[TokenLogprob] | None:
    """Token-in generate logprobs: ``{"content": [{"token_id", "logprob", "top_logprobs": [...]}]}``."""
    if not isinstance(block, dict) or not isinstance(block.get("content"), list):
        return None
    out = []
    for entry in block["content"]:
        if not isinstance(entry, dict):
            continue
        alts = [
            (int(alt["token_id"]), float(alt["logprob"]), _rank(alt.get("rank")))
            for alt in entry.get("top_logprobs") or ()
            if isinstance(alt, dict) and "token_id" in alt and "logprob" in alt
        ]
        out.append(TokenLogprob(int(entry["token_id"]), float(entry.get("logprob", 0.0)), _best(alts, k)))
    return out


def _rank(value: object) -> int | None:
    """A 1-based rank; vLLM sends None for a sampled token whose logprob was NaN."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
