"""``POST /v1/chat/completions``: the endpoint.

The body is mapped onto a ``ChatRequest`` by :mod:`.chat_request`, and the answer -- a stream of
``chat.completion.chunk`` events or one ``chat.completion`` -- is written by
:mod:`.chat_response`. :func:`respond_with_choices` starts every choice, then streams or answers
once, for both OpenAI endpoints (``/v1/completions`` too).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from deepseek_frontend.api.continuity import continuity_of
from deepseek_frontend.edge.body import read_json
from deepseek_frontend.edge.context import get_state, served_model
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.edge.streaming import EventStreamResponse, unless_disconnected
from deepseek_frontend.edge.tracking import RequestTracker
from deepseek_frontend.images import resolve_request_images
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
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.tokenization import PromptTokenizer


async def respond_with_choices(
    request: Request,
    tracker: RequestTracker,
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
    model = served_model(request)
    streams = await unless_disconnected(request, model.pipeline.start(prepared))
    if wrap is not None:  # e.g. reasoning continuity, which keeps each finished answer (api/continuity.py)
        streams = wrap(streams)
    if stream:
        return EventStreamResponse(stream_body(model, req, streams, prepared.created, tracker), tracker)
    accs = await unless_disconnected(request, collect(streams))
    model.metrics.prompt_tokens.inc(prepared.prompt_tokens)
    payload = build(req, accs, prepared.created, model.tokenizer)
    return Response(orjson.dumps(payload), media_type="application/json")


@api_route("/v1/chat/completions", selects_model=True)
async def chat_completions(request: Request, tracker: RequestTracker) -> Response:
    """``POST /v1/chat/completions`` (stream and non-stream)."""
    state = get_state(request)
    model = served_model(request)
    body = await read_json(request, state.config.max_body_bytes)
    req = to_chat_request(body, model.config, tracker.request_id)
    continuity, owner = continuity_of(request)
    await continuity.restore(owner, req.messages, "chat")  # tool-loop reasoning the client dropped
    await resolve_request_images(state, req.messages, model.pipeline)
    prepared = await model.pipeline.prepare_async(req)
    return await respond_with_choices(
        request,
        tracker,
        req,
        prepared,
        stream=bool(body.get("stream")),
        stream_body=stream_chat,
        build=build_response,
        wrap=continuity.wrap(owner),
    )
