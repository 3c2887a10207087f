"""What the Anthropic Messages and OpenAI Responses adapters share: request in, events out.

Both adapters translate their JSON into a :class:`ConvertedChat` (messages, OpenAI
function tools, OpenAI ``tool_choice``, thinking, sampling, ``None`` for "not set"),
and :func:`to_chat_request` fills the server's defaults into the pipeline's
:class:`~deepseek_frontend.pipeline.ChatRequest`. :func:`check_model` and
:func:`function_tools` are the validation steps the two protocols spell the same
way; each raises ``RequestError`` with ``param`` set, in the message style of
:mod:`.validation`.

:func:`respond_with_events` is both endpoints after conversion::

    ConvertedChat -> ChatRequest -> prepare -> start (first engine chunk: errors are
    still an HTTP status) -> stream:     EventEncoder events, framed as SSE
                                 else:   the same events, folded into one JSON answer
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from starlette.responses import Response

from deepseek_frontend.errors import RequestError

from .errors import as_frontend_error
from .event_stream import EventEncoder, SSEEvent, frame_events
from .http import EventStreamResponse, get_state, unless_disconnected
from .validation import check_array, check_object, check_string

if TYPE_CHECKING:
    from starlette.requests import Request

    from deepseek_frontend.pipeline.chat import ChatRequest, ChoiceStream, PreparedRequest

    from .config import ServerConfig
    from .http import FrontendState, RequestTracker

__all__ = [
    "ConvertedChat",
    "check_model",
    "function_tools",
    "respond_with_events",
    "to_chat_request",
]

E = TypeVar("E", bound=EventEncoder)

#: An OpenAI-style chat message dict, as ``formats/`` takes it.
ChatMessage = dict[str, Any]


@dataclass(slots=True)
class ConvertedChat:
    """A protocol request translated into the chat pipeline's terms.

    ``messages`` are OpenAI-style dicts as ``formats/`` takes them; ``tools`` are
    OpenAI function tools (``None`` when the request declares none); ``tool_choice``
    is in OpenAI form. ``None`` in any optional field means "not set by the client:
    use the server default".
    """

    model: str
    messages: list[ChatMessage]
    max_tokens: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    thinking: bool | None = None
    reasoning_effort: str | None = None
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    #: OpenAI ``response_format`` (only the Responses API sets one)
    response_format: dict[str, Any] | None = None
    #: end-user id (``metadata.user_id`` / ``user``), carried as ``ChatRequest.user``
    user: str | None = None


def check_model(body: Mapping[str, Any]) -> str:
    """The ``model`` field: required, a non-empty string (aliases resolve later)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("model: required (a non-empty string)", param="model")
    return model


def function_tools(
    raw: Any, schema_fields: Callable[[Mapping[str, Any], str], dict[str, Any]]
) -> list[dict[str, Any]] | None:
    """A ``tools`` array -> OpenAI function tools (``None`` when absent or empty).

    Shared rules: each tool is an object with a non-empty, unique ``name`` and an
    optional string ``description``. ``schema_fields(tool, path)`` is the protocol's
    part: it checks the tool's ``type`` and returns the function's remaining fields
    (``parameters``, ``strict``), raising for a tool type the protocol does not offer.
    """
    if raw is None:
        return None
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(check_array(raw, "tools")):
        path = f"tools[{i}]"
        tool = check_object(tool, path)
        schema = schema_fields(tool, path)
        name = check_string(tool.get("name"), f"{path}.name", non_empty=True)
        if name in seen:
            raise RequestError(f"{path}.name: duplicate tool name {name!r}", param=f"{path}.name")
        seen.add(name)
        function: dict[str, Any] = {"name": name}
        description = check_string(tool.get("description"), f"{path}.description", default=None)
        if description is not None:
            function["description"] = description
        function.update(schema)
        out.append({"type": "function", "function": function})
    return out or None


