"""OpenAI Responses requests -> the pipeline's OpenAI-style chat request.

The Responses API is a re-shaped Chat Completions: ``input`` items become chat
messages and the rest maps field by field. Translation rules (pinned by tests in
``tests/api/responses``):

* ``input`` as a string is one user message. As items: messages (``role``
  user/assistant/system/developer, content a string or ``input_text`` /
  ``output_text`` parts joined with a blank line), ``function_call``,
  ``function_call_output`` and ``reasoning`` items.
* ``instructions`` becomes a leading system message. ``developer`` messages are
  system messages (OpenAI defines them as the same thing for its newer models).
* Consecutive ``function_call`` items join the assistant message before them (or
  a new one); a ``reasoning`` item becomes the ``reasoning_content`` of the
  assistant turn that follows it. Its text comes from ``content``
  (``reasoning_text`` parts), else from an ``encrypted_content`` this server
  produced (:func:`encode_reasoning`, not encryption: the reasoning text itself,
  so stateless clients such as Codex can hand it back); ``summary`` is not used
  (a summary is not what the model wrote).
* ``function_call_output`` becomes a ``tool`` message; its ``call_id`` must name
  an earlier ``function_call``.
* ``tools``: function tools; a ``namespace`` tool is flattened into its function tools
  named ``namespace__name`` (a call comes back as ``name`` with ``namespace`` set, and an
  input ``function_call`` with a ``namespace`` is flattened the same way); hosted tools
  (``web_search``, ``file_search``, ``code_interpreter``, computer use, ``mcp``) are dropped
  with a warning in the response, or refused with ``--hosted-tools reject``.
* ``tool_choice``, ``parallel_tool_calls``,
  ``reasoning.effort`` (``"none"`` turns thinking off), ``max_output_tokens``,
  ``text.format`` (-> ``response_format``), ``temperature``, ``top_p``.
* A last ``assistant`` message is continued as a prefix (the output writes on from its
  last character); a last ``function_call`` without its output is refused.
* ``ignore_eos`` and ``min_tokens`` (vLLM's names) are passed to the engine.
* Stateless: ``previous_response_id``, ``conversation``, ``background`` and
  ``store: true`` are rejected with a 400 that says so; ``item_reference`` items
  likewise. Unknown top-level fields are ignored.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from deepseek_frontend.api.adapters import (
    ChatMessage,
    ConvertedChat,
    check_model,
    function_tools,
    length_controls,
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
    json_type,
)
from deepseek_frontend.errors import RequestError, UnsupportedFeatureError
from deepseek_frontend.images import make_image_part

__all__ = [
    "REASONING_BLOB_PREFIX",
    "convert_responses_request",
    "decode_reasoning",
    "encode_reasoning",
]

#: Marks an ``encrypted_content`` produced by this server (base64 of the UTF-8 reasoning text).
REASONING_BLOB_PREFIX = "dsfe-reasoning-v1:"

_EFFORT_WORDS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def encode_reasoning(text: str) -> str:
    """The ``encrypted_content`` of a reasoning item: the text, base64-encoded and tagged.

    Not encryption -- this server keeps no state and has nothing to hide from the
    client that received the reasoning anyway; the field only lets stateless
    clients return reasoning they were not shown as text.
    """
    return REASONING_BLOB_PREFIX + base64.b64encode(text.encode("utf-8")).decode("ascii")


def decode_reasoning(blob: str) -> str | None:
    """The text inside an :func:`encode_reasoning` blob; ``None`` for anyone else's blob."""
    if not blob.startswith(REASONING_BLOB_PREFIX):
        return None
    try:
        return base64.b64decode(blob[len(REASONING_BLOB_PREFIX) :], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def _parts_text(content: Any, param: str, allowed: tuple[str, ...], images: bool = False) -> str | list[Any]:
    """Text parts joined by a blank line; with ``images`` (the model reads them) and an
    ``input_image`` part, a list of ``{"type": "text"}`` dicts and image parts instead."""
    if isinstance(content, str):
        return content
    parts = check_array(content, param)
    texts: list[str] = []
    out: list[Any] = []
    for i, part in enumerate(parts):
        pparam = f"{param}[{i}]"
        part = check_object(part, pparam)
        kind = part.get("type")
        if kind in allowed:
            texts.append(check_string(part.get("text"), f"{pparam}.text"))
            out.append({"type": "text", "text": texts[-1]})
        elif kind == "refusal":
            texts.append(check_string(part.get("refusal"), f"{pparam}.refusal"))
            out.append({"type": "text", "text": texts[-1]})
        elif kind == "input_image" and images:
            if part.get("image_url") is None and part.get("file_id") is not None:
                raise UnsupportedFeatureError(
                    f"{pparam}.file_id: uploaded files need stored state; send image_url (a data: URL)",
                    param=f"{pparam}.file_id",
                )
            url = check_string(part.get("image_url"), f"{pparam}.image_url", non_empty=True)
            out.append(make_image_part(url, pparam))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise UnsupportedFeatureError(
                f"{pparam}: content part type {kind!r} is not supported (this model accepts text only)",
                param=f"{pparam}.type",
            )
        else:
            raise RequestError(
                f"{pparam}.type: unexpected content part type {kind!r}", param=f"{pparam}.type"
            )
    if len(out) > len(texts):
        return out
    return "\n\n".join(texts)


def _reasoning_text(item: Mapping[str, Any], param: str) -> str:
    content = item.get("content")
    if content:
        parts = check_array(content, f"{param}.content")
        texts = []
        for i, part in enumerate(parts):
            part = check_object(part, f"{param}.content[{i}]")
            texts.append(check_string(part.get("text"), f"{param}.content[{i}].text"))
        return "".join(texts)
    blob = item.get("encrypted_content")
    if isinstance(blob, str):
        text = decode_reasoning(blob)
        if text is not None:
            return text
    return ""


class _InputBuilder:
    """Folds Responses input items into chat messages, in order."""

    def __init__(self, read_images: bool = False) -> None:
        #: the model reads images: input_image parts of user / system / tool output are kept
        self.read_images = read_images
        self.messages: list[ChatMessage] = []
        self.call_ids: set[str] = set()
        self._pending_reasoning: str | None = None

    def _assistant_turn(self) -> ChatMessage:
        """The assistant message function calls attach to: the last one if nothing followed it."""
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and self._pending_reasoning is None:
            return last
        message: ChatMessage = {"role": "assistant", "content": ""}
        self._attach_reasoning(message)
        self.messages.append(message)
        return message

    def _attach_reasoning(self, message: ChatMessage) -> None:
        if self._pending_reasoning is not None:
            message["reasoning_content"] = self._pending_reasoning
            self._pending_reasoning = None

    def message(self, item: Mapping[str, Any], param: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise RequestError(
                f"{param}.role: expected user, assistant, system or developer, got {role!r}",
                param=f"{param}.role",
            )
        if "content" not in item:
            raise RequestError(f"{param}.content: required", param=f"{param}.content")
        allowed = ("output_text", "text") if role == "assistant" else ("input_text", "text", "output_text")
        images = self.read_images and role != "assistant"
        text = _parts_text(item["content"], f"{param}.content", allowed, images)
        if role == "assistant":
            message: ChatMessage = {"role": "assistant", "content": text}
            self._attach_reasoning(message)
            self.messages.append(message)
            return
        self._drop_pending_reasoning()
        self.messages.append({"role": "system" if role == "developer" else role, "content": text})

    def function_call(self, item: Mapping[str, Any], param: str) -> None:
        call_id = check_string(item.get("call_id"), f"{param}.call_id", non_empty=True)
        if call_id in self.call_ids:
            raise RequestError(f"{param}.call_id: duplicate call_id {call_id!r}", param=f"{param}.call_id")
        name = check_string(item.get("name"), f"{param}.name")
        namespace = check_string(item.get("namespace"), f"{param}.namespace", default=None)
        if namespace:
            # a call to a namespace tool comes back as the flat name the model was shown
            name = namespaced_tool_name(namespace, name)
        arguments = check_string(item.get("arguments"), f"{param}.arguments")
        message = self._assistant_turn()
        message.setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
        self.call_ids.add(call_id)

    def function_call_output(self, item: Mapping[str, Any], param: str) -> None:
        call_id = check_string(item.get("call_id"), f"{param}.call_id")
        if call_id not in self.call_ids:
            raise RequestError(
                f"{param}.call_id: no earlier function_call has call_id {call_id!r}", param=f"{param}.call_id"
            )
        output = item.get("output")
        text = _parts_text(output, f"{param}.output", ("input_text", "output_text", "text"), self.read_images)
        self._drop_pending_reasoning()
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})

    def reasoning(self, item: Mapping[str, Any], param: str) -> None:
        text = _reasoning_text(item, param)
        # Several reasoning items before one turn: their texts concatenate.
        self._pending_reasoning = (self._pending_reasoning or "") + text

    def _drop_pending_reasoning(self) -> None:
        # Reasoning followed by a non-assistant item has no turn to belong to.
        self._pending_reasoning = None


