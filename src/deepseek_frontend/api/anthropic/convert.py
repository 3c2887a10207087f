"""Anthropic Messages requests -> the pipeline's OpenAI-style chat request.

DeepSeek's chat formats take OpenAI-style message dicts (see ``formats/``), so a
Messages request is translated into exactly what a Chat Completions request
would carry -- messages, OpenAI function tools, an OpenAI ``tool_choice``,
thinking on/off and sampling -- and then runs through the same pipeline.

Translation rules (each one is pinned by a test in ``tests/api/anthropic``):

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
  string or text blocks (joined with a blank line), and ``tool_reference`` blocks.
* Tool search: a tool with ``defer_loading: true`` is left out of the request's tools
  until a ``tool_reference`` block names it; then it is kept, marked ``defer_loading``,
  and the referencing tool message lists it in ``tool_references`` --
  ``formats.request`` writes its schema into that result, not into the system prompt
  (see :func:`_available_tools` and docs/apis.md, "Tool search").
* ``tool_choice``: ``auto`` -> ``"auto"``, ``any`` -> ``"required"``,
  ``tool`` -> ``{"type": "function", "function": {"name": ...}}``,
  ``none`` -> ``"none"``; ``disable_parallel_tool_use`` -> ``parallel_tool_calls=False``.
* ``thinking: {"type": "enabled"|"adaptive"}`` turns thinking on,
  ``{"type": "disabled"}`` off; absent leaves the server default.
  ``budget_tokens`` is validated but not enforced (DeepSeek has no thinking
  budget; ``output_config.effort`` selects a reasoning effort instead).
* With ``read_images`` (the model reads images: DeepSeek-V4.1) ``image`` blocks
  (``base64`` / ``url`` sources), also inside ``tool_result`` content, become image
  parts that ``images.py`` resolves. Otherwise images, and always documents and
  server tools, are rejected (DeepSeek-V4 is a text model and the frontend runs no
  server-side tools) -- except an image inside a
  ``tool_result``, which becomes :data:`IMAGE_PLACEHOLDER`: an agent whose tool
  returned a screenshot would otherwise fail on every later request of the
  session, since the image stays in its history. ``cache_control`` and
  ``citations`` are accepted and ignored. Unknown top-level fields are ignored so
  new agent releases keep working.
* ``messages[i].role == "system"`` (beta ``mid-conversation-system-2026-04-07``) is a
  mid-conversation instruction, kept in place; ``formats.place_instructions`` renders it
  (V4 / V3.2: a ``<system-reminder>`` in the user turn beside it, as deepseek-recipe does).
* A last assistant message is prefill: the answer continues its text (the prompt
  ends inside that turn, without end-of-sentence). One with ``tool_use`` is refused.
* ``ignore_eos`` and ``min_tokens`` (vLLM's names; not Anthropic fields) reach the engine.

The result is a :class:`~deepseek_frontend.api.adapters.ConvertedChat` (see
:mod:`.adapters`, shared with ``api/responses/convert.py``);
:func:`~deepseek_frontend.api.adapters.to_chat_request` then fills the server's
defaults (model alias, thinking default, effort profile) into the pipeline's
``ChatRequest``. Both names are re-exported here for existing imports.

Every error is a :class:`~deepseek_frontend.errors.RequestError` whose ``param``
points at the offending field, e.g. ``messages[2].content[1].tool_use_id``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from deepseek_frontend.api.adapters import (
    ChatMessage,
    ConvertedChat,
    check_model,
    function_tools,
    length_controls,
    to_chat_request,
)
from deepseek_frontend.api.schemas import check_json_schema
from deepseek_frontend.api.validation import (
    check_array,
    check_boolean,
    check_integer,
    check_number,
    check_object,
    check_string,
    check_tool_name,
)
from deepseek_frontend.errors import RequestError, UnsupportedFeatureError
from deepseek_frontend.images import make_image_part

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


# --------------------------------------------------------------------------- blocks


def _blocks(content: Any, param: str) -> Iterator[tuple[str, Mapping[str, Any], str]]:
    """``(path, block, type)`` for each block of a content array; every block needs a string type."""
    for i, block in enumerate(check_array(content, param)):
        bparam = f"{param}[{i}]"
        block = check_object(block, bparam)
        block_type = block.get("type")
        if not isinstance(block_type, str):
            raise RequestError(
                f"{bparam}.type: every content block needs a string type", param=f"{bparam}.type"
            )
        yield bparam, block, block_type


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


def _text_of_blocks(
    content: Any,
    param: str,
    *,
    what: str,
    image_placeholder: bool = False,
    references: list[tuple[str, str]] | None = None,
) -> str:
    """Text of a string or a list of ``text`` blocks, blocks joined by a blank line.

    With ``image_placeholder`` an ``image`` block becomes :data:`IMAGE_PLACEHOLDER`
    instead of an error (used for tool results, see the module docstring). With
    ``references`` a ``tool_reference`` block adds ``(tool_name, path)`` to it instead.
    """
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for bparam, block, block_type in _blocks(content, param):
        if block_type == "image" and image_placeholder:
            texts.append(IMAGE_PLACEHOLDER)
            continue
        if block_type == "tool_reference" and references is not None:
            references.append(_tool_reference(block, bparam))
            continue
        if block_type != "text":
            if block_type in ("image", "document"):
                raise _unsupported_block(block_type, bparam)
            allowed = "text" if references is None else "text and tool_reference"
            raise RequestError(
                f"{bparam}: {what} takes only {allowed} blocks, got {block_type!r}", param=f"{bparam}.type"
            )
        texts.append(check_string(block.get("text"), f"{bparam}.text"))
    return "\n\n".join(texts)


def _image_part(block: Mapping[str, Any], param: str) -> Any:
    """An ``image`` block (``base64`` or ``url`` source) -> an unresolved image part (images.py)."""
    source = check_object(block.get("source"), f"{param}.source")
    kind = source.get("type")
    if kind == "base64":
        media_type = check_string(source.get("media_type"), f"{param}.source.media_type", non_empty=True)
        data = check_string(source.get("data"), f"{param}.source.data", non_empty=True)
        return make_image_part(f"data:{media_type};base64,{data}", param)
    if kind == "url":
        return make_image_part(check_string(source.get("url"), f"{param}.source.url", non_empty=True), param)
    raise UnsupportedFeatureError(
        f"{param}.source.type: image sources of type {kind!r} are not supported (use base64 or url)",
        param=f"{param}.source.type",
    )


def _parts_of_blocks(
    content: Any, param: str, *, what: str, references: list[tuple[str, str]] | None = None
) -> str | list[Any]:
    """Like :func:`_text_of_blocks`, but ``image`` blocks become image parts (a model that reads
    images): a list of ``{"type": "text"}`` dicts and image parts when there is an image."""
    if isinstance(content, str):
        return content
    parts: list[Any] = []
    has_image = False
    for bparam, block, block_type in _blocks(content, param):
        if block_type == "tool_reference" and references is not None:
            references.append(_tool_reference(block, bparam))
        elif block_type == "image":
            parts.append(_image_part(block, bparam))
            has_image = True
        elif block_type == "text":
            parts.append({"type": "text", "text": check_string(block.get("text"), f"{bparam}.text")})
        elif block_type == "document":
            raise _unsupported_block(block_type, bparam)
        else:
            raise RequestError(
                f"{bparam}: {what} takes only text, image and tool_reference blocks, got {block_type!r}",
                param=f"{bparam}.type",
            )
    if has_image:
        return parts
    return "\n\n".join(p["text"] for p in parts)


def _tool_reference(block: Mapping[str, Any], param: str) -> tuple[str, str]:
    """A ``tool_reference`` block's ``(tool_name, path of tool_name)``; the name is checked against
    ``tools`` once they are read (:func:`_available_tools`)."""
    where = f"{param}.tool_name"
    return check_string(block.get("tool_name"), where, non_empty=True), where


def _convert_system(system: Any) -> str | None:
    if system is None:
        return None
    text = _text_of_blocks(system, "system", what="system")
    return text if text else None


def _tool_result_message(
    block: Mapping[str, Any],
    param: str,
    known_ids: Mapping[str, int],
    read_images: bool = False,
    references: list[tuple[str, str]] | None = None,
) -> ChatMessage:
    tool_use_id = check_string(block.get("tool_use_id"), f"{param}.tool_use_id")
    if tool_use_id not in known_ids:
        raise RequestError(
            f"{param}.tool_use_id: {tool_use_id!r} does not match any tool_use block of the preceding "
            "assistant message",
            param=f"{param}.tool_use_id",
        )
    content = block.get("content", "")
    text: str | list[Any]
    named: list[tuple[str, str]] = []  # this result's tool_reference blocks
    if content is None:
        text = ""
    elif read_images:
        text = _parts_of_blocks(content, f"{param}.content", what="tool_result content", references=named)
    else:
        text = _text_of_blocks(
            content, f"{param}.content", what="tool_result content", image_placeholder=True, references=named
        )
    if check_boolean(block.get("is_error", False), f"{param}.is_error"):
        if isinstance(text, str):
            text = TOOL_ERROR_PREFIX + text
        elif text and isinstance(text[0], dict):  # parts starting with text: prefix that text
            text = [{"type": "text", "text": TOOL_ERROR_PREFIX + text[0]["text"]}, *text[1:]]
        else:  # parts starting with an image
            text = [{"type": "text", "text": TOOL_ERROR_PREFIX.rstrip()}, *text]
    message: ChatMessage = {"role": "tool", "tool_call_id": tool_use_id, "content": text}
    if named:
        # formats.request.expand_tool_references writes the named tools' schemas into this result
        message["tool_references"] = [name for name, _ in named]
        if references is not None:
            references.extend(named)
    return message


def _convert_user(
    content: Any,
    param: str,
    pending_tool_ids: Mapping[str, int],
    read_images: bool = False,
    references: list[tuple[str, str]] | None = None,
) -> list[ChatMessage]:
    """One user message -> tool messages (in block order) then one user message with the text
    (and, with ``read_images``, its images: then the content is a list of parts)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tool_messages: list[ChatMessage] = []
    texts: list[str] = []
    parts: list[Any] = []
    for bparam, block, block_type in _blocks(content, param):
        if block_type == "text":
            texts.append(check_string(block.get("text"), f"{bparam}.text"))
            parts.append({"type": "text", "text": texts[-1]})
        elif block_type == "image" and read_images:
            parts.append(_image_part(block, bparam))
        elif block_type == "tool_result":
            tool_messages.append(
                _tool_result_message(block, bparam, pending_tool_ids, read_images, references)
            )
        elif block_type in ("thinking", "redacted_thinking", "tool_use"):
            raise RequestError(
                f"{bparam}: {block_type!r} blocks belong to assistant messages", param=f"{bparam}.type"
            )
        else:
            raise _unsupported_block(block_type, bparam)
    out = tool_messages
    if len(parts) > len(texts):  # images among the blocks: the content stays a list of parts
        out.append({"role": "user", "content": parts})
    # A user turn made only of tool results has no user text to render.
    elif texts or not tool_messages:
        out.append({"role": "user", "content": "\n\n".join(texts)})
    return out


