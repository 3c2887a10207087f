"""Anthropic Messages requests -> the pipeline's OpenAI-style chat request.

DeepSeek's chat formats take OpenAI-style message dicts (see ``formats/``), so a
Messages request is translated into exactly what a Chat Completions request
would carry -- messages, OpenAI function tools, an OpenAI ``tool_choice``,
thinking on/off and sampling -- and then runs through the same pipeline.

Translation rules (each one is pinned by a test in ``tests/api_anthropic``):

* ``system`` (a string or text blocks) becomes one leading system message; the
  blocks are joined with a blank line, as DeepSeek's own converter does.
* ``thinking`` blocks of an assistant turn become that turn's
  ``reasoning_content`` (several blocks are concatenated). Their ``signature`` is
  ignored: reasoning is re-rendered from its text, so there is nothing a
  signature could protect. ``redacted_thinking`` blocks carry no text we could
  render and are dropped.
* ``tool_use`` blocks become OpenAI ``tool_calls`` of that assistant turn, with
  ``arguments`` serialised as ``json.dumps(input, ensure_ascii=False)``.
* ``tool_result`` blocks of a user turn become ``tool`` messages, in block
  order, placed before the user's remaining text (Anthropic requires results to
  come first, and DeepSeek's format renders them at the start of the turn).
  A result with ``is_error: true`` is prefixed with :data:`TOOL_ERROR_PREFIX`
  so the model can tell a failed call from a successful one. Result content is a
  string or text blocks (joined with a blank line).
* ``tool_choice``: ``auto`` -> ``"auto"``, ``any`` -> ``"required"``,
  ``tool`` -> ``{"type": "function", "function": {"name": ...}}``,
  ``none`` -> ``"none"``; ``disable_parallel_tool_use`` -> ``parallel_tool_calls=False``.
* ``thinking: {"type": "enabled"|"adaptive"}`` turns thinking on,
  ``{"type": "disabled"}`` off; absent leaves the server default.
  ``budget_tokens`` is validated but not enforced (DeepSeek has no thinking
  budget; ``output_config.effort`` selects a reasoning effort instead).
* Images, documents and server tools are rejected (DeepSeek-V4 is a text model
  and the frontend runs no server-side tools) -- except an image inside a
  ``tool_result``, which becomes :data:`IMAGE_PLACEHOLDER`: an agent whose tool
  returned a screenshot would otherwise fail on every later request of the
  session, since the image stays in its history. ``cache_control`` and
  ``citations`` are accepted and ignored. Unknown top-level fields are ignored so
  new agent releases keep working.
* The last message must be a user message: assistant prefill is refused, since
  DeepSeek's format always opens a new assistant turn after the last message.

The result is a :class:`ConvertedChat` (shared with ``responses_convert``);
:func:`to_chat_request` then fills the server's defaults (model alias, thinking
default, effort profile) into the pipeline's ``ChatRequest``.

Every error is a :class:`~deepseek_frontend.errors.RequestError` whose ``param``
points at the offending field, e.g. ``messages[2].content[1].tool_use_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deepseek_frontend.errors import RequestError, UnsupportedFeatureError

if TYPE_CHECKING:
    from deepseek_frontend.api.config import ServerConfig
    from deepseek_frontend.api.pipeline import ChatRequest

__all__ = [
    "IMAGE_PLACEHOLDER",
    "TOOL_ERROR_PREFIX",
    "ConvertedChat",
    "convert_messages_request",
    "to_chat_request",
]

#: Prefix of a ``tool_result`` with ``is_error: true`` as the model sees it.
TOOL_ERROR_PREFIX = "Error: "

#: What the model reads in place of an image inside a tool result.
IMAGE_PLACEHOLDER = "[image omitted: this model reads text only]"

#: ``output_config.effort`` words Anthropic defines; passed on as a reasoning effort.
_EFFORT_WORDS = ("low", "medium", "high", "max")

_ChatMessage = dict[str, Any]


@dataclass(slots=True)
class ConvertedChat:
    """A protocol request translated into the chat pipeline's terms.

    ``messages`` are OpenAI-style dicts as ``formats/`` takes them; ``tools`` are
    OpenAI function tools (``None`` when the request declares none); ``tool_choice``
    is in OpenAI form. ``None`` in any optional field means "not set by the client:
    use the server default".
    """

    model: str
    messages: list[_ChatMessage]
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


# --------------------------------------------------------------------------- field helpers


def _require_object(value: Any, param: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RequestError(f"{param}: expected an object, got {_kind(value)}", param=param)
    return value


def _require_list(value: Any, param: str) -> list[Any]:
    if not isinstance(value, list):
        raise RequestError(f"{param}: expected an array, got {_kind(value)}", param=param)
    return value


def _require_str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise RequestError(f"{param}: expected a string, got {_kind(value)}", param=param)
    return value


def _optional_number(body: Mapping[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int subclass; true/false is never a valid sampling value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{key}: expected a number, got {_kind(value)}", param=key)
    if not low <= value <= high:
        raise RequestError(f"{key}: must be between {low:g} and {high:g}, got {value}", param=key)
    return float(value)


def _positive_int(value: Any, param: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{param}: expected an integer, got {_kind(value)}", param=param)
    if value < minimum:
        raise RequestError(f"{param}: must be at least {minimum}, got {value}", param=param)
    return value


def _kind(value: Any) -> str:
    """JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _block_type(block: Any, param: str) -> str:
    block = _require_object(block, param)
    block_type = block.get("type")
    if not isinstance(block_type, str):
        raise RequestError(f"{param}.type: every content block needs a string type", param=f"{param}.type")
    return block_type


