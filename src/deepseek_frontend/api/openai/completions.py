"""``POST /v1/completions``: raw prompt passthrough (no chat template, no output parsing).

The prompt is a string (tokenized like ``tokenizer.encode(text)``: special-token
spellings in it ARE control tokens -- the caller wrote a raw prompt on purpose)
or a list of token ids, sent to the engine as they are. The output is the
detokenized text (special tokens as their spelling, the final EOS dropped), with
frontend stop strings, ``n``, logprobs and usage like chat.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from deepseek_frontend.api.validation import check_boolean, check_integer
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.reservation import choices, estimate_prompt_tokens, output_allowance
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.edge.tracking import RequestTracker
from deepseek_frontend.errors import RequestError
from deepseek_frontend.fleet.config import ModelConfig
from deepseek_frontend.pipeline.chat import ChatRequest, ChoiceAccumulator, ChoiceStream, PipelineChunk, Usage
from deepseek_frontend.pipeline.request import DEFAULT_SCHEDULING, Scheduling

from .chat import respond_with_choices
from .chat_request import map_model, map_sampling, map_stream, requested_model
from .chat_response import openai_event_stream

if TYPE_CHECKING:
    from deepseek_frontend.engines.base import TokenLogprob
    from deepseek_frontend.fleet.config import ServerConfig
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.tokenization import PromptTokenizer

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
            raise RequestError("prompt: must not be empty", param="prompt")
        return tokenizer.encode_raw(raw)
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return list(raw)
    if isinstance(raw, list) and raw and all(isinstance(p, str | list) for p in raw):
        raise RequestError(
            "prompt: batched prompts are not supported; send one prompt per request", param="prompt"
        )
    raise RequestError("prompt: expected a string or an array of token ids", param="prompt")


def to_completion_request(
    body: dict[str, Any],
    config: ServerConfig,
    request_id: str,
    scheduling: Scheduling = DEFAULT_SCHEDULING,
) -> ChatRequest:
    """Sampling fields of a completions body as a (message-less) :class:`ChatRequest`, run with
    ``scheduling`` (the request's priority and deadline)."""
    model = map_model(body, config)
    if check_boolean(body.get("echo"), "echo", default=False):
        raise RequestError("echo: not supported", param="echo")
    if body.get("suffix") is not None:
        raise RequestError("suffix: not supported", param="suffix")
    sampling = map_sampling(body)
    best_of = check_integer(body.get("best_of"), "best_of", minimum=1, default=None)
    if best_of is not None and best_of != sampling["n"]:
        raise RequestError("best_of: not supported (only best_of == n)", param="best_of")
    logprobs = check_integer(
        body.get("logprobs"), "logprobs", minimum=0, maximum=MAX_COMPLETION_LOGPROBS, default=None
    )
    max_tokens = check_integer(body.get("max_tokens"), "max_tokens", minimum=1, default=None)
    _, include_usage = map_stream(body)
    user = body.get("user")
    return ChatRequest(
        messages=(),
        request_id=request_id,
        model=model,
        thinking=False,
        max_tokens=max_tokens if max_tokens is not None else DEFAULT_COMPLETION_MAX_TOKENS,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        include_usage=include_usage,
        # not validated here (chat does): a raw-prompt client's odd user field is no reason to refuse
        user=user if isinstance(user, str) else None,
        requested_model=requested_model(body),
        scheduling=scheduling,
        **sampling,
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


class CompletionChunkWriter:
    """Serialises ``text_completion`` stream events for one response (the envelope once)."""

    __slots__ = ("_head", "_logprobs", "_offsets", "_tokenizer")

    def __init__(self, req: ChatRequest, created: int, tokenizer: PromptTokenizer) -> None:
        self._head = (
            b'data: {"id":'
            + orjson.dumps(req.request_id)
            + b',"object":"text_completion","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(req.response_model)
            + b',"choices":'
        )
        self._logprobs = req.logprobs
        self._tokenizer = tokenizer
        #: text offset per choice, for the logprobs' ``text_offset``
        self._offsets = [0] * req.n

    def chunk(self, chunk: PipelineChunk) -> bytes:
        """The event for one pipeline chunk; empty when it carries no text, finish or logprobs."""
        text = "".join(ev.text for ev in chunk.events)
        logprobs = None
        if self._logprobs and chunk.logprobs:
            logprobs = completion_logprobs(self._tokenizer, chunk.logprobs, self._offsets[chunk.index])
        self._offsets[chunk.index] += len(text)
        finish = chunk.end.finish_reason if chunk.end is not None else None
        if not (text or finish or logprobs):
            return b""
        choice = {"index": chunk.index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return self._head + orjson.dumps([choice]) + b"}\n\n"

    def usage(self, usage: Usage) -> bytes:
        return self._head + b'[],"usage":' + orjson.dumps(usage.to_openai()) + b"}\n\n"


def stream_completion(
    model: ServedModel,
    req: ChatRequest,
    streams: Sequence[ChoiceStream],
    created: int,
    tracker: RequestTracker | None = None,
) -> AsyncIterator[bytes]:
    """The ``text_completion`` SSE body (see :func:`~.chat_response.openai_event_stream`)."""
    writer = CompletionChunkWriter(req, created, model.tokenizer)
    return openai_event_stream(
        model, req, streams, tracker, opening=(), encode=writer.chunk, usage_event=writer.usage
    )


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
        "model": req.response_model,
        "choices": choices,
        "usage": Usage.combine([a.usage for a in accs]).to_openai(),
    }


def completion_reservation(body: Mapping[str, Any], model: ModelConfig) -> int:
    """What a completions request may use of its key's tokens per minute (edge/reservation.py): its
    prompt estimate (a prompt of ids: one token each) and ``max_tokens`` (default
    :data:`DEFAULT_COMPLETION_MAX_TOKENS`) for each of its ``n`` choices."""
    prompt = estimate_prompt_tokens(body)
    output = output_allowance(model, prompt, body.get("max_tokens"), unset=DEFAULT_COMPLETION_MAX_TOKENS)
    return prompt + output * choices(body.get("n"), body.get("best_of"))


@api_route("/v1/completions", prefix="cmpl", selects_model=True, reserve=completion_reservation)
async def completions(ctx: RequestContext) -> Response:
    """``POST /v1/completions`` (stream and non-stream)."""
    model = ctx.model
    body = await ctx.json()
    req = to_completion_request(body, model.config, ctx.id, ctx.scheduling)
    if "prompt" not in body:
        raise RequestError("prompt: required", param="prompt")
    started = time.perf_counter()
    prompt = body["prompt"]
    if isinstance(prompt, str) and len(prompt) >= model.pipeline.offload_min_chars:
        # a long text prompt is tokenized off the event loop, like chat prompts
        input_ids = await model.pipeline.offload.run(parse_prompt, prompt, model.tokenizer)
    else:
        input_ids = parse_prompt(prompt, model.tokenizer)
    model.metrics.tokenization.observe(time.perf_counter() - started)
    prepared = model.pipeline.prepare_raw(req, input_ids)
    return await respond_with_choices(
        ctx,
        req,
        prepared,
        stream=bool(body.get("stream")),
        stream_body=stream_completion,
        build=build_completion,
    )