def _convert_assistant(content: Any, param: str) -> tuple[ChatMessage, dict[str, int]]:
    """One assistant message -> one OpenAI assistant message, plus its tool_use ids."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}, {}
    texts: list[str] = []
    reasoning: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    ids: dict[str, int] = {}
    for bparam, block, block_type in _blocks(content, param):
        if block_type == "text":
            texts.append(check_string(block.get("text"), f"{bparam}.text"))
        elif block_type == "thinking":
            reasoning.append(check_string(block.get("thinking"), f"{bparam}.thinking"))
        elif block_type == "redacted_thinking":
            continue  # encrypted reasoning from another provider: nothing we can render
        elif block_type == "tool_use":
            call_id = check_string(block.get("id"), f"{bparam}.id", non_empty=True)
            if call_id in ids:
                raise RequestError(f"{bparam}.id: duplicate tool_use id {call_id!r}", param=f"{bparam}.id")
            name = check_string(block.get("name"), f"{bparam}.name")
            tool_input = check_object(block.get("input"), f"{bparam}.input")
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
    message: ChatMessage = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message, ids


def _convert_messages(
    raw: Any, read_images: bool = False, references: list[tuple[str, str]] | None = None
) -> list[ChatMessage]:
    """The messages; ``references`` collects every ``tool_reference`` block's ``(name, path)``."""
    messages = check_array(raw, "messages", non_empty=True)
    out: list[ChatMessage] = []
    pending_tool_ids: dict[str, int] = {}
    for index, message in enumerate(messages):
        param = f"messages[{index}]"
        message = check_object(message, param)
        role = message.get("role")
        if "content" not in message:
            raise RequestError(f"{param}.content: required", param=f"{param}.content")
        content = message["content"]
        if role == "user":
            out.extend(_convert_user(content, f"{param}.content", pending_tool_ids, read_images, references))
            pending_tool_ids = {}
        elif role == "assistant":
            converted, pending_tool_ids = _convert_assistant(content, f"{param}.content")
            out.append(converted)
        elif role == "system":
            # A mid-conversation instruction (beta mid-conversation-system-2026-04-07, which
            # Claude Code sends): rendered where it stands (formats.place_instructions).
            out.append(
                {"role": "system", "content": _text_of_blocks(content, f"{param}.content", what="system")}
            )
        else:
            raise RequestError(
                f"{param}.role: expected 'user', 'assistant' or 'system', got {role!r}",
                param=f"{param}.role",
            )
    if all(m["role"] == "system" for m in out):
        raise RequestError("messages: needs at least one user message", param="messages")
    if out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
        raise RequestError(
            f"messages[{len(messages) - 1}]: the last message has tool_use blocks; send their "
            "tool_result blocks in a user message after it",
            param=f"messages[{len(messages) - 1}].content",
        )
    return out