def _unsupported_block(block_type: str, param: str) -> UnsupportedFeatureError:
    if block_type in ("image", "document", "search_result", "container_upload"):
        why = "this model accepts text only"
    elif block_type in ("server_tool_use", "web_search_tool_result", "web_fetch_tool_result"):
        why = "this server runs no server-side tools"
    else:
        why = "unknown content block type"
    return UnsupportedFeatureError(
        f"{param}: content block type {block_type!r} is not supported ({why})", param=f"{param}.type"
    )


# --------------------------------------------------------------------------- content


def _text_of_blocks(content: Any, param: str, *, what: str, image_placeholder: bool = False) -> str:
    """Text of a string or a list of ``text`` blocks, blocks joined by a blank line.

    With ``image_placeholder`` an ``image`` block becomes :data:`IMAGE_PLACEHOLDER`
    instead of an error (used for tool results, see the module docstring).
    """
    if isinstance(content, str):
        return content
    blocks = _require_list(content, param)
    texts: list[str] = []
    for i, block in enumerate(blocks):
        bparam = f"{param}[{i}]"
        block_type = _block_type(block, bparam)
        if block_type == "image" and image_placeholder:
            texts.append(IMAGE_PLACEHOLDER)
            continue
        if block_type != "text":
            if block_type in ("image", "document"):
                raise _unsupported_block(block_type, bparam)
            raise RequestError(
                f"{bparam}: {what} takes only text blocks, got {block_type!r}", param=f"{bparam}.type"
            )
        texts.append(_require_str(block.get("text"), f"{bparam}.text"))
    return "\n\n".join(texts)


def _convert_system(system: Any) -> str | None:
    if system is None:
        return None
    text = _text_of_blocks(system, "system", what="system")
    return text if text else None


def _tool_result_message(block: Mapping[str, Any], param: str, known_ids: Mapping[str, int]) -> _ChatMessage:
    tool_use_id = _require_str(block.get("tool_use_id"), f"{param}.tool_use_id")
    if tool_use_id not in known_ids:
        raise RequestError(
            f"{param}.tool_use_id: {tool_use_id!r} does not match any tool_use block of the preceding "
            "assistant message",
            param=f"{param}.tool_use_id",
        )
    content = block.get("content", "")
    text = (
        ""
        if content is None
        else _text_of_blocks(content, f"{param}.content", what="tool_result content", image_placeholder=True)
    )
    is_error = block.get("is_error", False)
    if not isinstance(is_error, bool):
        raise RequestError(f"{param}.is_error: expected a boolean", param=f"{param}.is_error")
    if is_error:
        text = TOOL_ERROR_PREFIX + text
    return {"role": "tool", "tool_call_id": tool_use_id, "content": text}


