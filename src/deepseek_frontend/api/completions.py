"""``POST /v1/completions``: raw prompt passthrough (no chat template, no output parsing).

The prompt is a string (tokenized like ``tokenizer.encode(text)``: special-token
spellings in it ARE control tokens -- the caller wrote a raw prompt on purpose)
or a list of token ids, sent to the engine as they are. The output is the
detokenized text (special tokens as their spelling, the final EOS dropped), with
frontend stop strings, ``n``, logprobs and usage like chat.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from deepseek_frontend.errors import RequestError

from .http import (
    EventStreamResponse,
    RequestTracker,
    api_route,
    get_state,
    read_json,
    stream_error_body,
    unless_disconnected,
)
from .openai_chat import _boolean, _integer, _number, map_stop
from .pipeline import (
    MAX_N,
    ChatRequest,
    ChoiceAccumulator,
    ChoiceStream,
    PipelineChunk,
    Usage,
    collect,
    merge_choices,
)
from .sse import DONE, data_event

if TYPE_CHECKING:
    from deepseek_frontend.engines.base import TokenLogprob
    from deepseek_frontend.tokenization import PromptTokenizer

    from .config import ServerConfig
    from .http import FrontendState

#: OpenAI's default output limit for /v1/completions.
DEFAULT_COMPLETION_MAX_TOKENS = 16
#: Most alternatives ``logprobs`` may ask for (OpenAI's limit for completions).
MAX_COMPLETION_LOGPROBS = 5


def parse_prompt(raw: Any, tokenizer: PromptTokenizer) -> list[int]:
    """A single prompt (string, token ids, or a one-element list of either) -> ids."""
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
        raw = raw[0]
    if isinstance(raw, str):
        if not raw:
            raise RequestError("prompt is empty", param="prompt")
        return tokenizer.encode_raw(raw)
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return list(raw)
    if isinstance(raw, list) and raw and all(isinstance(p, str | list) for p in raw):
        raise RequestError("batched prompts are not supported; send one prompt per request", param="prompt")
    raise RequestError("prompt must be a string or an array of token ids", param="prompt")


def to_completion_request(body: dict[str, Any], config: ServerConfig, request_id: str) -> ChatRequest:
    """Sampling fields of a completions body as a (message-less) :class:`ChatRequest`."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string", param="model")
    model = config.resolve_model(model)
    if _boolean(body, "echo"):
        raise RequestError("echo is not supported", param="echo")
    if body.get("suffix") is not None:
        raise RequestError("suffix is not supported", param="suffix")
    best_of = _integer(body, "best_of", lo=1)
    n = _integer(body, "n", lo=1, hi=MAX_N) or 1
    if best_of is not None and best_of != n:
        raise RequestError("best_of is not supported (only best_of == n)", param="best_of")
    logprobs = _integer(body, "logprobs", lo=0, hi=MAX_COMPLETION_LOGPROBS)
    max_tokens = _integer(body, "max_tokens", lo=1)
    stream = _boolean(body, "stream")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise RequestError("stream_options must be an object", param="stream_options")
        if not stream:
            raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
        include_usage = _boolean(opts, "include_usage")
    top_k = _integer(body, "top_k", lo=-1)
    return ChatRequest(
        messages=(),
        request_id=request_id,
        model=model,
        thinking=False,
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_COMPLETION_MAX_TOKENS,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=top_k or -1,
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        seed=_integer(body, "seed"),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 2.0),
        stop=map_stop(body.get("stop")),
        n=n,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        include_usage=include_usage,
        user=body.get("user") if isinstance(body.get("user"), str) else None,
    )


def completion_logprobs(
    tokenizer: PromptTokenizer, logprobs: Sequence[TokenLogprob], offset: int
) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object; ``offset`` is the text offset of the first token."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = tokenizer.decode([lp.token_id])
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        tops.append({tokenizer.decode([t]): p for t, p in lp.top} if lp.top else None)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}


def _chunk_text(chunk: PipelineChunk) -> str:
    return "".join(ev.text for ev in chunk.events)


async def stream_completion(
    state: FrontendState,
    req: ChatRequest,
    streams: Sequence[ChoiceStream],
    created: int,
    tracker: RequestTracker | None = None,
) -> AsyncIterator[bytes]:
    head = (
        b'data: {"id":'
        + orjson.dumps(req.request_id)
        + b',"object":"text_completion","created":'
        + str(created).encode()
        + b',"model":'
        + orjson.dumps(req.model)
        + b',"choices":'
    )
    usages: list[Usage] = []
    offsets = [0] * req.n
    try:
        source = streams[0] if len(streams) == 1 else merge_choices(streams)
        async for chunk in source:
            text = _chunk_text(chunk)
            logprobs = None
            if req.logprobs and chunk.logprobs:
                logprobs = completion_logprobs(state.tokenizer, chunk.logprobs, offsets[chunk.index])
            offsets[chunk.index] += len(text)
            finish = None
            if chunk.end is not None:
                usages.append(chunk.end.usage)
                finish = chunk.end.finish_reason
            if text or finish or logprobs:
                choice = {"index": chunk.index, "text": text, "logprobs": logprobs, "finish_reason": finish}
                yield head + orjson.dumps([choice]) + b"}\n\n"
    except Exception as exc:
        err, body = stream_error_body(exc)
        if tracker is not None:
            tracker.stream_error = err.error_type
        yield data_event(body)
        return
    if req.include_usage:
        yield head + b'[],"usage":' + orjson.dumps(Usage.combine(usages).to_openai()) + b"}\n\n"
    state.metrics.prompt_tokens.inc(usages[0].prompt_tokens if usages else 0)
    yield DONE


def build_completion(
    req: ChatRequest, accs: Sequence[ChoiceAccumulator], created: int, tokenizer: PromptTokenizer
) -> dict[str, Any]:
    choices = []
    for acc in accs:
        logprobs = completion_logprobs(tokenizer, acc.logprobs, 0) if req.logprobs else None
        choices.append(
            {
                "index": acc.index,
                "text": acc.content,
                "logprobs": logprobs,
                "finish_reason": acc.finish_reason,
            }
        )
    return {
        "id": req.request_id,
        "object": "text_completion",
        "created": created,
        "model": req.model,
        "choices": choices,
        "usage": Usage.combine([a.usage for a in accs]).to_openai(),
    }


@api_route("/v1/completions", prefix="cmpl")
async def completions(request: Request, tracker: RequestTracker) -> Response:
    """``POST /v1/completions`` (stream and non-stream)."""
    state = get_state(request)
    body = await read_json(request, state.config.max_body_bytes)
    req = to_completion_request(body, state.config, tracker.request_id)
    if "prompt" not in body:
        raise RequestError("prompt is required", param="prompt")
    started = time.perf_counter()
    input_ids = parse_prompt(body["prompt"], state.tokenizer)
    state.metrics.tokenization.observe(time.perf_counter() - started)
    prepared = state.pipeline.prepare_raw(req, input_ids)
    streams = await unless_disconnected(request, state.pipeline.start(prepared))
    if body.get("stream"):
        return EventStreamResponse(stream_completion(state, req, streams, prepared.created, tracker), tracker)
    accs = await unless_disconnected(request, collect(streams))
    state.metrics.prompt_tokens.inc(prepared.prompt_tokens)
    payload = build_completion(req, accs, prepared.created, state.tokenizer)
    return Response(orjson.dumps(payload), media_type="application/json")
