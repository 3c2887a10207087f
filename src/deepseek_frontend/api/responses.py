"""``POST /v1/responses``: the OpenAI Responses API, stateless.

The request is translated (:mod:`.responses_convert`) into the same
:class:`~deepseek_frontend.api.pipeline.ChatRequest` Chat Completions builds and
runs through the shared pipeline; the parser's events become typed Responses
events (:mod:`.responses_events`). The non-streaming answer is the response
object ``response.completed`` would carry.

Nothing is stored: ``previous_response_id``, ``conversation``, ``background`` and
``store: true`` are refused with a 400 (the client sends the whole conversation,
reasoning items included). Errors use the OpenAI error shape.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .anthropic_convert import to_chat_request
from .anthropic_events import SSEEvent
from .errors import as_frontend_error
from .http import EventStreamResponse, FrontendState, RequestTracker, api_route, get_state, read_json
from .pipeline import ChoiceStream, PipelineChunk
from .responses_convert import convert_responses_request
from .responses_events import ResponsesStreamEncoder
from .sse import named_event

__all__ = ["ROUTES", "create_response", "response_echo"]


def response_echo(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request settings a response object reports back (validated already)."""
    tools = []
    for tool in body.get("tools") or []:
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


def _encode_chunk(encoder: ResponsesStreamEncoder, chunk: PipelineChunk) -> list[SSEEvent]:
    out: list[SSEEvent] = []
    for event in chunk.events:
        out += encoder.feed(event)
    end = chunk.end
    if end is not None:
        usage = end.usage
        encoder.cached_tokens = usage.cached_tokens
        encoder.input_tokens = usage.prompt_tokens
        out += encoder.finish(
            finish_reason=end.finish_reason,
            output_tokens=usage.completion_tokens,
            reasoning_tokens=usage.reasoning_tokens,
        )
    return out


def _frame(events: list[SSEEvent]) -> bytes:
    return b"".join(named_event(name, payload) for name, payload in events)


async def _stream_body(
    state: FrontendState, encoder: ResponsesStreamEncoder, stream: ChoiceStream, tracker: RequestTracker
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


@api_route("/v1/responses", prefix="resp")
async def create_response(request: Request, tracker: RequestTracker) -> Response:
    """``POST /v1/responses`` (typed SSE events with ``"stream": true``, else the response object)."""
    state = get_state(request)
    body = await read_json(request, state.config.max_body_bytes)
    converted = convert_responses_request(body)
    req = to_chat_request(converted, state.config, tracker.request_id)
    pipeline = state.pipeline
    prepared = pipeline.prepare(req)
    (stream,) = await pipeline.start(prepared)
    encoder = ResponsesStreamEncoder(
        model=req.model, input_tokens=prepared.prompt_tokens, echo=response_echo(body)
    )
    if converted.stream:
        return EventStreamResponse(_stream_body(state, encoder, stream, tracker), tracker)
    encoder.start()
    try:
        async for chunk in stream:
            _encode_chunk(encoder, chunk)
    finally:
        await stream.aclose()
    state.metrics.prompt_tokens.inc(prepared.prompt_tokens)
    return Response(orjson.dumps(encoder.response), media_type="application/json")


ROUTES = [Route("/v1/responses", create_response, methods=["POST"])]