def _convert_user(content: Any, param: str, pending_tool_ids: Mapping[str, int]) -> list[_ChatMessage]:
    """One user message -> tool messages (in block order) then one user message with the text."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    blocks = _require_list(content, param)
    tool_messages: list[_ChatMessage] = []
    texts: list[str] = []
    for i, block in enumerate(blocks):
        bparam = f"{param}[{i}]"
        block_type = _block_type(block, bparam)
        if block_type == "text":
            texts.append(_require_str(block.get("text"), f"{bparam}.text"))
        elif block_type == "tool_result":
            tool_messages.append(_tool_result_message(block, bparam, pending_tool_ids))
        elif block_type in ("thinking", "redacted_thinking", "tool_use"):
            raise RequestError(
                f"{bparam}: {block_type!r} blocks belong to assistant messages", param=f"{bparam}.type"
            )
        else:
            raise _unsupported_block(block_type, bparam)
    out = tool_messages
    # A user turn made only of tool results has no user text to render.
    if texts or not tool_messages:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _convert_assistant(content: Any, param: str) -> tuple[_ChatMessage, dict[str, int]]:
    """One assistant message -> one OpenAI assistant message, plus its tool_use ids."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}, {}
    blocks = _require_list(content, param)
    texts: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    ids: dict[str, int] = {}
    for i, block in enumerate(blocks):
        bparam = f"{param}[{i}]"
        block_type = _block_type(block, bparam)
        if block_type == "text":
            texts.append(_require_str(block.get("text"), f"{bparam}.text"))
        elif block_type == "thinking":
            reasoning.append(_require_str(block.get("thinking"), f"{bparam}.thinking"))
        elif block_type == "redacted_thinking":
            continue  # encrypted reasoning from another provider: nothing we can render
        elif block_type == "tool_use":
            call_id = _require_str(block.get("id"), f"{bparam}.id")
            if not call_id:
                raise RequestError(f"{bparam}.id: must not be empty", param=f"{bparam}.id")
            if call_id in ids:
                raise RequestError(f"{bparam}.id: duplicate tool_use id {call_id!r}", param=f"{bparam}.id")
            name = _require_str(block.get("name"), f"{bparam}.name")
            tool_input = _require_object(block.get("input"), f"{bparam}.input")
            ids[call_id] = len(tool_calls)
            tool_calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(tool_input, ensure_ascii=False)},
                }
            )
        elif block_type == "tool_result":
            raise RequestError(
                f"{bparam}: tool_result blocks belong to user messages", param=f"{bparam}.type"
            )
        else:
            raise _unsupported_block(block_type, bparam)
    message: _ChatMessage = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message, ids


def _convert_messages(raw: Any) -> list[_ChatMessage]:
    messages = _require_list(raw, "messages")
    if not messages:
        raise RequestError("messages: at least one message is required", param="messages")
    out: list[_ChatMessage] = []
    pending_tool_ids: dict[str, int] = {}
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        message = _require_object(message, param)
        role = message.get("role")
        if "content" not in message:
            raise RequestError(f"{param}.content: required", param=f"{param}.content")
        content = message["content"]
        if role == "user":
            out.extend(_convert_user(content, f"{param}.content", pending_tool_ids))
            pending_tool_ids = {}
        elif role == "assistant":
            converted, pending_tool_ids = _convert_assistant(content, f"{param}.content")
            out.append(converted)
        else:
            raise RequestError(
                f"{param}.role: expected 'user' or 'assistant', got {role!r} (system text goes in 'system')",
                param=f"{param}.role",
            )
    if out[-1]["role"] == "assistant":
        # Prefill (continuing a partial assistant turn) would need the renderer to
        # leave the turn open; DeepSeek's chat format always starts a new one.
        raise UnsupportedFeatureError(
            f"messages[{len(messages) - 1}]: the last message must be a user message "
            "(assistant prefill is not supported)",
            param=f"messages[{len(messages) - 1}].role",
        )
    return out


# --------------------------------------------------------------------------- tools


def _convert_tools(raw: Any) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    tools = _require_list(raw, "tools")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        tool = _require_object(tool, param)
        tool_type = tool.get("type")
        if tool_type not in (None, "custom"):
            raise UnsupportedFeatureError(
                f"{param}.type: tool type {tool_type!r} is not supported; declare client tools with "
                "name, description and input_schema",
                param=f"{param}.type",
            )
        name = _require_str(tool.get("name"), f"{param}.name")
        if not name:
            raise RequestError(f"{param}.name: must not be empty", param=f"{param}.name")
        if name in seen:
            raise RequestError(f"{param}.name: duplicate tool name {name!r}", param=f"{param}.name")
        seen.add(name)
        schema = _require_object(tool.get("input_schema"), f"{param}.input_schema")
        function: dict[str, Any] = {"name": name}
        description = tool.get("description")
        if description is not None:
            function["description"] = _require_str(description, f"{param}.description")
        function["parameters"] = dict(schema)
        out.append({"type": "function", "function": function})
    return out or None


def _convert_tool_choice(
    raw: Any, tools: list[dict[str, Any]] | None
) -> tuple[str | dict[str, Any] | None, bool | None]:
    """``tool_choice`` -> (OpenAI tool_choice, parallel_tool_calls)."""
    if raw is None:
        return None, None
    choice = _require_object(raw, "tool_choice")
    kind = choice.get("type")
    parallel: bool | None = None
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise RequestError(
                "tool_choice.disable_parallel_tool_use: expected a boolean",
                param="tool_choice.disable_parallel_tool_use",
            )
        parallel = not disable
    if kind == "auto":
        return "auto", parallel
    if kind == "none":
        return "none", parallel
    if kind not in ("any", "tool"):
        raise RequestError(
            f"tool_choice.type: expected 'auto', 'any', 'tool' or 'none', got {kind!r}",
            param="tool_choice.type",
        )
    if not tools:
        raise RequestError(f"tool_choice: type {kind!r} requires tools", param="tool_choice")
    if kind == "any":
        return "required", parallel
    name = _require_str(choice.get("name"), "tool_choice.name")
    if name not in {t["function"]["name"] for t in tools}:
        raise RequestError(f"tool_choice.name: no tool named {name!r} is declared", param="tool_choice.name")
    return {"type": "function", "function": {"name": name}}, parallel


