"""``POST /v1/chat/completions``: OpenAI JSON <-> :class:`~deepseek_frontend.api.pipeline.ChatRequest`.

Three parts:

* :func:`to_chat_request` validates the body and maps it onto a ``ChatRequest``.
  Every rejection is a ``RequestError`` whose ``param`` names the field
  (``messages[2].content[0].type``), so clients can find what is wrong.
* :class:`ChunkWriter` turns pipeline chunks into ``chat.completion.chunk`` SSE
  events: one event per engine chunk (events of one chunk are merged into one
  delta where the OpenAI shape keeps their order), built from pre-serialised
  byte templates so the per-token cost is one small ``orjson.dumps``.
* :func:`build_response` is the non-streaming ``chat.completion``, folded from
  the same chunks.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from deepseek_frontend.errors import RequestError
from deepseek_frontend.parsing import ContentDelta, ReasoningDelta, ToolCallArgumentsDelta, ToolCallStart

from .http import (
    EventStreamResponse,
    RequestTracker,
    api_route,
    get_state,
    read_json,
    stream_error_body,
    unless_disconnected,
)
from .pipeline import (
    MAX_N,
    MAX_TOP_LOGPROBS,
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

#: Most stop strings a request may set.
MAX_STOP = 16
_ROLES = ("system", "user", "assistant", "tool", "developer")
_IMAGE_PARTS = ("image_url", "input_image", "image", "input_audio", "file")
_THINKING_TYPES = {"enabled": True, "disabled": False}


# --------------------------------------------------------------------------- validation helpers


def _type_name(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value),
        "integer" if isinstance(value, int) else "number" if isinstance(value, float) else "value",
    )


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RequestError(f"{key} must be a number, got {_type_name(value)}", param=key)
    if not lo <= value <= hi:
        raise RequestError(f"{key} must be between {lo:g} and {hi:g}, got {value}", param=key)
    return float(value)


def _integer(body: dict[str, Any], key: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{key} must be an integer, got {_type_name(value)}", param=key)
    if lo is not None and value < lo:
        raise RequestError(f"{key} must be >= {lo}, got {value}", param=key)
    if hi is not None and value > hi:
        raise RequestError(f"{key} must be <= {hi}, got {value}", param=key)
    return value


def _boolean(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{key} must be a boolean, got {_type_name(value)}", param=key)
    return value


def _text_content(content: Any, path: str, *, allow_none: bool) -> str:
    """String content, or text parts concatenated. Images are rejected (text-only model)."""
    if content is None:
        if allow_none:
            return ""
        raise RequestError(f"{path} is required", param=path)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(f"{path} must be a string or an array of content parts", param=path)
    texts: list[str] = []
    for j, part in enumerate(content):
        ppath = f"{path}[{j}]"
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise RequestError(f"{ppath} must be a content part object", param=ppath)
        ptype = part.get("type")
        if ptype in ("text", "input_text", "output_text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise RequestError(f"{ppath}.text must be a string", param=f"{ppath}.text")
            texts.append(text)
        elif ptype in _IMAGE_PARTS:
            raise RequestError(
                f"{ppath}: {ptype} parts are not supported: this model reads text only "
                "(images are not supported)",
                param=f"{ppath}.type",
            )
        else:
            raise RequestError(
                f"{ppath}.type {ptype!r} is not a supported content part type", param=f"{ppath}.type"
            )
    return "".join(texts)


def _tool_calls(raw: Any, path: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise RequestError(f"{path} must be an array", param=path)
    calls: list[dict[str, Any]] = []
    for k, call in enumerate(raw):
        cpath = f"{path}[{k}]"
        if not isinstance(call, dict):
            raise RequestError(f"{cpath} must be an object", param=cpath)
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise RequestError(f"{cpath}.function must be an object", param=f"{cpath}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(
                f"{cpath}.function.name must be a non-empty string", param=f"{cpath}.function.name"
            )
        args = fn.get("arguments", "{}")
        if isinstance(args, dict):
            # Some clients send the object itself; the formats take a JSON string.
            args = json.dumps(args, ensure_ascii=False)
        elif args is None:
            args = "{}"
        elif not isinstance(args, str):
            raise RequestError(
                f"{cpath}.function.arguments must be a JSON string", param=f"{cpath}.function.arguments"
            )
        call_id = call.get("id")
        calls.append(
            {
                "id": call_id if isinstance(call_id, str) else f"call_{k}",
                "type": "function",
                "function": {"name": name, "arguments": args},
            }
        )
    return calls


def map_messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI ``messages`` -> the formats' message dicts (string content, JSON-string arguments)."""
    if not isinstance(raw, list) or not raw:
        raise RequestError("messages must be a non-empty array", param="messages")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(raw):
        path = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(f"{path} must be an object", param=path)
        role = msg.get("role")
        if role not in _ROLES:
            raise RequestError(
                f"{path}.role must be one of {', '.join(_ROLES)}; got {role!r}", param=f"{path}.role"
            )
        if role == "assistant":
            m: dict[str, Any] = {
                "role": "assistant",
                "content": _text_content(msg.get("content"), f"{path}.content", allow_none=True),
            }
            reasoning = msg.get("reasoning_content", msg.get("reasoning"))
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    raise RequestError(
                        f"{path}.reasoning_content must be a string", param=f"{path}.reasoning_content"
                    )
                m["reasoning_content"] = reasoning
            if msg.get("tool_calls"):
                m["tool_calls"] = _tool_calls(msg["tool_calls"], f"{path}.tool_calls")
        elif role == "tool":
            m = {
                "role": "tool",
                "content": _text_content(msg.get("content"), f"{path}.content", allow_none=True),
            }
            call_id = msg.get("tool_call_id")
            if call_id is not None and not isinstance(call_id, str):
                raise RequestError(f"{path}.tool_call_id must be a string", param=f"{path}.tool_call_id")
            m["tool_call_id"] = call_id or ""
        else:
            m = {
                "role": role,
                "content": _text_content(msg.get("content"), f"{path}.content", allow_none=False),
            }
        out.append(m)
    return out


