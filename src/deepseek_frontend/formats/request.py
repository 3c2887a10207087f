"""Request-level pieces the DeepSeek formats expect on a message.

OpenAI requests carry ``tools`` and ``response_format`` beside the messages; the
DeepSeek encoders read them from a system (or developer) message. Where they go
decides the prompt, so it is decided here, once, for every API.
"""

from __future__ import annotations

from typing import Any

from deepseek_frontend.errors import RequestError
from deepseek_frontend.formats._common import to_json


def _check_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise RequestError("tools: must be a list", param="tools")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise RequestError(f"{where}: must be an object with a 'function' object", param=where)
        if tool.get("type", "function") != "function":
            raise RequestError(f"{where}.type: only 'function' tools are supported", param=f"{where}.type")
        if not isinstance(tool["function"].get("name"), str):
            raise RequestError(f"{where}.function.name: must be a string", param=f"{where}.function.name")
    return tools


def _schema_to_attach(response_format: Any) -> Any | None:
    """The JSON schema the prompt should state, or ``None`` for nothing.

    ``json_schema`` attaches the inner ``schema`` object: that is what DeepSeek's
    official renderer (deepseek-recipe) writes under "## Response Format". ``text``
    and ``json_object`` attach nothing: the reference has no text for them, and a
    JSON-object constraint is the engine's job.
    """
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise RequestError("response_format: must be an object", param="response_format")
    kind = response_format.get("type")
    if kind in ("text", "json_object"):
        return None
    if kind != "json_schema":
        raise RequestError(f"response_format.type: unsupported value {kind!r}", param="response_format.type")
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        where = "response_format.json_schema.schema"
        raise RequestError(f"{where}: must be an object", param=where)
    return schema


# --------------------------------------------------------------------------- tool references

TOOL_REFERENCE_TEMPLATE = (
    "### Available Tool Schemas\n\n{schemas}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls."
)
"""How V4 and V4.1 list the schemas of tools a tool result loads (``str.format``, ``{schemas}``).

The schema part of the family's tools appendix, word for word: the model reads loaded
tools exactly as it reads the system prompt's. No special token is in it, so it is
plain text in the tool result. V3.2 has its own (``dsv32.TOOL_REFERENCE_TEMPLATE``)."""


def expand_tool_references(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    template: str = TOOL_REFERENCE_TEMPLATE,
) -> list[dict[str, Any]]:
    """A new message list where each ``tool`` message's ``tool_references`` are written out.

    ``tool_references`` (a list of tool names, from Anthropic's ``tool_reference``
    blocks) makes those tools available from that tool result on. Their function
    objects, one JSON line each (``json.dumps(function, ensure_ascii=False)``, as the
    system prompt lists them), are written by ``template`` after the result's text,
    separated by a blank line, inside the result: ``<tool_result>{text}\\n\\n### Available
    Tool Schemas\\n\\n{...}\\n\\nYou MUST ...</tool_result>`` on V4. Every reference
    is written where it stands, so a message renders the same whatever comes after it
    (the prompt prefix, and the engine's prefix cache, stay valid across turns).

    A name not among ``tools`` is skipped (the API layer refuses it first; here it can
    only mean ``tool_choice: none`` removed the tools). A content given as parts gets a
    text part. The ``tool_references`` key is dropped; inputs are never mutated.
    """
    if not any(isinstance(m, dict) and m.get("tool_references") for m in messages):
        return list(messages)
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        names = message.get("tool_references") if isinstance(message, dict) else None
        if not names:
            out.append(message)
            continue
        message = {k: v for k, v in message.items() if k != "tool_references"}
        where = f"messages[{i}].tool_references"
        lines = [to_json(by_name[name], where) for name in names if name in by_name]
        if lines:
            section = template.format(schemas="\n".join(lines))
            content = message.get("content")
            if isinstance(content, list):
                message["content"] = [*content, {"type": "text", "text": section}]
            else:
                message["content"] = f"{content}\n\n{section}" if content else section
        out.append(message)
    return out


