"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens``: the Anthropic Messages API.

The request is translated (:mod:`.anthropic_convert`) into the same
:class:`~deepseek_frontend.api.pipeline.ChatRequest` Chat Completions builds, so
rendering, tokenization, the engine pool and the streaming parser are the ones
every protocol shares. Only the two ends differ: the request mapping and the
event shape (:mod:`.anthropic_events`).

Errors, including the ones raised before a handler runs (auth, unknown route),
are Anthropic's shape -- ``{"type": "error", "error": {"type": ..., "message": ...}}``
-- via :data:`ERROR_RENDERERS`; a failure after the stream started is an
``event: error`` with the same body. ``anthropic-version`` and ``anthropic-beta``
headers are accepted and not interpreted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .anthropic_convert import convert_messages_request, to_chat_request
from .anthropic_events import (
    MessageAccumulator,
    MessagesStreamEncoder,
    SSEEvent,
    anthropic_error_body,
    stop_reason_for,
)
from .errors import ErrorBodyRenderer, as_frontend_error
from .http import EventStreamResponse, FrontendState, RequestTracker, api_route, get_state, read_json
from .pipeline import ChoiceStream, PipelineChunk, StreamEnd
from .sse import named_event

__all__ = ["ERROR_RENDERERS", "ROUTES", "count_tokens", "create_message"]


def _encode_chunk(encoder: MessagesStreamEncoder, chunk: PipelineChunk) -> list[SSEEvent]:
    out: list[SSEEvent] = []
    for event in chunk.events:
        out += encoder.feed(event)
    end = chunk.end
    if end is not None:
        out += _finish(encoder, end)
    return out


def _finish(encoder: MessagesStreamEncoder, end: StreamEnd) -> list[SSEEvent]:
    usage = end.usage
    # Anthropic's input_tokens excludes cache reads: total input = input + cache_read.
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return encoder.finish(
        stop_reason=stop_reason_for(end.finish_reason, end.stop_sequence),
        stop_sequence=end.stop_sequence,
        output_tokens=usage.completion_tokens,
        input_tokens=usage.prompt_tokens - cached,
        cache_read_input_tokens=cached,
    )


def _frame(events: list[SSEEvent]) -> bytes:
    return b"".join(named_event(name, payload) for name, payload in events)


async def _stream_body(
    state: FrontendState, encoder: MessagesStreamEncoder, stream: ChoiceStream, tracker: RequestTracker
) -> AsyncIterator[bytes]:
    yield _frame(encoder.start())
    try:
        async for chunk in stream:
            events = _encode_chunk(encoder, chunk)
            if events:
                yield _frame(events)
            if chunk.end is not None:
                state.metrics.prompt_tokens.inc(chunk.end.usage.prompt_tokens)
    except Exception as exc:
        err = as_frontend_error(exc)
        tracker.stream_error = err.error_type
        yield _frame(encoder.error(err))
    finally:
        await stream.aclose()


@api_route("/v1/messages", render=anthropic_error_body, prefix="msg")
async def create_message(request: Request, tracker: RequestTracker) -> Response:
    """``POST /v1/messages`` (streaming with ``"stream": true``, else one JSON message)."""
    state = get_state(request)
    body = await read_json(request, state.config.max_body_bytes)
    converted = convert_messages_request(body)
    req = to_chat_request(converted, state.config, tracker.request_id)
    pipeline = state.pipeline
    prepared = pipeline.prepare(req)
    # Await the first engine chunk before committing to 200, so a worker that fails
    # before any token still gets a proper error status.
    (stream,) = await pipeline.start(prepared)
    encoder = MessagesStreamEncoder(model=req.model, input_tokens=prepared.prompt_tokens)
    if converted.stream:
        return EventStreamResponse(_stream_body(state, encoder, stream, tracker), tracker)
    acc = MessageAccumulator()
    acc.add(encoder.start())
    try:
        async for chunk in stream:
            acc.add(_encode_chunk(encoder, chunk))
    finally:
        await stream.aclose()
    state.metrics.prompt_tokens.inc(prepared.prompt_tokens)
    return Response(orjson.dumps(acc.result()), media_type="application/json")


@api_route("/v1/messages/count_tokens", render=anthropic_error_body, prefix="msg")
async def count_tokens(request: Request, tracker: RequestTracker) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}`` from the real render + tokenize.

    The count is the prompt exactly as ``/v1/messages`` would send it to the engine
    (tools, thinking mode and effort included).
    """
    state = get_state(request)
    body = await read_json(request, state.config.max_body_bytes)
    converted = convert_messages_request(body, require_max_tokens=False)
    req = to_chat_request(converted, state.config, tracker.request_id)
    # Render + tokenize only: a prompt over the context window still gets its count, and
    # "any" / named tool_choice (a decoding constraint, not prompt text) needs no engine support.
    count = state.pipeline.count_prompt_tokens(req)
    return Response(orjson.dumps({"input_tokens": count}), media_type="application/json")


ROUTES = [
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]

#: Errors raised before a handler runs (auth, unknown sub-route) on these paths use Anthropic's shape.
ERROR_RENDERERS: dict[str, ErrorBodyRenderer] = {"/v1/messages": anthropic_error_body}
