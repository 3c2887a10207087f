"""``POST /v1/chat/completions``: OpenAI JSON <-> :class:`~deepseek_frontend.pipeline.ChatRequest`.

Three parts:

* :func:`to_chat_request` validates the body and maps it onto a ``ChatRequest``.
  Every rejection is a ``RequestError`` whose ``param`` names the field
  (``messages[2].content[0].type``) and whose message starts with it, so clients
  can find what is wrong (validators: :mod:`.validation`). :func:`map_model`,
  :func:`map_sampling` and :func:`map_stream` are the fields ``/v1/completions``
  shares.
* :class:`ChunkWriter` turns pipeline chunks into ``chat.completion.chunk`` SSE
  events: one event per engine chunk (events of one chunk are merged into one
  delta where the OpenAI shape keeps their order), built from pre-serialised
  byte templates so the per-token cost is one small ``orjson.dumps``.
  :func:`openai_event_stream` is the body around the writer (opening events,
  in-band error, usage, ``[DONE]``) that completions uses too.
* :func:`build_response` is the non-streaming ``chat.completion``, folded from
  the same chunks; :func:`respond_with_choices` picks stream or answer for both
  OpenAI endpoints.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from deepseek_frontend.errors import RequestError
from deepseek_frontend.images import family_reads_images, make_image_part, resolve_request_images
from deepseek_frontend.parsing import ContentDelta, ReasoningDelta, ToolCallArgumentsDelta, ToolCallStart
from deepseek_frontend.pipeline.chat import (
    MAX_N,
    MAX_TOP_LOGPROBS,
    ChatRequest,
    ChoiceAccumulator,
    ChoiceStream,
    PipelineChunk,
    PreparedRequest,
    Usage,
    collect,
    merge_choices,
)

from ..adapters import length_controls
from ..continuity import continuity_of
from ..http import (
    EventStreamResponse,
    RequestTracker,
    api_route,
    get_state,
    read_json,
    served_model,
    stream_error_body,
    unless_disconnected,
)
from ..schemas import check_json_schema
from ..sse import DONE, data_event
from ..validation import (
    check_array,
    check_boolean,
    check_integer,
    check_number,
    check_object,
    check_string,
    check_tool_name,
    json_type,
)

if TYPE_CHECKING:
    from deepseek_frontend.engines.base import TokenLogprob
    from deepseek_frontend.tokenization import PromptTokenizer

    from ..config import ServerConfig
    from ..served_model import ServedModel

#: Most stop strings a request may set.
MAX_STOP = 16
_ROLES = ("system", "user", "assistant", "tool", "developer")
_IMAGE_PARTS = ("image_url", "input_image", "image", "input_audio", "file")
_THINKING_TYPES = {"enabled": True, "disabled": False}
#: Sampling numbers chat and completions accept: field -> (minimum, maximum, default).
_SAMPLING_NUMBERS: dict[str, tuple[float, float, float]] = {
    "temperature": (0.0, 2.0, 1.0),
    "top_p": (0.0, 1.0, 1.0),
    "min_p": (0.0, 1.0, 0.0),
    "presence_penalty": (-2.0, 2.0, 0.0),
    "frequency_penalty": (-2.0, 2.0, 0.0),
    "repetition_penalty": (0.0, 2.0, 1.0),
}


# --------------------------------------------------------------------------- request mapping


def _text_content(content: Any, path: str, *, allow_none: bool, images: bool = False) -> str | list[Any]:
    """String content, or text parts joined by a blank line (as DeepSeek's reference, vLLM and the
    Anthropic / Responses adapters join them).

    With ``images`` (the model reads images: V4.1) and ``image_url`` parts the content stays a
    list: ``{"type": "text"}`` dicts and unresolved image parts (``images.py``) in order, which
    the images resolver and the V4.1 format read. Without, an image part is a 400 naming it.
    """
    if content is None:
        if allow_none:
            return ""
        raise RequestError(f"{path}: required", param=path)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(
            f"{path}: expected a string or an array of content parts, got {json_type(content)}", param=path
        )
    texts: list[str] = []
    parts: list[Any] = []
    has_image = False
    for j, part in enumerate(content):
        ppath = f"{path}[{j}]"
        if isinstance(part, str):
            texts.append(part)
            parts.append({"type": "text", "text": part})
            continue
        part = check_object(part, ppath)
        ptype = part.get("type")
        if ptype in ("text", "input_text", "output_text"):
            texts.append(check_string(part.get("text"), f"{ppath}.text"))
            parts.append({"type": "text", "text": texts[-1]})
        elif ptype == "image_url" and images:
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, dict) else image_url
            url = check_string(url, f"{ppath}.image_url.url", non_empty=True)
            parts.append(make_image_part(url, ppath))
            has_image = True
        elif ptype in _IMAGE_PARTS:
            why = (
                "only text and image_url parts are read"
                if images
                else "this model reads text only (images are not supported; DeepSeek-V4.1 reads them)"
            )
            raise RequestError(f"{ppath}.type: {ptype} parts are not supported: {why}", param=f"{ppath}.type")
        else:
            raise RequestError(
                f"{ppath}.type: {ptype!r} is not a supported content part type", param=f"{ppath}.type"
            )
    return parts if has_image else "\n\n".join(texts)


def _function(holder: Mapping[str, Any], path: str) -> tuple[Mapping[str, Any], str]:
    """``holder["function"]`` (an object) and its name (a non-empty string)."""
    fn = check_object(holder.get("function"), f"{path}.function")
    return fn, check_string(fn.get("name"), f"{path}.function.name", non_empty=True)


def _tool_calls(raw: Any, path: str) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for k, call in enumerate(check_array(raw, path)):
        cpath = f"{path}[{k}]"
        call = check_object(call, cpath)
        fn, name = _function(call, cpath)
        args = fn.get("arguments", "{}")
        if isinstance(args, dict):
            # Some clients send the object itself; the formats take a JSON string.
            args = json.dumps(args, ensure_ascii=False)
        elif args is None:
            args = "{}"
        elif not isinstance(args, str):
            raise RequestError(
                f"{cpath}.function.arguments: expected a JSON string, got {json_type(args)}",
                param=f"{cpath}.function.arguments",
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


def map_messages(raw: Any, *, images: bool = False) -> list[dict[str, Any]]:
    """OpenAI ``messages`` -> the formats' message dicts (string content, JSON-string arguments).

    ``images``: the model reads images, so ``image_url`` parts are kept (see :func:`_text_content`).
    """
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(check_array(raw, "messages", non_empty=True)):
        path = f"messages[{i}]"
        msg = check_object(msg, path)
        role = msg.get("role")
        if role not in _ROLES:
            raise RequestError(
                f"{path}.role: expected one of {', '.join(_ROLES)}; got {role!r}", param=f"{path}.role"
            )
        if role == "assistant":
            m: dict[str, Any] = {
                "role": "assistant",
                "content": _text_content(msg.get("content"), f"{path}.content", allow_none=True),
            }
            reasoning = msg.get("reasoning_content", msg.get("reasoning"))
            if reasoning is not None:
                m["reasoning_content"] = check_string(reasoning, f"{path}.reasoning_content")
            if msg.get("tool_calls"):
                m["tool_calls"] = _tool_calls(msg["tool_calls"], f"{path}.tool_calls")
        elif role == "tool":
            m = {
                "role": "tool",
                "content": _text_content(
                    msg.get("content"), f"{path}.content", allow_none=True, images=images
                ),
                "tool_call_id": check_string(msg.get("tool_call_id"), f"{path}.tool_call_id", default=None)
                or "",
            }
        else:
            m = {
                "role": role,
                "content": _text_content(
                    msg.get("content"), f"{path}.content", allow_none=False, images=images
                ),
            }
        out.append(m)
    return out


def map_tools(raw: Any) -> list[dict[str, Any]] | None:
    """Validate an OpenAI ``tools`` array (function tools only)."""
    if raw is None:
        return None
    tools: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(check_array(raw, "tools")):
        path = f"tools[{i}]"
        tool = check_object(tool, path)
        if tool.get("type", "function") != "function":
            raise RequestError(
                f"{path}.type: expected 'function', got {tool.get('type')!r}", param=f"{path}.type"
            )
        fn, name = _function(tool, path)
        if name in seen:
            raise RequestError(
                f"{path}.function.name: {name!r} is declared twice", param=f"{path}.function.name"
            )
        seen.add(name)
        if fn.get("parameters") is not None:
            # validated before anything builds a prompt section or a grammar from it
            schema = check_json_schema(fn["parameters"], f"{path}.function.parameters", object_root=True)
            fn = {**fn, "parameters": schema}
        tools.append({"type": "function", "function": fn})
    return tools or None


def map_tool_choice(raw: Any, tools: Sequence[dict[str, Any]] | None) -> Any:
    """``none``/``auto``/``required``/named; a named tool must be declared."""
    if raw is None:
        return "auto"
    if raw in ("none", "auto", "required"):
        if raw == "required" and not tools:
            raise RequestError(
                "tool_choice: 'required' needs at least one tool in 'tools'", param="tool_choice"
            )
        return raw
    if isinstance(raw, dict) and raw.get("type") == "function":
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        return check_tool_name(name, "tool_choice.function.name", tools)
    raise RequestError(
        "tool_choice: expected 'none', 'auto', 'required' or "
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
                f"thinking.type: expected 'enabled' or 'disabled', got {kind!r}", param="thinking.type"
            )
        return _THINKING_TYPES[kind]
    kwargs = check_object(body.get("chat_template_kwargs"), "chat_template_kwargs", default=None)
    if kwargs is not None:
        for key in ("thinking", "enable_thinking"):
            if key in kwargs:
                return check_boolean(kwargs[key], f"chat_template_kwargs.{key}")
    if body.get("reasoning_effort") == "none":
        return False
    return default


def resolve_reasoning_effort(raw: Any, profile: str) -> str | int | None:
    """Normalize an effort word or budget 1-100 (or its absence) for the checkpoint's profile.

    An absent effort still goes through the table: the official profile renders its
    default ("high", as DeepSeek's API does) rather than the encoder's bare default.
    A number (the request body's ``reasoning_effort: 42``) is DeepSeek-V4.1's budget.
    """
    if not (isinstance(raw, int) and not isinstance(raw, bool)):
        raw = check_string(raw, "reasoning_effort", default=None)
    from deepseek_frontend.formats import normalize_reasoning_effort

    try:
        return normalize_reasoning_effort(raw, profile)
    except RequestError as exc:
        exc.param = exc.param or "reasoning_effort"
        raise
    except (ValueError, KeyError) as exc:
        raise RequestError(
            f"reasoning_effort: {raw!r} is not supported: {exc}", param="reasoning_effort"
        ) from None


def map_stop(raw: Any) -> tuple[str, ...]:
    """``stop``: one string or up to :data:`MAX_STOP` strings; empty strings are dropped."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,) if raw else ()
    if not isinstance(raw, list) or not all(isinstance(s, str) for s in raw):
        raise RequestError("stop: expected a string or an array of strings", param="stop")
    if len(raw) > MAX_STOP:
        raise RequestError(f"stop: at most {MAX_STOP} strings are allowed, got {len(raw)}", param="stop")
    return tuple(s for s in raw if s)


def map_response_format(raw: Any) -> dict[str, Any] | None:
    raw = check_object(raw, "response_format", default=None)
    kind = None if raw is None else raw.get("type")
    if raw is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise RequestError(
                "response_format.json_schema: expected an object with a 'schema' object",
                param="response_format.json_schema",
            )
        if "schema" in spec:
            spec = {**spec, "schema": check_json_schema(spec["schema"], "response_format.json_schema.schema")}
        return {"type": "json_schema", "json_schema": spec}
    raise RequestError(
        f"response_format.type: expected 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="response_format.type",
    )


def map_model(body: Mapping[str, Any], config: ServerConfig) -> str:
    """``model`` resolved through the aliases (absent: the served model); unknown: ``ModelNotFoundError``."""
    return config.resolve_model(check_string(body.get("model"), "model", default=None))


def map_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling fields chat and completions share, as :class:`ChatRequest` keyword arguments."""
    out: dict[str, Any] = {
        key: check_number(body.get(key), key, minimum=low, maximum=high, default=default)
        for key, (low, high, default) in _SAMPLING_NUMBERS.items()
    }
    out["top_k"] = check_integer(body.get("top_k"), "top_k", minimum=-1, default=None) or -1
    out["seed"] = check_integer(body.get("seed"), "seed", default=None)
    out["stop"] = map_stop(body.get("stop"))
    out["n"] = check_integer(body.get("n"), "n", minimum=1, maximum=MAX_N, default=None) or 1
    out["ignore_eos"], out["min_tokens"] = length_controls(body)
    return out


def requested_model(body: Mapping[str, Any]) -> str | None:
    """The ``model`` string the client sent (echoed in responses), or None when it sent none."""
    model = body.get("model")
    return model if isinstance(model, str) and model else None


def map_stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    """``(stream, include_usage)`` from ``stream`` and ``stream_options`` (only with a stream)."""
    stream = check_boolean(body.get("stream"), "stream", default=False)
    opts = check_object(body.get("stream_options"), "stream_options", default=None)
    if opts is None:
        return stream, False
    if not stream:
        raise RequestError("stream_options: only allowed when stream is true", param="stream_options")
    return stream, check_boolean(opts.get("include_usage"), "stream_options.include_usage", default=False)


def to_chat_request(body: dict[str, Any], config: ServerConfig, request_id: str) -> ChatRequest:
    """Validate an OpenAI chat body and map it onto a :class:`ChatRequest`.

    Raises ``RequestError`` (400, ``param`` set) and ``ModelNotFoundError`` (404).
    """
    model = map_model(body, config)
    messages = map_messages(body.get("messages"), images=family_reads_images(config.family))
    tools = map_tools(body.get("tools"))
    tool_choice = map_tool_choice(body.get("tool_choice"), tools)
    thinking = resolve_thinking(body, config.default_thinking)
    effort = (
        resolve_reasoning_effort(body.get("reasoning_effort"), config.reasoning_effort_profile)
        if thinking
        else None
    )
    # max_completion_tokens wins; max_tokens is still validated when both are sent.
    max_completion_tokens = check_integer(
        body.get("max_completion_tokens"), "max_completion_tokens", minimum=1, default=None
    )
    max_tokens = check_integer(body.get("max_tokens"), "max_tokens", minimum=1, default=None)
    sampling = map_sampling(body)
    logprobs = check_boolean(body.get("logprobs"), "logprobs", default=False)
    top_logprobs = check_integer(
        body.get("top_logprobs"), "top_logprobs", minimum=0, maximum=MAX_TOP_LOGPROBS, default=0
    )
    if top_logprobs and not logprobs:
        raise RequestError("top_logprobs: requires logprobs to be true", param="top_logprobs")
    _, include_usage = map_stream(body)
    return ChatRequest(
        messages=messages,
        request_id=request_id,
        model=model,
        tools=tools,
        tool_choice=tool_choice,
        thinking=thinking,
        reasoning_effort=effort,
        max_tokens=max_completion_tokens if max_completion_tokens is not None else max_tokens,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        response_format=map_response_format(body.get("response_format")),
        include_usage=include_usage,
        user=check_string(body.get("user"), "user", default=None),
        requested_model=requested_model(body),
        **sampling,
    )


# --------------------------------------------------------------------------- logprobs


def logprobs_content(
    tokenizer: PromptTokenizer, logprobs: Sequence[TokenLogprob], top_logprobs: int | None = None
) -> list[dict[str, Any]]:
    """OpenAI ``logprobs.content`` entries (token text, logprob, UTF-8 bytes, top alternatives).

    ``logprobs`` are the answer tokens only (the pipeline leaves out reasoning, markup and
    EOS); each entry lists at most ``top_logprobs`` alternatives (engines may send more:
    vLLM always returns at least one).
    """

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    out = []
    for lp in logprobs:
        item = entry(lp.token_id, lp.logprob)
        top = lp.top if top_logprobs is None else lp.top[:top_logprobs]
        item["top_logprobs"] = [entry(t, p) for t, p in top]
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

    __slots__ = ("_head", "_suffix", "_text_prefix", "_tokenizer", "_top_logprobs", "model", "response_id")

    def __init__(
        self,
        response_id: str,
        created: int,
        model: str,
        tokenizer: PromptTokenizer | None = None,
        top_logprobs: int | None = None,
    ) -> None:
        self.response_id = response_id
        self.model = model
        self._tokenizer = tokenizer
        self._top_logprobs = top_logprobs
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
            logprobs = {"content": logprobs_content(self._tokenizer, chunk.logprobs, self._top_logprobs)}
        for delta in events_to_deltas(chunk.events):
            out.append(self.delta(chunk.index, delta, logprobs))
            logprobs = None
        if logprobs is not None:
            out.append(self.delta(chunk.index, {}, logprobs))
        if chunk.end is not None:
            out.append(self.delta(chunk.index, {}, None, chunk.end.finish_reason))
        return out


async def openai_event_stream(
    model: ServedModel,
    req: ChatRequest,
    streams: Sequence[ChoiceStream],
    tracker: RequestTracker | None,
    *,
    opening: Sequence[bytes],
    encode: Callable[[PipelineChunk], list[bytes]],
    usage_event: Callable[[Usage], bytes],
) -> AsyncIterator[bytes]:
    """The SSE body of both OpenAI endpoints (chat and completions).

    ``opening`` events, then ``encode(chunk)`` for each engine chunk (usually one
    event), then -- with ``stream_options.include_usage`` -- one usage event, then
    ``[DONE]``. A failure mid-stream becomes one ``data: {"error": ...}`` event and
    the stream ends there.
    """
    usages: list[Usage] = []
    for event in opening:
        yield event
    try:
        # One choice: iterate it directly (one async-generator layer less per token).
        source = streams[0] if len(streams) == 1 else merge_choices(streams)
        async for chunk in source:
            if chunk.end is not None:
                usages.append(chunk.end.usage)
            events = encode(chunk)
            if len(events) == 1:
                yield events[0]
            elif events:
                yield b"".join(events)
    except Exception as exc:
        err, body = stream_error_body(exc)
        if tracker is not None:
            tracker.stream_error = err.error_type
        yield data_event(body)
        return
    if req.include_usage:
        yield usage_event(Usage.combine(usages))
    model.metrics.prompt_tokens.inc(usages[0].prompt_tokens if usages else 0)
    yield DONE


def stream_chat(
    model: ServedModel,
    req: ChatRequest,
    streams: Sequence[ChoiceStream],
    created: int,
    tracker: RequestTracker | None = None,
) -> AsyncIterator[bytes]:
    """The ``chat.completion.chunk`` SSE body: role deltas, one event per engine chunk, finish,
    optional usage, ``[DONE]`` (see :func:`openai_event_stream`)."""
    writer = ChunkWriter(
        req.request_id,
        created,
        req.response_model,
        model.tokenizer if req.logprobs else None,
        req.top_logprobs,
    )
    return openai_event_stream(
        model,
        req,
        streams,
        tracker,
        opening=[writer.role(s.index) for s in streams],
        encode=writer.chunk,
        usage_event=writer.usage,
    )


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
            logprobs = {"content": logprobs_content(tokenizer, acc.logprobs, req.top_logprobs)}
        choices.append(
            {"index": acc.index, "message": message, "logprobs": logprobs, "finish_reason": acc.finish_reason}
        )
    usage = Usage.combine([a.usage for a in accs])
    return {
        "id": req.request_id,
        "object": "chat.completion",
        "created": created,
        "model": req.response_model,
        "system_fingerprint": None,
        "choices": choices,
        "usage": usage.to_openai(),
    }


# --------------------------------------------------------------------------- endpoint


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