def attach_request_tools(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    response_format: dict[str, Any] | None = None,
    *,
    tool_reference_template: str = TOOL_REFERENCE_TEMPLATE,
) -> list[dict[str, Any]]:
    """A new message list with request-level ``tools`` / JSON schema where the encoders read them.

    They go on the first ``system`` message (after any tools it already has). With
    no system message, an empty-content one is inserted at index 0: that renders
    ``BOS + "\\n\\n## Tools ..."`` before the first user turn, exactly what DeepSeek's
    official renderer produces for a request with tools and no system prompt.

    A tool with ``defer_loading: true`` is left out of the system message: it is
    written only where a ``tool`` message's ``tool_references`` names it (see
    :func:`expand_tool_references`, applied here with ``tool_reference_template``, the
    family's schema-list text), so the system prompt is the same whichever deferred
    tools a conversation loads later.

    The input list and its dicts are never mutated. Raises :class:`RequestError`
    naming ``tools[i]`` / ``response_format`` for shapes the format cannot use.
    """
    checked = _check_tools(tools) if tools else []
    out = expand_tool_references(messages, checked, tool_reference_template)
    checked = [t for t in checked if t.get("defer_loading") is not True]
    schema = _schema_to_attach(response_format)
    if not checked and schema is None:
        return out
    at = next((i for i, m in enumerate(out) if isinstance(m, dict) and m.get("role") == "system"), None)
    if at is None:
        out.insert(0, {"role": "system", "content": ""})
        at = 0
    system = dict(out[at])
    if checked:
        existing = system.get("tools") or []
        system["tools"] = [*existing, *checked] if isinstance(existing, list) else checked
    if schema is not None:
        system["response_format"] = schema
    out[at] = system
    return out


# --------------------------------------------------------------------------- instructions

SYSTEM_REMINDER_TEMPLATE = "<system-reminder>\n{text}\n</system-reminder>"
"""How V4 and V3.2 carry a mid-conversation instruction: inside a user turn, tagged.

Neither family has a system token after the start of the prompt, so an instruction
given later is written where the conversation is, as a user turn holding this
text (DeepSeek's own converter, deepseek-recipe, renders Anthropic's mid-conversation
system messages exactly so); the family's renderer then joins it with the user
turn or tool results next to it by a blank line, as it joins any two user turns."""

_INSTRUCTION_ROLES = ("system", "developer")


def place_instructions(
    messages: list[dict[str, Any]], *, native_system_role: bool = False
) -> list[dict[str, Any]]:
    """A new message list where every instruction is a message the family renders faithfully.

    * ``system`` and ``developer`` messages before the first other message are the
      prompt's system text: they become one ``system`` message at index 0, contents
      joined by a blank line (the first one's other keys, such as ``tools``, kept).
      A ``developer`` message is an instruction (OpenAI's current name for a system
      message), never the user turn DeepSeek's reference encoders make of it.
    * A later ``system`` / ``developer`` message (a mid-conversation instruction) is
      kept in place as a ``system`` message when the family has a system token it
      may use anywhere (``native_system_role``, V4.1's ``<｜System｜>``); otherwise it
      becomes a ``user`` message whose content is :data:`SYSTEM_REMINDER_TEMPLATE`.
    * A conversation ending in an ``assistant`` message is a prefix to continue: that
      message is marked ``wo_eos`` (rendered without its end-of-sentence token, so the
      model writes on from its last character). See :func:`continues_assistant`.

    Input messages are never mutated. Content is read as the converters produce it
    (a string); a non-string content is left to the renderer to reject.
    """
    out: list[dict[str, Any]] = []
    leading: list[dict[str, Any]] = []
    n = len(messages)
    i = 0
    while i < n and isinstance(messages[i], dict) and messages[i].get("role") in _INSTRUCTION_ROLES:
        leading.append(messages[i])
        i += 1
    if leading:
        if len(leading) == 1 and leading[0].get("role") == "system":
            out.append(leading[0])
        else:
            merged = {k: v for k, v in leading[0].items() if k != "content"}
            merged["role"] = "system"
            merged["content"] = "\n\n".join(
                m["content"] for m in leading if isinstance(m.get("content"), str) and m["content"]
            )
            for m in leading[1:]:
                if m.get("tools"):
                    merged["tools"] = [*(merged.get("tools") or []), *m["tools"]]
            out.append(merged)
    rest = list(messages[i:])  # a copy: a following user message may be replaced below
    for k, m in enumerate(rest):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in _INSTRUCTION_ROLES:
            out.append(m)
            continue
        content = m.get("content")
        if native_system_role:
            out.append({"role": "system", "content": content})
            continue
        if not isinstance(content, str):
            out.append({"role": "user", "content": content})  # the renderer names the bad content
            continue
        reminder = SYSTEM_REMINDER_TEMPLATE.format(text=content)
        after = rest[k + 1] if k + 1 < len(rest) else None
        before = out[-1] if out else None
        # Joined to the user text next to it, as V4 joins adjacent user turns, so every family
        # (V3.2 renders each user message as its own turn) shows one turn holding both.
        if _is_text_user(after):
            rest[k + 1] = {**after, "content": reminder + "\n\n" + after["content"]}  # type: ignore[index]
        elif _is_text_user(before):
            out[-1] = {**before, "content": before["content"] + "\n\n" + reminder}  # type: ignore[index]
        else:
            out.append({"role": "user", "content": reminder})
    if out and isinstance(out[-1], dict) and out[-1].get("role") == "assistant":
        out[-1] = {**out[-1], "wo_eos": True}
    return out