def _feed(builder: _InputBuilder, item: Mapping[str, Any], param: str) -> None:
    """Fold one input item into ``builder``; raises naming ``param`` and the field at fault."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        builder.message(item, param)
    elif kind == "function_call":
        builder.function_call(item, param)
    elif kind == "function_call_output":
        builder.function_call_output(item, param)
    elif kind == "reasoning":
        builder.reasoning(item, param)
    elif kind == "item_reference":
        raise RequestError(
            f"{param}.type: item_reference needs stored responses; this server is stateless -- "
            "send the items themselves",
            param=f"{param}.type",
        )
    else:
        raise UnsupportedFeatureError(f"{param}.type: input item type {kind!r} is not supported", param=param)


def check_input_items(history: Sequence[Mapping[str, Any]], items: Sequence[Any], param: str) -> None:
    """Check ``items`` (a conversation's new items, item references already resolved) with the checks
    ``/v1/responses`` gives its input items, so that an item stored is one a later request can
    read; raises ``RequestError`` (400) naming ``<param>[i]`` and the field. ``history``: the items
    stored before them (a ``function_call_output`` may answer a call among them). Image parts are
    checked as for a model that reads images; whether the model a request goes to does is that
    request's check."""
    builder = _InputBuilder(read_images=True)
    for item in history:  # stored already: only the calls they make count
        with contextlib.suppress(RequestError):
            _feed(builder, item, "history")
    for i, item in enumerate(items):
        _feed(builder, check_object(item, f"{param}[{i}]"), f"{param}[{i}]")


def _convert_input(raw: Any, read_images: bool = False) -> list[ChatMessage]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    items = check_array(raw, "input")
    if not items:
        raise RequestError("input: at least one item is required", param="input")
    builder = _InputBuilder(read_images)
    for i, item in enumerate(items):
        _feed(builder, check_object(item, f"input[{i}]"), f"input[{i}]")
    messages = builder.messages
    if not messages:
        raise RequestError("input: no message to answer", param="input")
    # A last assistant message is a prefix the model continues (formats.place_instructions); a
    # last function_call without its output cannot be continued.
    if messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
        raise RequestError(
            f"input[{len(items) - 1}]: the input ends with a function_call; send its "
            "function_call_output after it",
            param=f"input[{len(items) - 1}]",
        )
    return messages


#: Tool types OpenAI runs on its own servers; this server runs none of them.
HOSTED_TOOL_TYPES = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "computer",
        "computer_use",
        "computer_use_preview",
        "computer_use_preview_2025_03_11",
        "mcp",
        "image_generation",
        "tool_search",
    }
)