def map_tools(raw: Any) -> list[dict[str, Any]] | None:
    """Validate an OpenAI ``tools`` array (function tools only)."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools must be an array", param="tools")
    tools: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(raw):
        path = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise RequestError(f"{path} must be an object", param=path)
        if tool.get("type", "function") != "function":
            raise RequestError(f"{path}.type must be 'function'", param=f"{path}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise RequestError(f"{path}.function must be an object", param=f"{path}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(
                f"{path}.function.name must be a non-empty string", param=f"{path}.function.name"
            )
        if name in seen:
            raise RequestError(
                f"{path}.function.name {name!r} is declared twice", param=f"{path}.function.name"
            )
        seen.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise RequestError(
                f"{path}.function.parameters must be a JSON schema object",
                param=f"{path}.function.parameters",
            )
        tools.append({"type": "function", "function": fn})
    return tools or None


def map_tool_choice(raw: Any, tools: Sequence[dict[str, Any]] | None) -> Any:
    """``none``/``auto``/``required``/named; a named tool must be declared."""
    if raw is None:
        return "auto"
    if raw in ("none", "auto", "required"):
        if raw == "required" and not tools:
            raise RequestError(
                "tool_choice 'required' needs at least one tool in 'tools'", param="tool_choice"
            )
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function":
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise RequestError(
                "tool_choice.function.name must be a string", param="tool_choice.function.name"
            )
        declared = {t["function"]["name"] for t in tools or ()}
        if name not in declared:
            raise RequestError(
                f"tool_choice names {name!r}, which is not declared in 'tools'",
                param="tool_choice.function.name",
            )
        return {"type": "function", "function": {"name": name}}
    raise RequestError(
        "tool_choice must be 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": ...}}',
        param="tool_choice",
    )


def resolve_thinking(body: dict[str, Any], default: bool) -> bool:
    """Thinking on/off from ``thinking``, ``chat_template_kwargs`` or ``reasoning_effort: "none"``."""
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in _THINKING_TYPES:
            raise RequestError(
                'thinking must be {"type": "enabled"} or {"type": "disabled"}', param="thinking.type"
            )
        return _THINKING_TYPES[kind]
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise RequestError("chat_template_kwargs must be an object", param="chat_template_kwargs")
        for key in ("thinking", "enable_thinking"):
            if key in kwargs:
                value = kwargs[key]
                if not isinstance(value, bool):
                    raise RequestError(
                        f"chat_template_kwargs.{key} must be a boolean", param=f"chat_template_kwargs.{key}"
                    )
                return value
    if body.get("reasoning_effort") == "none":
        return False
    return default


def resolve_reasoning_effort(raw: Any, profile: str) -> str | None:
    """Normalize an effort word (or its absence) for the checkpoint's profile.

    An absent effort still goes through the table: the official profile renders its
    default ("high", as DeepSeek's API does) rather than the encoder's bare default.
    """
    if raw is not None and not isinstance(raw, str):
        raise RequestError("reasoning_effort must be a string", param="reasoning_effort")
    from deepseek_frontend.formats import normalize_reasoning_effort

    try:
        return normalize_reasoning_effort(raw, profile)
    except RequestError as exc:
        exc.param = exc.param or "reasoning_effort"
        raise
    except (ValueError, KeyError) as exc:
        raise RequestError(
            f"reasoning_effort {raw!r} is not supported: {exc}", param="reasoning_effort"
        ) from None


def map_stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,) if raw else ()
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise RequestError("stop must be a string or an array of strings", param="stop")
    if len(raw) > MAX_STOP:
        raise RequestError(f"stop may hold at most {MAX_STOP} strings", param="stop")
    return tuple(s for s in raw if s)


def map_response_format(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise RequestError("response_format must be an object", param="response_format")
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise RequestError(
                "response_format.json_schema must be an object with a 'schema' object",
                param="response_format.json_schema",
            )
        return {"type": "json_schema", "json_schema": spec}
    raise RequestError(
        "response_format.type must be 'text', 'json_object' or 'json_schema'", param="response_format.type"
    )


def to_chat_request(body: dict[str, Any], config: ServerConfig, request_id: str) -> ChatRequest:
    """Validate an OpenAI chat body and map it onto a :class:`ChatRequest`.

    Raises ``RequestError`` (400, ``param`` set) and ``ModelNotFoundError`` (404).
    """
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model must be a string", param="model")
    model = config.resolve_model(model)
    messages = map_messages(body.get("messages"))
    tools = map_tools(body.get("tools"))
    tool_choice = map_tool_choice(body.get("tool_choice"), tools)
    thinking = resolve_thinking(body, config.default_thinking)
    effort = (
        resolve_reasoning_effort(body.get("reasoning_effort"), config.reasoning_effort_profile)
        if thinking
        else None
    )

    max_tokens = _integer(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", lo=1)
    elif body.get("max_tokens") is not None:
        _integer(body, "max_tokens", lo=1)  # still validated

    top_k = _integer(body, "top_k", lo=-1)
    n = _integer(body, "n", lo=1, hi=MAX_N) or 1
    logprobs = _boolean(body, "logprobs")
    top_logprobs = _integer(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise RequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
    stream = _boolean(body, "stream")
    include_usage = False
    opts = body.get("stream_options")
    if opts is not None:
        if not isinstance(opts, dict):
            raise RequestError("stream_options must be an object", param="stream_options")
        if not stream:
            raise RequestError("stream_options is only allowed when stream is true", param="stream_options")
        include_usage = _boolean(opts, "include_usage")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise RequestError("user must be a string", param="user")
    seed = _integer(body, "seed")

    return ChatRequest(
        messages=messages,
        request_id=request_id,
        model=model,
        tools=tools,
        tool_choice=tool_choice,
        thinking=thinking,
        reasoning_effort=effort,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=top_k or -1,
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        seed=seed,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, 2.0),
        stop=map_stop(body.get("stop")),
        n=n,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        response_format=map_response_format(body.get("response_format")),
        include_usage=include_usage,
        user=user,
    )


# --------------------------------------------------------------------------- logprobs


def logprobs_content(tokenizer: PromptTokenizer, logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content`` entries (token text, logprob, UTF-8 bytes, top alternatives)."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    out = []
    for lp in logprobs:
        item = entry(lp.token_id, lp.logprob)
        item["top_logprobs"] = [entry(t, p) for t, p in lp.top]
        out.append(item)
    return out


# --------------------------------------------------------------------------- streaming


_RANK = {ReasoningDelta: 0, ContentDelta: 1, ToolCallStart: 2, ToolCallArgumentsDelta: 2}


def events_to_deltas(events: Sequence[Any]) -> list[dict[str, Any]]:
    """Merge one engine chunk's events into as few OpenAI deltas as keep their order.

    Reasoning, content and tool calls share a delta only in that order; an event
    that would go back (content after a tool call) starts a new delta. Argument
    deltas of one call merge into a single ``tool_calls`` entry.
    """
    deltas: list[dict[str, Any]] = []
    delta: dict[str, Any] = {}
    rank = -1
    calls: list[dict[str, Any]] = []
    for ev in events:
        t = type(ev)
        r = _RANK.get(t)
        if r is None:
            continue  # ToolCallEnd: nothing to send in the OpenAI shape
        if r < rank:
            deltas.append(delta)
            delta, calls = {}, []
        rank = r
        if t is ContentDelta:
            delta["content"] = delta.get("content", "") + ev.text
        elif t is ReasoningDelta:
            delta["reasoning_content"] = delta.get("reasoning_content", "") + ev.text
        elif t is ToolCallStart:
            calls.append(
                {
                    "index": ev.index,
                    "id": ev.id,
                    "type": "function",
                    "function": {"name": ev.name, "arguments": ""},
                }
            )
            delta["tool_calls"] = calls
        else:  # ToolCallArgumentsDelta
            if calls and calls[-1]["index"] == ev.index:
                calls[-1]["function"]["arguments"] += ev.text
            else:
                calls.append({"index": ev.index, "function": {"arguments": ev.text}})
                delta["tool_calls"] = calls
    if delta:
        deltas.append(delta)
    return deltas


class ChunkWriter:
    """Serialises ``chat.completion.chunk`` events for one response.

    The envelope (id, created, model) is serialised once; each event costs one
    ``orjson.dumps`` of the delta.
    """

    __slots__ = ("_head", "_suffix", "_text_prefix", "_tokenizer", "model", "response_id")

    def __init__(
        self, response_id: str, created: int, model: str, tokenizer: PromptTokenizer | None = None
    ) -> None:
        self.response_id = response_id
        self.model = model
        self._tokenizer = tokenizer
        self._head = (
            b'data: {"id":'
            + orjson.dumps(response_id)
            + b',"object":"chat.completion.chunk","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
            + b',"system_fingerprint":null,"choices":'
        )
        self._suffix = b"}\n\n"
        # Fast path for the common event (one text delta): the bytes around the JSON string,
        # per choice index and field, built once per response.
        self._text_prefix: dict[tuple[int, type], bytes] = {}

    def _event(self, choices: bytes, usage: bytes | None = None) -> bytes:
        if usage is None:
            return self._head + choices + self._suffix
        return self._head + choices + b',"usage":' + usage + self._suffix

    def delta(
        self, index: int, delta: dict[str, Any], logprobs: Any = None, finish_reason: str | None = None
    ) -> bytes:
        choice: dict[str, Any] = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return self._event(orjson.dumps([choice]))

    def role(self, index: int) -> bytes:
        return self.delta(index, {"role": "assistant", "content": ""})

    def usage(self, usage: Usage) -> bytes:
        return self._event(b"[]", orjson.dumps(usage.to_openai()))

    def _text_event(self, index: int, kind: type, text: str) -> bytes:
        prefix = self._text_prefix.get((index, kind))
        if prefix is None:
            field = "content" if kind is ContentDelta else "reasoning_content"
            prefix = (
                self._head + b'[{"index":' + str(index).encode() + b',"delta":{"' + field.encode() + b'":'
            )
            self._text_prefix[(index, kind)] = prefix
        return prefix + orjson.dumps(text) + b'},"logprobs":null,"finish_reason":null}]}\n\n'

    def chunk(self, chunk: PipelineChunk) -> list[bytes]:
        """The SSE events for one pipeline chunk (usually exactly one)."""
        events = chunk.events
        if len(events) == 1 and chunk.end is None and not chunk.logprobs:
            ev = events[0]
            kind = type(ev)
            if kind is ContentDelta or kind is ReasoningDelta:
                return [self._text_event(chunk.index, kind, ev.text)]
        out: list[bytes] = []
        logprobs = None
        if chunk.logprobs and self._tokenizer is not None:
            logprobs = {"content": logprobs_content(self._tokenizer, chunk.logprobs)}
        for delta in events_to_deltas(chunk.events):
            out.append(self.delta(chunk.index, delta, logprobs))
            logprobs = None
        if logprobs is not None:
            out.append(self.delta(chunk.index, {}, logprobs))
        if chunk.end is not None:
            out.append(self.delta(chunk.index, {}, None, chunk.end.finish_reason))
        return out


async def stream_chat(
    state: FrontendState,
    req: ChatRequest,
    streams: Sequence[ChoiceStream],
    created: int,
    tracker: RequestTracker | None = None,
) -> AsyncIterator[bytes]:
    """The SSE body: role deltas, one event per engine chunk, finish, optional usage, ``[DONE]``.

    A failure mid-stream becomes one ``data: {"error": ...}`` event, then the stream ends.
    """
    writer = ChunkWriter(req.request_id, created, req.model, state.tokenizer if req.logprobs else None)
    usages: list[Usage] = []
    for s in streams:
        yield writer.role(s.index)
    try:
        # One choice: iterate it directly (one async-generator layer less per token).
        source = streams[0] if len(streams) == 1 else merge_choices(streams)
        async for chunk in source:
            if chunk.end is not None:
                usages.append(chunk.end.usage)
            events = writer.chunk(chunk)
            if len(events) == 1:
                yield events[0]
            else:
                yield b"".join(events)
    except Exception as exc:
        err, body = stream_error_body(exc)
        if tracker is not None:
            tracker.stream_error = err.error_type
        yield data_event(body)
        return
    if req.include_usage:
        yield writer.usage(Usage.combine(usages))
    state.metrics.prompt_tokens.inc(usages[0].prompt_tokens if usages else 0)
    yield DONE


def build_response(
    req: ChatRequest,
    accs: Sequence[ChoiceAccumulator],
    created: int,
    tokenizer: PromptTokenizer | None = None,
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    choices = []
    for acc in accs:
        message: dict[str, Any] = {"role": "assistant"}
        calls = acc.tool_calls
        content = acc.content
        message["content"] = content if content or not calls else None
        reasoning = acc.reasoning_content
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls
            ]
        logprobs = None
        if req.logprobs and tokenizer is not None:
            logprobs = {"content": logprobs_content(tokenizer, acc.logprobs)}
        choices.append(
            {"index": acc.index, "message": message, "logprobs": logprobs, "finish_reason": acc.finish_reason}
        )
    usage = Usage.combine([a.usage for a in accs])
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": created,
        "model": req.model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage.to_openai(),
    }


# --------------------------------------------------------------------------- endpoint


@api_route("/v1/chat/completions")
async def chat_completions(request: Request, tracker: RequestTracker) -> Response:
    """``POST /v1/chat/completions`` (stream and non-stream)."""
    state = get_state(request)
    body = await read_json(request, state.config.max_body_bytes)
    req = to_chat_request(body, state.config, tracker.request_id)
    pipeline = state.pipeline
    prepared = pipeline.prepare(req)
    # Await every choice's first engine chunk before committing to a status, so
    # a worker failure before the first token is still a proper error response.
    # (A long prefill can take seconds: a client that leaves meanwhile aborts it.)
    streams = await unless_disconnected(request, pipeline.start(prepared))
    if body.get("stream"):
        return EventStreamResponse(stream_chat(state, req, streams, prepared.created, tracker), tracker)
    accs = await unless_disconnected(request, collect(streams))
    state.metrics.prompt_tokens.inc(prepared.prompt_tokens)
    payload = build_response(req, accs, prepared.created, state.tokenizer if req.logprobs else None)
    return Response(orjson.dumps(payload), media_type="application/json")