# --------------------------------------------------------------------------- tools


def _tool_schema(tool: Mapping[str, Any], param: str) -> dict[str, Any]:
    """A client tool (no ``type``, or ``custom``): its ``input_schema`` becomes the parameters."""
    tool_type = tool.get("type")
    if tool_type not in (None, "custom"):
        raise UnsupportedFeatureError(
            f"{param}.type: tool type {tool_type!r} is not supported; declare client tools with "
            "name, description and input_schema",
            param=f"{param}.type",
        )
    schema = check_json_schema(tool.get("input_schema"), f"{param}.input_schema", object_root=True)
    return {"parameters": schema}


def _available_tools(
    raw: Any, tools: list[dict[str, Any]] | None, references: list[tuple[str, str]]
) -> list[dict[str, Any]] | None:
    """The tools the model may call: those loaded up front, and the deferred ones referenced.

    ``raw`` is the request's ``tools`` and ``tools`` their conversion (same order). A tool with
    ``defer_loading: true`` is kept, marked ``"defer_loading": True`` (so
    ``formats.request.attach_request_tools`` leaves it out of the system prompt), only when a
    ``tool_reference`` names it; otherwise it is not in the prompt, the grammar or the parser.
    Raises for a reference to a tool not in ``tools`` (at its ``tool_name``) and for a request
    whose tools are all deferred (the model would not know how to call any tool).
    """
    declared = {t["function"]["name"] for t in tools or ()}
    for name, where in references:
        if name not in declared:
            raise RequestError(
                f"{where}: tool_reference names {name!r}, which is not in 'tools'", param=where
            )
    if not tools:
        return tools
    referenced = {name for name, _ in references}
    out: list[dict[str, Any]] = []
    deferred = 0
    for i, (spec, tool) in enumerate(zip(raw, tools, strict=True)):
        if not check_boolean(spec.get("defer_loading", False), f"tools[{i}].defer_loading"):
            out.append(tool)
            continue
        deferred += 1
        if tool["function"]["name"] in referenced:
            out.append({**tool, "defer_loading": True})
    if deferred == len(tools):
        raise RequestError(
            "tools: every tool has defer_loading: true; at least one tool (such as the one that "
            "searches the others) must be loaded up front",
            param="tools",
        )
    return out


