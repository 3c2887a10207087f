"""Which tools a constrained ``tool_choice`` allows, read from the request's ``tools``.

:func:`normalize_tool` reads one tool in any of the accepted shapes (OpenAI, flat, Anthropic) as
``(name, parameters schema)``; :func:`resolve_tool_choice` turns ``tool_choice`` into the list of
tool names the grammar may call. Both raise :class:`RequestError` for requests that cannot be
enforced. Pure functions, no grammar text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from deepseek_frontend.errors import RequestError

__all__ = ["normalize_tool", "resolve_tool_choice"]


def normalize_tool(tool: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(name, parameters_schema)`` of one tool in OpenAI, flat or Anthropic form.

    Accepts ``{"type": "function", "function": {"name", "parameters"}}``,
    ``{"name", "parameters"}`` and Anthropic's ``{"name", "input_schema"}``.
    """
    fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError("tool without a name", param="tools")
    params = fn.get("parameters", fn.get("input_schema")) or {"type": "object", "properties": {}}
    if not isinstance(params, Mapping):
        raise RequestError(f"tool {name!r}: parameters must be a JSON schema object", param="tools")
    return name, dict(params)


def resolve_tool_choice(tool_choice: Any, names: Sequence[str]) -> list[str]:
    """The tool names a constrained ``tool_choice`` allows, in declaration order.

    ``"required"`` / ``"any"`` (or ``{"type": "any"}``) allow every tool; a named choice --
    ``{"type": "function", "function": {"name": N}}``, Anthropic ``{"type": "tool", "name": N}``
    -- allows exactly ``N``. Raises :class:`RequestError` for ``auto``/``none`` (nothing to
    enforce), an unknown name, or an empty tool list.
    """
    if not names:
        raise RequestError("tool_choice requires at least one tool in 'tools'", param="tool_choice")
    if tool_choice in ("required", "any") or (
        isinstance(tool_choice, Mapping) and tool_choice.get("type") in ("any", "required")
    ):
        return list(names)
    if isinstance(tool_choice, Mapping):
        fn = tool_choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else tool_choice.get("name")
        if isinstance(name, str):
            if name not in names:
                raise RequestError(
                    f"tool_choice names {name!r}, which is not in 'tools'", param="tool_choice"
                )
            return [name]
    raise RequestError(f"tool_choice {tool_choice!r} is not a constraint", param="tool_choice")
