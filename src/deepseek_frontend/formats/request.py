"""Request-level pieces the DeepSeek formats expect on a message.

OpenAI requests carry ``tools`` and ``response_format`` beside the messages; the
DeepSeek encoders read them from a system (or developer) message. Where they go
decides the prompt, so it is decided here, once, for every API.
"""

from __future__ import annotations

from typing import Any

from deepseek_frontend.errors import RequestError


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


def attach_request_tools(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    response_format: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """A new message list with request-level ``tools`` / JSON schema where the encoders read them.

    They go on the first ``system`` message (after any tools it already has). With
    no system message, an empty-content one is inserted at index 0: that renders
    ``BOS + "\\n\\n## Tools ..."`` before the first user turn, exactly what DeepSeek's
    official renderer produces for a request with tools and no system prompt.
    The input list and its dicts are never mutated. Raises :class:`RequestError`
    naming ``tools[i]`` / ``response_format`` for shapes the format cannot use.
    """
    out = list(messages)
    checked = _check_tools(tools) if tools else []
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
