"""The tools the API tests declare, once, in each protocol's shape.

A test that declares ``get_weather`` to the Anthropic, Responses or Chat Completions API
sends the same tool in three spellings; :class:`Tool` holds it once and spells it for each
protocol, so a conversion test can say "the Anthropic tool became exactly the OpenAI one".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Tool:
    """A function tool: name, description and the JSON schema of its input."""

    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def openai(self) -> dict[str, Any]:
        """Chat Completions ``tools`` entry (also what the adapters convert every tool into)."""
        function = {"name": self.name, "description": self.description, "parameters": self.schema}
        return {"type": "function", "function": function}

    def anthropic(self) -> dict[str, Any]:
        """Anthropic Messages ``tools`` entry."""
        return {"name": self.name, "description": self.description, "input_schema": self.schema}

    def responses(self) -> dict[str, Any]:
        """OpenAI Responses ``tools`` entry."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.schema,
        }


WEATHER = Tool(
    "get_weather",
    "Get the current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
TIME = Tool("get_time", "Get the current time")