def _convert_tool_choice(
    raw: Any, tools: list[dict[str, Any]] | None
) -> tuple[str | dict[str, Any] | None, bool | None]:
    """``tool_choice`` -> (OpenAI tool_choice, parallel_tool_calls)."""
    if raw is None:
        return None, None
    choice = check_object(raw, "tool_choice")
    kind = choice.get("type")
    disable = check_boolean(
        choice.get("disable_parallel_tool_use"), "tool_choice.disable_parallel_tool_use", default=None
    )
    parallel = None if disable is None else not disable
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
    return check_tool_name(choice.get("name"), "tool_choice.name", tools), parallel


# --------------------------------------------------------------------------- thinking, sampling


def _convert_thinking(raw: Any) -> bool | None:
    if raw is None:
        return None
    thinking = check_object(raw, "thinking")
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
        # Validated for the client's sake; DeepSeek's thinking has no token budget to set (on V4.1
        # the adapter turns it into the numeric effort when no output_config.effort is given).
        check_integer(budget, "thinking.budget_tokens", minimum=1)
    elif kind == "enabled":
        raise RequestError(
            "thinking.budget_tokens: required when thinking is enabled", param="thinking.budget_tokens"
        )
    return True


def _convert_effort(body: Mapping[str, Any]) -> str | int | None:
    """``output_config.effort``: a word, or a budget 1-100 (DeepSeek-V4.1's numeric effort)."""
    config = check_object(body.get("output_config"), "output_config", default=None)
    effort = None if config is None else config.get("effort")
    if effort is None:
        return None
    if isinstance(effort, int) and not isinstance(effort, bool) and 1 <= effort <= 100:
        return effort
    if not isinstance(effort, str) or effort not in _EFFORT_WORDS:
        raise RequestError(
            f"output_config.effort: expected one of {', '.join(_EFFORT_WORDS)} or a number 1-100, "
            f"got {effort!r}",
            param="output_config.effort",
        )
    return str(effort)