#: Joins a namespace and a tool name into the one function name the model sees (DeepSeek's own
#: converter, deepseek-recipe, uses the same separator).
NAMESPACE_SEPARATOR = "__"


def namespaced_tool_name(namespace: str, name: str) -> str:
    """The flat function name of tool ``name`` in ``namespace``."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}"


def flatten_tools(
    raw: Any, *, hosted_tools: str = "drop"
) -> tuple[list[Any] | None, dict[str, tuple[str, str]], list[str]]:
    """Responses ``tools`` -> ``(function tools, namespace map, warnings)``.

    * A ``namespace`` tool (Codex's named group of function tools) is replaced by its
      function tools, each renamed ``namespace__name``; the map takes each flat name back
      to ``(namespace, name)`` so a call is answered under the name the client declared.
    * Hosted tools (:data:`HOSTED_TOOL_TYPES`) are dropped with one warning each when
      ``hosted_tools`` is ``"drop"``; with ``"reject"`` the request fails with a 400
      naming the tool (``--hosted-tools``).

    Other entries are returned as they are (``_tool_schema`` then checks them).
    """
    if raw is None or not isinstance(raw, list):
        return raw, {}, []
    out: list[Any] = []
    namespaces: dict[str, tuple[str, str]] = {}
    warnings: list[str] = []
    for i, tool in enumerate(raw):
        param = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind == "namespace":
            namespace = check_string(tool.get("name"), f"{param}.name", non_empty=True)
            for j, member in enumerate(check_array(tool.get("tools"), f"{param}.tools")):
                mparam = f"{param}.tools[{j}]"
                member = check_object(member, mparam)
                if member.get("type", "function") != "function":
                    raise UnsupportedFeatureError(
                        f"{mparam}.type: only function tools are supported inside a namespace, "
                        f"got {member.get('type')!r}",
                        param=f"{mparam}.type",
                    )
                local = check_string(member.get("name"), f"{mparam}.name", non_empty=True)
                flat = namespaced_tool_name(namespace, local)
                namespaces[flat] = (namespace, local)
                out.append({**member, "type": "function", "name": flat})
        elif isinstance(kind, str) and kind in HOSTED_TOOL_TYPES:
            if hosted_tools == "reject":
                raise UnsupportedFeatureError(
                    f"{param}.type: hosted tool {kind!r} is not supported: this server runs no hosted "
                    "tools (it was started with --hosted-tools reject)",
                    param=f"{param}.type",
                )
            warnings.append(f"{param}: hosted tool {kind!r} was ignored: this server runs no hosted tools")
        else:
            out.append(tool)
    return out, namespaces, warnings


def _tool_schema(tool: Mapping[str, Any], param: str) -> dict[str, Any]:
    """A function tool: its ``parameters`` (an empty object schema when absent) and ``strict``."""
    if tool.get("type") != "function":
        raise UnsupportedFeatureError(
            f"{param}.type: only function tools are supported, got {tool.get('type')!r}",
            param=f"{param}.type",
        )
    parameters = tool.get("parameters")
    if parameters is not None:
        parameters = check_json_schema(parameters, f"{param}.parameters", object_root=True)
    fields: dict[str, Any] = {
        "parameters": {"type": "object", "properties": {}} if parameters is None else parameters
    }
    if tool.get("strict") is not None:
        fields["strict"] = check_boolean(tool["strict"], f"{param}.strict")
    return fields


def _convert_tool_choice(raw: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, Any] | None:
    if raw is None:
        return None
    if raw in ("auto", "none"):
        return str(raw)
    if raw == "required":
        if not tools:
            raise RequestError("tool_choice: 'required' needs tools", param="tool_choice")
        return "required"
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        return check_tool_name(raw.get("name"), "tool_choice.name", tools)
    raise RequestError(
        f"tool_choice: expected 'auto', 'none', 'required' or a function choice, got {json_type(raw)}",
        param="tool_choice",
    )


def _convert_text_format(raw: Any, max_tokens: int | None = None) -> dict[str, Any] | None:
    """``text.format``; a JSON schema's value must fit in ``max_tokens`` (``max_output_tokens``)."""
    if raw is None:
        return None
    text = check_object(raw, "text")
    fmt = text.get("format")
    if fmt is None:
        return None
    fmt = check_object(fmt, "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = check_json_schema(fmt.get("schema"), "text.format.schema", max_tokens=max_tokens)
        spec: dict[str, Any] = {"name": check_string(fmt.get("name", "response"), "text.format.name")}
        spec["schema"] = schema
        if fmt.get("strict") is not None:
            spec["strict"] = check_boolean(fmt["strict"], "text.format.strict")
        if fmt.get("description") is not None:
            spec["description"] = check_string(fmt["description"], "text.format.description")
        return {"type": "json_schema", "json_schema": spec}
    raise RequestError(
        f"text.format.type: expected text, json_object or json_schema, got {kind!r}", param="text.format.type"
    )


def _reject_stateful(body: Mapping[str, Any]) -> None:
    stateless = "this server is stateless: send the whole conversation in input"
    if body.get("previous_response_id") is not None:
        raise RequestError(f"previous_response_id: not supported; {stateless}", param="previous_response_id")
    if body.get("conversation") is not None:
        raise RequestError(f"conversation: not supported; {stateless}", param="conversation")
    if body.get("store") is True:
        raise RequestError(
            f"store: true is not supported; {stateless} (set store to false or omit it)", param="store"
        )
    if body.get("background") is True:
        raise RequestError("background: true is not supported (responses are not stored)", param="background")


#: the ``include`` value that asks for the answer tokens' logprobs
LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _convert_logprobs(body: Mapping[str, Any]) -> tuple[bool, int]:
    """``(logprobs, top_logprobs)`` from ``include`` and ``top_logprobs``.

    ``include`` is an array of strings; values other than :data:`LOGPROBS_INCLUDE` ask
    for nothing this server holds back (reasoning ``encrypted_content`` is always sent)
    or for hosted-tool output it does not produce, so they are accepted and ignored.
    """
    raw = body.get("include")
    include = [] if raw is None else check_array(raw, "include")
    for i, value in enumerate(include):
        check_string(value, f"include[{i}]")
    top = check_integer(body.get("top_logprobs"), "top_logprobs", minimum=0, maximum=20, default=0)
    return LOGPROBS_INCLUDE in include, top


def convert_responses_request(
    body: Any, *, hosted_tools: str = "drop", read_images: bool = False
) -> ConvertedChat:
    """Validate an OpenAI Responses request body and translate it.

    ``hosted_tools`` is the server's ``--hosted-tools`` choice (see :func:`flatten_tools`).
    Raises :class:`RequestError` (``param`` set) on an invalid or stateful request
    and :class:`UnsupportedFeatureError` for features this server does not offer.
    """
    body = check_object(body, "body")
    model = check_model(body)
    _reject_stateful(body)
    if "input" not in body:
        raise RequestError("input: required", param="input")
    messages = _convert_input(body["input"], read_images)
    instructions = body.get("instructions")
    if instructions is not None:
        messages.insert(0, {"role": "system", "content": check_string(instructions, "instructions")})

    flat_tools, namespaces, warnings = flatten_tools(body.get("tools"), hosted_tools=hosted_tools)
    tools = function_tools(flat_tools, _tool_schema)
    tool_choice = _convert_tool_choice(body.get("tool_choice"), tools)
    parallel = check_boolean(body.get("parallel_tool_calls"), "parallel_tool_calls", default=None)
    ignore_eos, min_tokens = length_controls(body)

    thinking: bool | None = None
    effort: str | int | None = None
    reasoning = check_object(body.get("reasoning"), "reasoning", default=None)
    if reasoning is not None:
        word = reasoning.get("effort")
        if word is not None:
            budget = isinstance(word, int) and not isinstance(word, bool) and 1 <= word <= 100
            if not budget and (not isinstance(word, str) or word not in _EFFORT_WORDS):
                raise RequestError(
                    f"reasoning.effort: expected one of {', '.join(_EFFORT_WORDS)} or a number 1-100, "
                    f"got {word!r}",
                    param="reasoning.effort",
                )
            if word == "none":
                thinking = False
            else:
                # a word or a budget 1-100 (DeepSeek-V4.1's numeric effort)
                thinking, effort = True, word

    max_tokens = check_integer(body.get("max_output_tokens"), "max_output_tokens", minimum=1, default=None)
    stream = check_boolean(body.get("stream", False), "stream")
    user = body.get("user") or body.get("safety_identifier")
    logprobs, top_logprobs = _convert_logprobs(body)

    return ConvertedChat(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        thinking=thinking,
        reasoning_effort=effort,
        effort_param="reasoning.effort",
        temperature=check_number(
            body.get("temperature"), "temperature", minimum=0.0, maximum=2.0, default=None
        ),
        top_p=check_number(body.get("top_p"), "top_p", minimum=0.0, maximum=1.0, default=None),
        stream=stream,
        response_format=_convert_text_format(body.get("text"), max_tokens),
        user=user if isinstance(user, str) else None,
        ignore_eos=ignore_eos,
        min_tokens=min_tokens,
        tool_namespaces=namespaces,
        warnings=warnings,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
    )
