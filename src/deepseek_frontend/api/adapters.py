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

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from starlette.responses import Response

from deepseek_frontend.edge.errors import as_frontend_error
from deepseek_frontend.edge.streaming import EventStreamResponse, unless_disconnected
from deepseek_frontend.errors import RequestError
from deepseek_frontend.pipeline.request import DEFAULT_SCHEDULING, Scheduling

from .event_stream import EventEncoder, SSEEvent, frame_events
from .validation import check_array, check_boolean, check_integer, check_object, check_string

if TYPE_CHECKING:
    from deepseek_frontend.edge.context import FrontendState
    from deepseek_frontend.edge.request import RequestContext
    from deepseek_frontend.edge.tracking import RequestTracker
    from deepseek_frontend.fleet.config import ServerConfig
    from deepseek_frontend.fleet.served_model import ServedModel
    from deepseek_frontend.pipeline.chat import ChatRequest, ChoiceStream, PreparedRequest

__all__ = [
    "ConvertedChat",
    "check_model",
    "function_tools",
    "length_controls",
    "resolve_images",
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
    #: an effort word or a budget 1-100, as the client sent it (normalized by :func:`to_chat_request`)
    reasoning_effort: str | int | None = None
    #: where the effort came from, for error messages (``output_config.effort``, ``reasoning.effort``)
    effort_param: str = "reasoning_effort"
    #: Anthropic ``thinking.budget_tokens``: the effort on V4.1 checkpoints when no effort is given
    thinking_budget_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    #: OpenAI ``response_format`` (only the Responses API sets one)
    response_format: dict[str, Any] | None = None
    #: end-user id (``metadata.user_id`` / ``user``), carried as ``ChatRequest.user``
    user: str | None = None
    #: generate to max_tokens whatever EOS says / not before min_tokens (benchmark clients)
    ignore_eos: bool = False
    min_tokens: int = 0
    #: flattened tool name -> (namespace, name the client declared) for Responses namespace tools
    tool_namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: what the server ignored in the request (hosted tools), reported back in the response
    warnings: list[str] = field(default_factory=list)
    #: the answer tokens' logprobs (Responses ``include: ["message.output_text.logprobs"]``)
    logprobs: bool = False
    #: alternatives per token with ``logprobs`` (Responses ``top_logprobs``, 0-20)
    top_logprobs: int = 0
    #: its priority, service tier and deadline (the request's, set by :func:`respond_with_events`;
    #: a background response's without the deadline)
    scheduling: Scheduling = DEFAULT_SCHEDULING


def length_controls(body: Mapping[str, Any]) -> tuple[bool, int]:
    """``(ignore_eos, min_tokens)``: vLLM's field names, accepted on every API (benchmark clients)."""
    return (
        check_boolean(body.get("ignore_eos"), "ignore_eos", default=False),
        check_integer(body.get("min_tokens"), "min_tokens", minimum=0, default=0),
    )


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
    from deepseek_frontend.formats.effort import V41_PROFILES, budget_from_thinking_tokens
    from deepseek_frontend.pipeline.chat import ChatRequest

    model = config.model.resolve_model(converted.model)
    thinking = config.model.default_thinking if converted.thinking is None else converted.thinking
    raw_effort = converted.reasoning_effort
    param = converted.effort_param
    if (
        raw_effort is None
        and converted.thinking_budget_tokens is not None
        and config.model.reasoning_effort_profile in V41_PROFILES
    ):
        # V4.1 has a numeric effort: a thinking token budget maps onto it (V4 keeps its words).
        raw_effort = budget_from_thinking_tokens(converted.thinking_budget_tokens)
        param = "thinking.budget_tokens"
    # An unset effort goes through the profile too: the "official" profile's default is
    # "high" (what DeepSeek's API renders), not "no effort text".
    effort = (
        normalize_reasoning_effort(raw_effort, config.model.reasoning_effort_profile, param=param)
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
        # echoed as sent: Claude Code drops the thinking of turns whose model it did not ask for
        requested_model=converted.model,
        ignore_eos=converted.ignore_eos,
        min_tokens=converted.min_tokens,
        logprobs=converted.logprobs,
        top_logprobs=converted.top_logprobs if converted.logprobs else 0,
        scheduling=converted.scheduling,
    )


async def resolve_images(state: FrontendState, model: ServedModel, messages: list[dict[str, Any]]) -> None:
    """Resolve the image parts of a converted request's ``messages`` in place (``images.py``),
    before ``model``'s pipeline prepares it; a request without image parts costs one walk over them.
    Raises ``RequestError`` (400) naming the part, as ``ImageResolver.resolve``."""
    pipeline = model.pipeline
    await state.images.resolve(messages, supports_images=pipeline.takes_images, family=pipeline.family)


async def respond_with_events(
    ctx: RequestContext,
    converted: ConvertedChat,
    make_encoder: Callable[[ChatRequest, PreparedRequest], E],
    fold: Callable[[E, list[SSEEvent]], Any],
    wrap: Callable[[Sequence[ChoiceStream]], Sequence[ChoiceStream]] | None = None,
) -> Response:
    """Serve a converted request: an SSE stream of the encoder's events, or their fold as JSON.

    ``make_encoder(req, prepared)`` builds the protocol's encoder once the prompt is
    known; ``fold(encoder, events)`` turns a whole non-streamed answer's events into
    the response object. The engine request is started (and its first chunk awaited)
    before any status is chosen, so a worker failing before the first token is an
    error response; a failure after it is the encoder's in-band error event.
    """
    model, tracker = ctx.model, ctx.tracker
    converted.scheduling = ctx.scheduling
    req = to_chat_request(converted, model.config, ctx.id)
    pipeline = model.pipeline
    await resolve_images(ctx.state, model, req.messages)
    prepared = await pipeline.prepare_async(req)
    # A client that leaves during prefill, or while a non-streamed answer is folded,
    # cancels the work, which aborts the engine request (as on the OpenAI routes).
    (stream,) = await unless_disconnected(ctx.request, pipeline.start(prepared))
    if wrap is not None:  # e.g. reasoning continuity, which keeps the finished answer (state/continuity.py)
        (stream,) = wrap([stream])
    encoder = make_encoder(req, prepared)
    if stream.first_cached_tokens:
        encoder.note_cached_prompt(stream.first_cached_tokens)
    if converted.stream:
        return EventStreamResponse(_event_stream(model, encoder, stream, tracker), tracker)
    events = await unless_disconnected(ctx.request, _fold_events(encoder, stream))
    model.metrics.prompt_tokens.inc(prepared.prompt_tokens)
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
    model: ServedModel, encoder: EventEncoder, stream: ChoiceStream, tracker: RequestTracker
) -> AsyncIterator[bytes]:
    yield frame_events(encoder.start())
    try:
        async for chunk in stream:
            events = encoder.encode(chunk)
            if events:
                yield frame_events(events)
            if chunk.end is not None:
                model.metrics.prompt_tokens.inc(chunk.end.usage.prompt_tokens)
    except Exception as exc:
        err = as_frontend_error(exc)
        tracker.stream_error = err.error_type
        yield frame_events(encoder.error(err))
    finally:
        await stream.aclose()
