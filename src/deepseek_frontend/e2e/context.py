"""What every conformance check is given and sends: :class:`SuiteContext` (the two clients, the model, a
per-run response memo) and the request material the checks share -- tool schemas, tools, prompts and the
DeepSeek ``thinking`` switches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name, for example Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
}
TIME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "description": "IANA time zone, for example Europe/Paris"}},
    "required": ["timezone"],
}
MEETING_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "attendees": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "duration_minutes": {"type": "integer", "minimum": 15, "maximum": 240},
        "recurring": {"type": "boolean"},
        "location": {
            "type": "object",
            "properties": {"room": {"type": "string"}, "floor": {"type": "integer"}},
            "required": ["room", "floor"],
        },
    },
    "required": ["attendees", "duration_minutes", "recurring", "location"],
}
#: Quotes, backslash, tab, newline, HTML, non-Latin scripts, emoji and U+2028: everything JSON must escape
#: or carry verbatim.
SPECIAL_TEXT = 'Say "hi" \\ to <b>Zoë</b> & 東京 😀\tnow\nthen | done\u2028.'
NOTE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"text": {"type": "string", "enum": [SPECIAL_TEXT]}},
    "required": ["text"],
}
EMPTY_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}
TOOL_RESULT = "Paris: 18 degrees Celsius, light rain. Report code ZX-41."


def openai_tool(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


WEATHER_TOOL = openai_tool("get_weather", "Get the current weather for a city.", WEATHER_SCHEMA)
TIME_TOOL = openai_tool("get_time", "Get the current local time in a time zone.", TIME_SCHEMA)
MEETING_TOOL = openai_tool("schedule_meeting", "Put a meeting in the calendar.", MEETING_SCHEMA)
NOTE_TOOL = openai_tool("save_note", "Save a note with the exact text given.", NOTE_SCHEMA)
SERVER_TIME_TOOL = openai_tool(
    "get_server_time", "Return the server's clock; takes no arguments.", EMPTY_SCHEMA
)

WEATHER_PROMPT = "What is the weather in Paris right now? Use the get_weather tool."
PARALLEL_PROMPT = "Get the weather in Paris and in Tokyo. Call get_weather for both cities in parallel."
THINKING_OFF: dict[str, Any] = {"thinking": {"type": "disabled"}}
THINKING_ON: dict[str, Any] = {"thinking": {"type": "enabled"}}


@dataclass
class SuiteContext:
    """What every check gets: the two clients, the model name, limits, and a per-run response memo."""

    openai: Any  #: openai.OpenAI
    anthropic: Any  #: anthropic.Anthropic
    model: str
    max_tokens: int = 4096
    _memo: dict[str, Any] = field(default_factory=dict)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()`` the first time ``key`` is asked for, the same value afterwards (an exception is
        remembered and re-raised too, so a judgement check reports the failed request it depends on)."""
        if key not in self._memo:
            try:
                self._memo[key] = (True, make())
            except Exception as exc:
                self._memo[key] = (False, exc)
        ok, value = self._memo[key]
        if not ok:
            raise value
        return value

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        """A non-streaming chat completion (``extra_body`` carries DeepSeek fields such as ``thinking``)."""
        return self.openai.chat.completions.create(
            model=self.model, messages=messages, max_tokens=self.max_tokens, **kwargs
        )

    def chat_stream(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
        """All chunks of a streamed chat completion, with usage requested."""
        stream = self.openai.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=self.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
        return list(stream)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]
