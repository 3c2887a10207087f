"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the Anthropic Messages API.

The request is translated (:mod:`.convert`) into the same
:class:`~deepseek_frontend.pipeline.ChatRequest` Chat Completions builds, so
rendering, tokenization, the engine pool and the streaming parser are the ones
every protocol shares. Only the two ends differ: the request mapping and the
event shape (:mod:`.events`).

Errors, including the ones raised before a handler runs (auth, unknown route),
are Anthropic's shape -- ``{"type": "error", "error": {"type": ..., "message": ...}}``
-- via :data:`API_SHAPES`; a failure after the stream started is an
``event: error`` with the same body. ``anthropic-version`` and ``anthropic-beta``
headers are accepted and not interpreted.

Thinking blocks are returned only when the request enables thinking (``thinking.type``
``enabled`` / ``adaptive``), as Anthropic's API does; without a ``thinking`` field the
model still thinks per ``--default-thinking`` and the reasoning is withheld (its tokens are
in ``output_tokens``). The withheld reasoning of a tool-calling answer is restored into
the replayed turn (:mod:`.hidden_thinking`), so the tool loop renders as it was generated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.responses import Response
from starlette.routing import Route

from deepseek_frontend.api.adapters import resolve_images, respond_with_events, to_chat_request
from deepseek_frontend.edge.errors import ApiShape
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.reservation import estimate_prompt_tokens, output_allowance
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.fleet.config import ModelConfig
from deepseek_frontend.images import family_reads_images

from .convert import convert_messages_request
from .events import MessagesStreamEncoder, accumulate_message, anthropic_error_body
from .hidden_thinking import HIDDEN_REASONING

__all__ = ["ANTHROPIC", "API_SHAPES", "ROUTES", "count_tokens", "create_message"]

#: the Anthropic Messages API at the edge: its error shape and its ``anthropic-ratelimit-*`` headers
ANTHROPIC = ApiShape("anthropic", anthropic_error_body)


def message_reservation(body: Mapping[str, Any], model: ModelConfig) -> int:
    """What a Messages request may use of its key's tokens per minute (edge/reservation.py): its
    prompt estimate and its ``max_tokens`` (required: without it the request is a 400)."""
    prompt = estimate_prompt_tokens(body)
    return prompt + output_allowance(model, prompt, body.get("max_tokens", 0))


@api_route("/v1/messages", ANTHROPIC, prefix="msg", selects_model=True, reserve=message_reservation)
async def create_message(ctx: RequestContext) -> Response:
    """``POST /v1/messages`` (streaming with ``"stream": true``, else one JSON message)."""
    body = await ctx.json()
    converted = convert_messages_request(body, read_images=family_reads_images(ctx.model.config.model.family))
    HIDDEN_REASONING.restore(converted.messages)
    continuity, owner = ctx.state.continuity, ctx.owner  # reasoning the client dropped (state/continuity.py)
    await continuity.restore(owner, converted.messages, "anthropic")
    # Anthropic's semantics: thinking blocks only when the request enables thinking. Without a
    # `thinking` field the model still runs in the server's default mode; its reasoning is withheld.
    show_thinking = converted.thinking is True
    encoders: list[MessagesStreamEncoder] = []

    def make_encoder(req: Any, prepared: Any) -> MessagesStreamEncoder:
        encoders.append(
            MessagesStreamEncoder(
                model=req.response_model,
                input_tokens=prepared.prompt_tokens,
                show_thinking=show_thinking,
                hidden_reasoning=HIDDEN_REASONING,
            )
        )
        return encoders[-1]

    def shown_ids(acc: Any) -> list[str] | None:
        # the toolu_ ids the client was shown; None when one is not handed out yet (nothing kept)
        ids = [encoders[0].tool_ids.get(call.index) for call in acc.tool_calls] if encoders else [None]
        return None if None in ids else ids  # type: ignore[return-value]

    return await respond_with_events(
        ctx,
        converted,
        make_encoder,
        lambda _encoder, events: accumulate_message(events),
        wrap=continuity.wrap(owner, shown_ids),
    )


@api_route("/v1/messages/count_tokens", ANTHROPIC, prefix="msg", selects_model=True)
async def count_tokens(ctx: RequestContext) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` from the real render + tokenize.

    The count is the prompt exactly as ``/v1/messages`` would send it to the engine
    (tools, thinking mode and effort included).
    """
    model = ctx.model
    body = await ctx.json()
    converted = convert_messages_request(
        body, require_max_tokens=False, read_images=family_reads_images(model.config.model.family)
    )
    HIDDEN_REASONING.restore(converted.messages)
    await ctx.state.continuity.restore(ctx.owner, converted.messages, "anthropic")
    req = to_chat_request(converted, model.config, ctx.id)
    # images are resolved (read, limited) as for /v1/messages: their token counts are part of the answer
    await resolve_images(ctx.state, model, req.messages)
    # Render + tokenize only: a prompt over the context window still gets its count, and
    # "any" / named tool_choice (a decoding constraint, not prompt text) needs no engine support.
    count = await model.pipeline.count_prompt_tokens_async(req)
    return Response(orjson.dumps({"input_tokens": count}), media_type="application/json")


ROUTES = [
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]

#: Errors raised before a handler runs (auth, unknown sub-route) on these paths use Anthropic's shape.
API_SHAPES: dict[str, ApiShape] = {"/v1/messages": ANTHROPIC}