def _thinking_budget(raw: Any) -> int | None:
    """``thinking.budget_tokens`` when thinking is on (validated by :func:`_convert_thinking`)."""
    if not isinstance(raw, Mapping) or raw.get("type") == "disabled":
        return None
    budget = raw.get("budget_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None


def _convert_stop(raw: Any) -> list[str]:
    if raw is None:
        return []
    return [
        check_string(stop, f"stop_sequences[{i}]", non_empty=True)
        for i, stop in enumerate(check_array(raw, "stop_sequences"))
    ]


def convert_messages_request(
    body: Any, *, require_max_tokens: bool = True, read_images: bool = False
) -> ConvertedChat:
    """Validate an Anthropic Messages request body and translate it.

    ``require_max_tokens=False`` is for ``/v1/messages/count_tokens``, whose body
    has no ``max_tokens``. Raises :class:`RequestError` (``param`` set) on any
    invalid field and :class:`UnsupportedFeatureError` for valid features this
    server does not offer (images, server tools, assistant prefill).
    """
    body = check_object(body, "body")
    model = check_model(body)

    max_tokens: int | None = None
    if require_max_tokens or body.get("max_tokens") is not None:
        if body.get("max_tokens") is None:
            raise RequestError("max_tokens: required", param="max_tokens")
        max_tokens = check_integer(body["max_tokens"], "max_tokens", minimum=1)

    # read_images: the model reads images (V4.1): image blocks, also inside tool_result content,
    # become image parts (images.py resolves them); otherwise they are refused / placeheld.
    references: list[tuple[str, str]] = []  # (tool_name, path) of every tool_reference block
    messages = _convert_messages(body.get("messages"), read_images, references)
    system = _convert_system(body.get("system"))
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})

    tools = _available_tools(body.get("tools"), function_tools(body.get("tools"), _tool_schema), references)
    tool_choice, parallel = _convert_tool_choice(body.get("tool_choice"), tools)
    top_k = check_integer(body.get("top_k"), "top_k", minimum=1, default=None)
    stream = check_boolean(body.get("stream", False), "stream")
    ignore_eos, min_tokens = length_controls(body)
    metadata = check_object(body.get("metadata"), "metadata", default=None)
    user = (
        None if metadata is None else check_string(metadata.get("user_id"), "metadata.user_id", default=None)
    )

    return ConvertedChat(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        thinking=_convert_thinking(body.get("thinking")),
        reasoning_effort=_convert_effort(body),
        effort_param="output_config.effort",
        thinking_budget_tokens=_thinking_budget(body.get("thinking")),
        stop=_convert_stop(body.get("stop_sequences")),
        temperature=check_number(
            body.get("temperature"), "temperature", minimum=0.0, maximum=1.0, default=None
        ),
        top_p=check_number(body.get("top_p"), "top_p", minimum=0.0, maximum=1.0, default=None),
        top_k=top_k,
        stream=stream,
        user=user,
        ignore_eos=ignore_eos,
        min_tokens=min_tokens,
    )