# --------------------------------------------------------------------------- thinking, sampling


def _convert_thinking(raw: Any) -> bool | None:
    if raw is None:
        return None
    thinking = _require_object(raw, "thinking")
    kind = thinking.get("type")
    if kind == "disabled":
        return False
    if kind not in ("enabled", "adaptive"):
        raise RequestError(
            f"thinking.type: expected 'enabled', 'adaptive' or 'disabled', got {kind!r}",
            param="thinking.type",
        )
    budget = thinking.get("budget_tokens")
    if budget is not None:
        # Validated for the client's sake; DeepSeek's thinking has no token budget to set.
        _positive_int(budget, "thinking.budget_tokens")
    elif kind == "enabled":
        raise RequestError(
            "thinking.budget_tokens: required when thinking is enabled", param="thinking.budget_tokens"
        )
    return True


def _convert_effort(body: Mapping[str, Any]) -> str | None:
    config = body.get("output_config")
    if config is None:
        return None
    config = _require_object(config, "output_config")
    effort = config.get("effort")
    if effort is None:
        return None
    if effort not in _EFFORT_WORDS:
        raise RequestError(
            f"output_config.effort: expected one of {', '.join(_EFFORT_WORDS)}, got {effort!r}",
            param="output_config.effort",
        )
    return str(effort)


def _convert_stop(raw: Any) -> list[str]:
    if raw is None:
        return []
    stops = _require_list(raw, "stop_sequences")
    out: list[str] = []
    for i, stop in enumerate(stops):
        text = _require_str(stop, f"stop_sequences[{i}]")
        if not text:
            raise RequestError(f"stop_sequences[{i}]: must not be empty", param=f"stop_sequences[{i}]")
        out.append(text)
    return out


def convert_messages_request(body: Any, *, require_max_tokens: bool = True) -> ConvertedChat:
    """Validate an Anthropic Messages request body and translate it.

    ``require_max_tokens=False`` is for ``/v1/messages/count_tokens``, whose body
    has no ``max_tokens``. Raises :class:`RequestError` (``param`` set) on any
    invalid field and :class:`UnsupportedFeatureError` for valid features this
    server does not offer (images, server tools, assistant prefill).
    """
    body = _require_object(body, "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("model: required (a non-empty string)", param="model")

    max_tokens: int | None = None
    if require_max_tokens or body.get("max_tokens") is not None:
        if body.get("max_tokens") is None:
            raise RequestError("max_tokens: required", param="max_tokens")
        max_tokens = _positive_int(body["max_tokens"], "max_tokens")

    messages = _convert_messages(body.get("messages"))
    system = _convert_system(body.get("system"))
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})

    tools = _convert_tools(body.get("tools"))
    tool_choice, parallel = _convert_tool_choice(body.get("tool_choice"), tools)

    top_k = body.get("top_k")
    if top_k is not None:
        top_k = _positive_int(top_k, "top_k")

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError("stream: expected a boolean", param="stream")

    user: str | None = None
    metadata = body.get("metadata")
    if metadata is not None:
        metadata = _require_object(metadata, "metadata")
        user_id = metadata.get("user_id")
        if user_id is not None:
            user = _require_str(user_id, "metadata.user_id")

    return ConvertedChat(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        thinking=_convert_thinking(body.get("thinking")),
        reasoning_effort=_convert_effort(body),
        stop=_convert_stop(body.get("stop_sequences")),
        temperature=_optional_number(body, "temperature", 0.0, 1.0),
        top_p=_optional_number(body, "top_p", 0.0, 1.0),
        top_k=top_k,
        stream=stream,
        user=user,
    )


def to_chat_request(converted: ConvertedChat, config: ServerConfig, request_id: str) -> ChatRequest:
    """Fill server defaults into a converted request and build the pipeline's :class:`ChatRequest`.

    Resolves the model name (aliases; ``ModelNotFoundError`` for unknown names),
    the thinking default (``--default-thinking``) and normalizes the effort word
    for the checkpoint's effort profile. ``parallel_tool_calls`` is not enforced
    (DeepSeek decides how many calls one turn makes).
    """
    from deepseek_frontend.api.pipeline import ChatRequest
    from deepseek_frontend.formats import normalize_reasoning_effort

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
