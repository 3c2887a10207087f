"""``POST /v1/chat/completions``: the endpoint.

The body is mapped onto a ``ChatRequest`` by :mod:`.chat_request`, and the answer -- a stream of
``chat.completion.chunk`` events or one ``chat.completion`` -- is written by
:mod:`.chat_response`. :func:`respond_with_choices` starts every choice, then streams or answers
once, for both OpenAI endpoints (``/v1/completions`` too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response

from deepseek_frontend.api.adapters import resolve_images
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.reservation import choices, estimate_prompt_tokens, output_allowance
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.edge.streaming import EventStreamResponse, unless_disconnected
from deepseek_frontend.edge.tracking import RequestTracker
from deepseek_frontend.pipeline.chat import (
    ChatRequest,
    ChoiceAccumulator,
    ChoiceStream,
    PreparedRequest,
    collect,
)

from .chat_request import to_chat_request
from .chat_response import build_response, stream_chat

if TYPE_CHECKING:
    from deepseek_frontend.fleet.config import ModelConfig
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.tokenization import PromptTokenizer


async def respond_with_choices(
    ctx: RequestContext,
    req: ChatRequest,
    prepared: PreparedRequest,
    *,
    stream: bool,
    stream_body: Callable[
        [ServedModel, ChatRequest, Sequence[ChoiceStream], int, RequestTracker], AsyncIterator[bytes]
    ],
    build: Callable[[ChatRequest, Sequence[ChoiceAccumulator], int, PromptTokenizer], dict[str, Any]],
    wrap: Callable[[Sequence[ChoiceStream]], Sequence[ChoiceStream]] | None = None,
) -> Response:
    """Both OpenAI endpoints after mapping: start every choice, then stream or answer once.

    Every choice's first engine chunk is awaited before a status is chosen, so a
    worker failure before the first token is still a proper error response. (A long
    prefill can take seconds: a client that leaves meanwhile aborts it, as it does
    while a non-streamed answer is folded.)
    """
    model, tracker = ctx.model, ctx.tracker
    streams = await unless_disconnected(ctx.request, model.pipeline.start(prepared))
    if wrap is not None:  # e.g. reasoning continuity, which keeps each finished answer (state/continuity.py)
        streams = wrap(streams)
    if stream:
        return EventStreamResponse(stream_body(model, req, streams, prepared.created, tracker), tracker)
    accs = await unless_disconnected(ctx.request, collect(streams))
    model.metrics.prompt_tokens.inc(prepared.prompt_tokens)
    payload = build(req, accs, prepared.created, model.tokenizer)
    return Response(orjson.dumps(payload), media_type="application/json")


def chat_reservation(body: Mapping[str, Any], model: ModelConfig) -> int:
    """What a chat request may use of its key's tokens per minute (edge/reservation.py): its
    prompt estimate and ``max_completion_tokens`` (else ``max_tokens``) for each of its ``n`` choices."""
    prompt = estimate_prompt_tokens(body)
    requested = body.get("max_completion_tokens")
    if requested is None:
        requested = body.get("max_tokens")
    return prompt + output_allowance(model, prompt, requested) * choices(body.get("n"))


@api_route("/v1/chat/completions", selects_model=True, reserve=chat_reservation)
async def chat_completions(ctx: RequestContext) -> Response:
    """``POST /v1/chat/completions`` (stream and non-stream)."""
    model = ctx.model
    body = await ctx.json()
    req = to_chat_request(body, model.config, ctx.id, ctx.scheduling)
    continuity, owner = ctx.state.continuity, ctx.owner
    await continuity.restore(owner, req.messages, "chat")  # tool-loop reasoning the client dropped
    await resolve_images(ctx.state, model, req.messages)
    prepared = await model.pipeline.prepare_async(req)
    return await respond_with_choices(
        ctx,
        req,
        prepared,
        stream=bool(body.get("stream")),
        stream_body=stream_chat,
        build=build_response,
        wrap=continuity.wrap(owner),
    )
