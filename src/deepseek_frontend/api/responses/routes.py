"""``POST /v1/responses``: the OpenAI Responses API.

The request is translated (:mod:`.convert`) into the same
:class:`~deepseek_frontend.pipeline.ChatRequest` Chat Completions builds and
runs through the shared pipeline; the parser's events become typed Responses
events (:mod:`.events`). The non-streaming answer is the response
object ``response.completed`` would carry.

Stored state (``store``, ``previous_response_id``, ``conversation``, ``item_reference``,
``background``) is resolved first (:mod:`.stateful`), into the body a client resending
everything would send; a stored response is written before its answer reaches the client
(:mod:`.stored_routes` serves it back). Under ``--state-store none`` every stateful field is
refused with a 400. Errors use the OpenAI error shape.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deepseek_frontend.api.adapters import respond_with_events
from deepseek_frontend.api.event_stream import frame_events
from deepseek_frontend.api.openai.chat_response import logprobs_content
from deepseek_frontend.api.stored import json_response
from deepseek_frontend.edge.log_once import FirstSeen
from deepseek_frontend.edge.request import RequestContext
from deepseek_frontend.edge.reservation import estimate_prompt_tokens, output_allowance
from deepseek_frontend.edge.route import api_route
from deepseek_frontend.edge.streaming import EventStreamResponse
from deepseek_frontend.edge.tracking import RequestTracker
from deepseek_frontend.errors import FrontendError, RequestError
from deepseek_frontend.fleet.config import ModelConfig
from deepseek_frontend.images import family_reads_images
from deepseek_frontend.routing.session import session_from_headers

from .background import start_background_response
from .convert import convert_responses_request
from .events import ResponsesStreamEncoder
from .stateful import StatefulRequest, resolve_stateful, save_response
from .stored_routes import ROUTES as STORED_ROUTES

__all__ = ["ROUTES", "create_response", "response_echo"]

log = logging.getLogger("deepseek_frontend.api")


def response_echo(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request settings a response object reports back (validated already)."""
    tools = []
    for tool in body.get("tools") or []:
        if tool.get("type", "function") != "function":
            tools.append(dict(tool))  # namespace and hosted tools: as the client declared them
            continue
        tools.append(
            {
                "type": "function",
                "name": tool["name"],
                "description": tool.get("description"),
                "parameters": tool.get("parameters"),
                "strict": tool.get("strict"),
            }
        )
    reasoning = body.get("reasoning") or {}
    text = body.get("text") or {}
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "temperature": body.get("temperature", 1.0),
        "text": {"format": text.get("format") or {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": tools,
        "top_p": body.get("top_p", 1.0),
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


#: (client, warnings) pairs already logged at WARNING; bounded, least recently seen forgotten first
_WARNED = FirstSeen(max_keys=1024)


def _log_warnings(request: Request, warnings: list[str], request_id: str) -> None:
    """Log what the server ignored: WARNING the first time a client sends it, DEBUG after that.

    Agents repeat the same request shape (Codex declares a hosted ``web_search`` tool in every
    request): the response's ``warnings`` tell the client each time, the log only once per
    client -- its agent session header (``session_id``, ...) or, without one, its address
    and ``User-Agent``.
    """
    scope = request.scope
    client = session_from_headers(scope["headers"])
    if client is None:
        host = scope["client"][0] if scope.get("client") else "?"
        client = f"{host} {request.headers.get('user-agent', '')}".strip()
    text = "; ".join(warnings)
    first = _WARNED.first((client, text))
    log.log(
        logging.WARNING if first else logging.DEBUG,
        "responses request: %s%s",
        text,
        " (logged once per client; repeats at DEBUG)" if first else "",
        extra={"request_id": request_id, "client": client},
    )


def _response_object(encoder: ResponsesStreamEncoder, _events: object) -> dict[str, Any] | None:
    # the encoder keeps the response object response.completed carries: that is the answer
    return encoder.response


def response_reservation(body: Mapping[str, Any], model: ModelConfig) -> int:
    """What a Responses request may use of its key's tokens per minute (edge/reservation.py): its
    prompt estimate (the stored turns of ``previous_response_id`` or ``conversation`` are counted
    when it is settled) and ``max_output_tokens``. A background response keeps the reservation
    until its generation ends."""
    prompt = estimate_prompt_tokens(body)
    return prompt + output_allowance(model, prompt, body.get("max_output_tokens"))


@api_route("/v1/responses", prefix="resp", selects_model=True, reserve=response_reservation)
async def create_response(ctx: RequestContext) -> Response:
    """``POST /v1/responses`` (typed SSE events with ``"stream": true``, else the response object)."""
    state, model = ctx.state, ctx.model
    config = model.config
    body = await ctx.json()
    owner = ctx.owner
    # stored state first: the translation sees the body a client resending everything would send
    stateful = await resolve_stateful(body, state.store, owner, config.server.state.store_by_default)
    converted = convert_responses_request(
        stateful.body,
        hosted_tools=config.model.hosted_tools,
        read_images=family_reads_images(config.model.family),
    )
    echo = response_echo(body)
    echo.update(stateful.echo())
    echo["service_tier"] = ctx.scheduling.service_tier
    continuity = state.continuity
    await continuity.restore(owner, converted.messages, "responses")  # reasoning items the client dropped
    if converted.warnings:
        echo["warnings"] = list(converted.warnings)
        _log_warnings(ctx.request, converted.warnings, ctx.id)
    if stateful.background:
        if converted.stream:
            raise RequestError("background: streaming a background response is not supported", param="stream")
        tracker = ctx.tracker
        # its priority goes with it; its deadline does not: the client is answered at once and
        # comes back for the result (cancel stops it)
        converted.scheduling = dataclasses.replace(ctx.scheduling, deadline=None, budget_ms=None)
        return json_response(
            await start_background_response(
                state,
                model,
                stateful,
                converted,
                echo,
                tracker.hand_over_key_charge(),
                # the request's admission slot goes with the generation: background work counts
                admission_slot=tracker.hand_over_admission(),
            )
        )
    encoders: list[ResponsesStreamEncoder] = []

    def make_encoder(req: Any, prepared: Any) -> ResponsesStreamEncoder:
        encoder = ResponsesStreamEncoder(
            model=req.response_model,
            input_tokens=prepared.prompt_tokens,
            echo=echo,
            tool_namespaces=converted.tool_namespaces,
            logprobs=(
                partial(logprobs_content, model.tokenizer, top_logprobs=converted.top_logprobs)
                if converted.logprobs
                else None
            ),
        )
        encoders.append(encoder)
        return encoder

    response = await respond_with_events(
        ctx, converted, make_encoder, _response_object, wrap=continuity.wrap(owner)
    )
    if stateful.store:
        if isinstance(response, EventStreamResponse):
            response.body_iterator = _saving_stream(
                response.body_iterator, state.store, stateful, encoders[0], ctx.tracker
            )
        elif encoders and encoders[0].response is not None:
            # stored before the client has the answer: what it was given can be continued
            await save_response(state.store, stateful, encoders[0].response)
    return response


async def _saving_stream(
    frames: AsyncIterator[bytes],
    store: Any,
    stateful: StatefulRequest,
    encoder: ResponsesStreamEncoder,
    tracker: RequestTracker,
) -> AsyncIterator[bytes]:
    """``frames``, with the response stored before the frame carrying ``response.completed`` (or
    ``response.incomplete``) goes out; a stream that fails or is abandoned stores nothing.

    A store that fails the write (disk full, database down: ``StoreUnavailableError``; an object
    over the whole budget: ``StoreBudgetError``) ends the stream with the Responses ``error``
    event in place of that frame -- the client never reads ``response.completed`` for a response
    that was not stored -- and the request is logged with the error's status (503: the server's
    fault), not as a client that went away."""
    saved = False
    try:
        async for frame in frames:
            if encoder.response is not None and not saved:
                saved = True
                try:
                    await save_response(store, stateful, encoder.response)
                except FrontendError as exc:
                    tracker.stream_error, tracker.stream_status = exc.error_type, exc.status_code
                    log.warning(
                        "stored stream ended: %s", exc.message, extra={"request_id": tracker.request_id}
                    )
                    yield frame_events(encoder.error(exc))
                    return
            yield frame
    finally:
        aclose = getattr(frames, "aclose", None)
        if aclose is not None:
            await aclose()


ROUTES = [Route("/v1/responses", create_response, methods=["POST"]), *STORED_ROUTES]