def _is_text_user(m: Any) -> bool:
    return isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)


def continues_assistant(messages: list[dict[str, Any]]) -> bool:
    """Whether the prompt of ``messages`` ends inside an assistant turn (a prefix to continue).

    Then the model's output continues that turn's content: it starts after ``</think>``
    (the prefix's reasoning, if any, is already closed), so a parser must start in
    content mode. Raises :class:`RequestError` when the last assistant message has
    tool calls: there is nothing to continue after a call but its results.
    """
    if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") != "assistant":
        return False
    if messages[-1].get("tool_calls"):
        where = f"messages[{len(messages) - 1}]"
        raise RequestError(
            f"{where}: a conversation may end in an assistant message only to continue its text; this one "
            "has tool_calls, so send the tool results (role 'tool') after it",
            param=f"{where}.tool_calls",
        )
    return True


# --------------------------------------------------------------------------- 0731 tool normalisation

_FUNCTION_KEYS = ("name", "description", "parameters")


def normalize_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function tools as DeepSeek's official renderer writes them for the 0731 checkpoints.

    deepseek-recipe -- the renderer behind DeepSeek's API, whose effort texts are the
    ``official`` profile's -- rewrites each function before rendering, and the 0731
    checkpoints were tuned on prompts it produced: exactly ``name``, ``description``
    (default ``""``) and ``parameters`` (default ``{}``), in that order, other keys
    (``strict``, vendor extensions) dropped; with ``strict: true`` every object schema in
    the parameters gets ``additionalProperties: false`` and ``required`` (all properties
    unless given), written after its other keys. The April preview's reference encoder
    renders the function as sent (the golden fixtures pin that), so the ``preview``
    profile does not call this. Inputs are not mutated; shapes are not validated here.
    """
    out: list[dict[str, Any]] = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            out.append(tool)
            continue
        description = fn.get("description")
        parameters = fn.get("parameters")
        if parameters is None:
            parameters = {}
        if fn.get("strict") is True:
            parameters = _strict_schema(parameters)
        function = {
            "name": fn.get("name"),
            "description": description if isinstance(description, str) else "",
            "parameters": parameters,
        }
        out.append({**tool, "function": function})
    return out


def _strict_schema(schema: Any) -> Any:
    """OpenAI strict mode spelled out: every object closed and all of its properties required."""
    if isinstance(schema, list):
        return [_strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("additionalProperties", "required"):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _strict_schema(sub) for name, sub in value.items()}
        elif key in ("items", "anyOf", "oneOf", "allOf", "prefixItems"):
            out[key] = _strict_schema(value)
        else:
            out[key] = value
    if schema.get("type") == "object" or isinstance(schema.get("properties"), dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        out["additionalProperties"] = False
        required = schema.get("required")
        out["required"] = list(required) if isinstance(required, list) else list(props)
    return out