def to_chat_request(converted: ConvertedChat, config: ServerConfig, request_id: str) -> ChatRequest:
    """Fill server defaults into a converted request and build the pipeline's :class:`ChatRequest`.

    Resolves the model name (aliases; ``ModelNotFoundError`` for unknown names),
    the thinking default (``--default-thinking``) and normalizes the effort word
    for the checkpoint's effort profile. ``parallel_tool_calls`` is not enforced
    (DeepSeek decides how many calls one turn makes).
    """
    from deepseek_frontend.formats import normalize_reasoning_effort
    from deepseek_frontend.pipeline.chat import ChatRequest

    model = config.resolve_model(converted.model)
    thinking = config.default_thinking if converted.thinking is None else converted.thinking
    # An unset effort goes through the profile too: the "official" profile's default is
    # "high" (what DeepSeek's API renders), not "no effort text".
    effort = (
        normalize_reasoning_effort(converted.reasoning_effort, config.reasoning_effort_profile)
        if thinking
        else None
    )
    return ChatRequest(
        messages=converted.messages,
        request_id=request_id,
        model=model,
        tools=converted.tools,
        tool_choice=converted.tool_choice if converted.tool_choice is not None else "auto",
        thinking=thinking,
        reasoning_effort=effort,
        max_tokens=converted.max_tokens,
        temperature=1.0 if converted.temperature is None else converted.temperature,
        top_p=1.0 if converted.top_p is None else converted.top_p,
        top_k=-1 if converted.top_k is None else converted.top_k,
        stop=tuple(converted.stop),
        response_format=converted.response_format,
        user=converted.user,
    )


async def respond_with_events(
    request: Request,
    tracker: RequestTracker,
    converted: ConvertedChat,
    make_encoder: Callable[[ChatRequest, PreparedRequest], E],
    fold: Callable[[E, list[SSEEvent]], Any],
) -> Response:
    """Serve a converted request: an SSE stream of the encoder's events, or their fold as JSON.

    ``make_encoder(req, prepared)`` builds the protocol's encoder once the prompt is
    known; ``fold(encoder, events)`` turns a whole non-streamed answer's events into
    the response object. The engine request is started (and its first chunk awaited)
    before any status is chosen, so a worker failing before the first token is an
    error response; a failure after it is the encoder's in-band error event.
    """
    state = get_state(request)
    req = to_chat_request(converted, state.config, tracker.request_id)
    pipeline = state.pipeline
    prepared = pipeline.prepare(req)
    # A client that leaves during prefill, or while a non-streamed answer is folded,
    # cancels the work, which aborts the engine request (as on the OpenAI routes).
    (stream,) = await unless_disconnected(request, pipeline.start(prepared))
    encoder = make_encoder(req, prepared)
    if converted.stream:
        return EventStreamResponse(_event_stream(state, encoder, stream, tracker), tracker)
    events = await unless_disconnected(request, _fold_events(encoder, stream))
    state.metrics.prompt_tokens.inc(prepared.prompt_tokens)
    return Response(orjson.dumps(fold(encoder, events)), media_type="application/json")


async def _fold_events(encoder: EventEncoder, stream: ChoiceStream) -> list[SSEEvent]:
    events = encoder.start()
    try:
        async for chunk in stream:
            events += encoder.encode(chunk)
    finally:
        await stream.aclose()
    return events


async def _event_stream(
    state: FrontendState, encoder: EventEncoder, stream: ChoiceStream, tracker: RequestTracker
) -> AsyncIterator[bytes]:
    yield frame_events(encoder.start())
    try:
        async for chunk in stream:
            events = encoder.encode(chunk)
            if events:
                yield frame_events(events)
            if chunk.end is not None:
                state.metrics.prompt_tokens.inc(chunk.end.usage.prompt_tokens)
    except Exception as exc:
        err = as_frontend_error(exc)
        tracker.stream_error = err.error_type
        yield frame_events(encoder.error(err))
    finally:
        await stream.aclose()
