"""An OpenAI chat body validated and mapped onto a :class:`~deepseek_frontend.pipeline.ChatRequest`.

:func:`to_chat_request` is the whole mapping. Every rejection is a ``RequestError`` whose
``param`` names the field (``messages[2].content[0].type``) and whose message starts with it, so
clients can find what is wrong (validators: :mod:`..validation`). :func:`map_model`,
:func:`map_sampling`, :func:`map_stream` and :func:`requested_model` are the fields
``/v1/completions`` shares.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deepseek_frontend.api.adapters import length_controls
from deepseek_frontend.api.schemas import check_json_schema
from deepseek_frontend.api.validation import (
    check_array,
    check_boolean,
    check_integer,
    check_number,
    check_object,
    check_string,
    check_tool_name,
    json_type,
)
from deepseek_frontend.errors import RequestError
from deepseek_frontend.images import family_reads_images, make_image_part
from deepseek_frontend.pipeline.chat import MAX_N, MAX_TOP_LOGPROBS, ChatRequest
from deepseek_frontend.pipeline.request import DEFAULT_SCHEDULING, Scheduling

if TYPE_CHECKING:
    from deepseek_frontend.fleet.config import ServerConfig

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
        thinking = check_object(thinking, "thinking")
        kind = thinking.get("type")
        # a dict or list is no key of _THINKING_TYPES (and unhashable): test the type first
        if not isinstance(kind, str) or kind not in _THINKING_TYPES:
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


def map_response_format(raw: Any, max_tokens: int | None = None) -> dict[str, Any] | None:
    """``response_format``; a JSON schema's value must fit in ``max_tokens`` (the request's limit)."""
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
            schema = check_json_schema(
                spec["schema"], "response_format.json_schema.schema", max_tokens=max_tokens
            )
            spec = {**spec, "schema": schema}
        return {"type": "json_schema", "json_schema": spec}
    raise RequestError(
        f"response_format.type: expected 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="response_format.type",
    )


def map_model(body: Mapping[str, Any], config: ServerConfig) -> str:
    """``model`` resolved through the aliases (absent: the served model); unknown: ``ModelNotFoundError``."""
    return config.model.resolve_model(check_string(body.get("model"), "model", default=None))


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


def to_chat_request(
    body: dict[str, Any],
    config: ServerConfig,
    request_id: str,
    scheduling: Scheduling = DEFAULT_SCHEDULING,
) -> ChatRequest:
    """Validate an OpenAI chat body and map it onto a :class:`ChatRequest` (``scheduling``: the
    request's priority, service tier and deadline, which the edge resolved from ``service_tier``).

    Raises ``RequestError`` (400, ``param`` set) and ``ModelNotFoundError`` (404).
    """
    model = map_model(body, config)
    messages = map_messages(body.get("messages"), images=family_reads_images(config.model.family))
    tools = map_tools(body.get("tools"))
    tool_choice = map_tool_choice(body.get("tool_choice"), tools)
    thinking = resolve_thinking(body, config.model.default_thinking)
    effort = (
        resolve_reasoning_effort(body.get("reasoning_effort"), config.model.reasoning_effort_profile)
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
    max_tokens = max_completion_tokens if max_completion_tokens is not None else max_tokens
    return ChatRequest(
        messages=messages,
        request_id=request_id,
        model=model,
        tools=tools,
        tool_choice=tool_choice,
        thinking=thinking,
        reasoning_effort=effort,
        max_tokens=max_tokens,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        response_format=map_response_format(body.get("response_format"), max_tokens),
        include_usage=include_usage,
        user=check_string(body.get("user"), "user", default=None),
        requested_model=requested_model(body),
        scheduling=scheduling,
        **sampling,
    )
