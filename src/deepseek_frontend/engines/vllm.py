"""vLLM client: ``POST /v1/completions`` with token-id prompts and ``return_token_ids``.

Request: ``"prompt": [ids]``, ``"return_token_ids": true`` (each streamed choice then
carries the chunk's new ``token_ids``), ``"detokenize": false`` (no text work in the
worker; servers that do not know the field ignore it), ``"skip_special_tokens": false``,
``stop_token_ids``, ``stream_options.include_usage`` (usage arrives in a trailing chunk
with no choices, so the finish is held back until the stream ends).

Constraints: a ``json_schema`` goes out as ``structured_outputs: {"json": schema}``
(vLLM >= 0.12; older servers took ``guided_json``). The DSML tool-call grammar is
*not* sent by default: it spells special tokens (``｜DSML｜``) as text, and whether a
vLLM grammar backend lets the model emit those tokens depends on the backend, so
``ebnf`` raises :class:`UnsupportedFeatureError` unless ``grammar=True`` says the
deployment was checked (then it goes out as ``structured_outputs: {"grammar": ...}``).
:meth:`VLLMClient.supports_constraint` lets the API answer 400 before sending.

Abort: vLLM aborts a request when its stream closes; there is no abort endpoint, so
:meth:`abort` is a no-op and closing the generator is what aborts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from deepseek_frontend.engines.base import (
    ConstraintKind,
    EngineChunk,
    EngineClient,
    EngineFinishReason,
    GenerateRequest,
    TokenLogprob,
)
from deepseek_frontend.engines.sglang import error_message, iter_sse_data, new_http_client
from deepseek_frontend.errors import (
    EngineStreamError,
    EngineUnavailableError,
    RequestError,
    UnsupportedFeatureError,
)

__all__ = ["VLLMClient"]

CONTROL_TIMEOUT_S = 5.0


class VLLMClient(EngineClient):
    """One vLLM worker at ``base_url`` serving ``model`` (see module docstring)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        http: httpx.AsyncClient | None = None,
        grammar: bool = False,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.name = self.base_url
        self.model = model
        self.grammar = grammar
        self.control_timeout_s = control_timeout_s
        self._own_http = http is None
        self._http = http or new_http_client()

    def __repr__(self) -> str:
        return f"VLLMClient({self.base_url!r}, model={self.model!r})"

    def supports_constraint(self, kind: ConstraintKind) -> bool:
        if kind == "ebnf":
            return self.grammar
        return kind in ("json_schema", "regex")

    def request_body(self, request: GenerateRequest) -> dict[str, Any]:
        """The ``/v1/completions`` body; raises UnsupportedFeatureError for a constraint it cannot send."""
        s = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": request.input_ids,
            "max_tokens": s.max_new_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "top_k": s.top_k,
            "min_p": s.min_p,
            "frequency_penalty": s.frequency_penalty,
            "presence_penalty": s.presence_penalty,
            "repetition_penalty": s.repetition_penalty,
            "stop_token_ids": list(s.stop_token_ids),
            "skip_special_tokens": False,
            "return_token_ids": True,
            "detokenize": False,
            "stream": True,
            "stream_options": {"include_usage": True},
            "request_id": request.request_id,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        if s.logprobs:
            body["logprobs"] = max(s.top_logprobs, 1)
            # logprob keys as "token_id:N" instead of text we asked vLLM not to produce
            body["return_tokens_as_token_ids"] = True
        if s.constraint is not None:
            kind = s.constraint.kind
            if not self.supports_constraint(kind):
                raise UnsupportedFeatureError(
                    f"this vLLM deployment cannot enforce a {kind} constraint "
                    "(tool_choice 'required' or a named tool needs SGLang, or a vLLM worker configured "
                    "for grammars)",
                    param="tool_choice" if kind == "ebnf" else "response_format",
                )
            if kind == "json_schema":
                body["structured_outputs"] = {"json": orjson.loads(s.constraint.value)}
            elif kind == "regex":
                body["structured_outputs"] = {"regex": s.constraint.value}
            else:
                body["structured_outputs"] = {"grammar": s.constraint.value}
        return body

    async def generate(self, request: GenerateRequest) -> AsyncIterator[EngineChunk]:
        body = orjson.dumps(self.request_body(request))
        yielded = False
        held: EngineChunk | None = None  # the finishing chunk, waiting for the usage chunk
        prompt_tokens: int | None = None
        completion = 0
        try:
            stream_cm = self._http.stream(
                "POST",
                self.base_url + "/v1/completions",
                content=body,
                headers={"content-type": "application/json", "accept": "text/event-stream"},
            )
            response = await stream_cm.__aenter__()
        except httpx.HTTPError as exc:
            raise EngineUnavailableError(f"{self.name}: cannot reach worker: {exc!r}") from exc
        try:
            if response.status_code != 200:
                text = await response.aread()
                message = error_message(text, f"HTTP {response.status_code}")
                if response.status_code in (400, 422):
                    raise RequestError(f"engine rejected the request: {message}")
                raise EngineUnavailableError(f"{self.name}: HTTP {response.status_code}: {message}")
            async for data in iter_sse_data(response):
                if data == b"[DONE]":
                    break
                if not data:
                    continue
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError as exc:
                    raise self._broken(yielded, f"unparsable chunk {data[:200]!r}") from exc
                if "error" in obj or obj.get("object") == "error":
                    err = obj.get("error", obj)
                    msg = err.get("message") if isinstance(err, dict) else str(err)
                    raise self._broken(yielded, f"engine error: {msg}")
                usage = obj.get("usage")
                if isinstance(usage, dict) and held is not None:
                    held.prompt_tokens = usage.get("prompt_tokens", held.prompt_tokens)
                    held.completion_tokens = usage.get("completion_tokens", held.completion_tokens)
                    details = usage.get("prompt_tokens_details") or {}
                    held.cached_tokens = details.get("cached_tokens") if isinstance(details, dict) else None
                for choice in obj.get("choices") or ():
                    ids = choice.get("token_ids") or []
                    if prompt_tokens is None and choice.get("prompt_token_ids") is not None:
                        prompt_tokens = len(choice["prompt_token_ids"])
                    completion += len(ids)
                    reason = _finish(choice.get("finish_reason"))
                    chunk = EngineChunk(
                        list(ids),
                        reason,
                        _matched(choice.get("stop_reason")) if reason == "stop" else None,
                        prompt_tokens,
                        completion,
                        None,
                        _logprobs(choice.get("logprobs"), ids),
                        "aborted by the engine" if reason == "abort" else None,
                    )
                    if reason is not None:
                        held = chunk
                    elif ids:
                        yielded = True
                        yield chunk
            if held is None:
                raise self._broken(yielded, "stream ended without a finish reason")
            yield held
        except httpx.HTTPError as exc:
            raise self._broken(yielded, f"stream broke: {exc!r}") from exc
        finally:
            # closing the stream is vLLM's abort
            await stream_cm.__aexit__(None, None, None)

    def _broken(self, yielded: bool, what: str) -> EngineUnavailableError | EngineStreamError:
        if yielded:
            return EngineStreamError(f"{self.name}: {what}")
        return EngineUnavailableError(f"{self.name}: {what}")

    async def abort(self, request_id: str) -> None:
        """No-op: vLLM aborts when the stream closes (the generator's ``finally`` does that)."""

    async def check_health(self) -> bool:
        """``GET /health``: 200 = healthy."""
        try:
            response = await self._http.get(self.base_url + "/health", timeout=self.control_timeout_s)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        if self._own_http:
            await self._http.aclose()


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


def _logprobs(block: object, ids: list[int]) -> list[TokenLogprob] | None:
    """Completions-API logprobs (``token_logprobs``, ``top_logprobs`` keyed ``token_id:N``)."""
    if not isinstance(block, dict) or not ids:
        return None
    values = block.get("token_logprobs") or []
    tops = block.get("top_logprobs") or [None] * len(values)
    out = []
    for token_id, value, top in zip(ids, values, tops, strict=False):
        alts: tuple[tuple[int, float], ...] = ()
        if isinstance(top, dict):
            alts = tuple(
                (int(key.split(":", 1)[1]), float(lp))
                for key, lp in top.items()
                if isinstance(key, str) and key.startswith("token_id:")
            )
        out.append(TokenLogprob(int(token_id), float(value) if value is not None else 0.0, alts))
    return out
