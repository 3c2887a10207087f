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

from deepseek_frontend.engines._http import (
    CONTROL_TIMEOUT_S,
    HTTPEngineClient,
    StreamProgress,
    iter_sse_data,
    open_event_stream,
    sampling_fields,
)
from deepseek_frontend.engines.base import (
    ConstraintKind,
    EngineChunk,
    EngineFinishReason,
    GenerateRequest,
    TokenLogprob,
)
from deepseek_frontend.errors import UnsupportedFeatureError

__all__ = ["VLLMClient"]


class VLLMClient(HTTPEngineClient):
    """One vLLM worker at ``base_url`` serving ``model`` (see module docstring). Health: ``GET /health``."""

    health_path = "/health"

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        http: httpx.AsyncClient | None = None,
        grammar: bool = False,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
    ) -> None:
        super().__init__(base_url, http=http, control_timeout_s=control_timeout_s)
        self.model = model
        self.grammar = grammar

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
            **sampling_fields(s),
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
        progress = StreamProgress(self.name)
        held: EngineChunk | None = None  # the finishing chunk, waiting for the usage chunk
        prompt_tokens: int | None = None
        completion = 0
        # leaving the block closes the stream, which is vLLM's abort
        async with open_event_stream(
            self._http, self.name, self.base_url + "/v1/completions", body
        ) as response:
            try:
                async for data in iter_sse_data(response):
                    if data == b"[DONE]":
                        break
                    if not data:
                        continue
                    obj = progress.decode(data)
                    if "error" in obj or obj.get("object") == "error":
                        progress.error_event(obj.get("error", obj))
                    usage = obj.get("usage")
                    if isinstance(usage, dict) and held is not None:
                        held.prompt_tokens = usage.get("prompt_tokens", held.prompt_tokens)
                        held.completion_tokens = usage.get("completion_tokens", held.completion_tokens)
                        details = usage.get("prompt_tokens_details") or {}
                        held.cached_tokens = (
                            details.get("cached_tokens") if isinstance(details, dict) else None
                        )
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
                            progress.yielded = True
                            yield chunk
                if held is None:
                    raise progress.broken("stream ended without a finish reason")
                yield held
            except httpx.HTTPError as exc:
                raise progress.broken(f"stream broke: {exc!r}") from exc

    async def abort(self, request_id: str) -> None:
        """No-op: vLLM aborts when the stream closes (the generator's ``finally`` does that)."""


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
