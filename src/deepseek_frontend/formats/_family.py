"""What every family module is built from: the spellings table it extends and the
renderer base class that turns a table into segments, templates and a parser.

A family module (``dsv4``, ``dsv32``) holds only what differs: its table (a
:class:`Spellings` subclass with its own fields and texts) and its renderer's hot
loop (the rules that differ, e.g. V3.2's ``tool`` role vs V4's folded tool results).
Everything built from the table the same way in every family lives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deepseek_frontend.formats._common import (
    Message,
    PromptBuilder,
    compile_template,
    expand_template,
    field_text,
    read_tool_schemas,
    to_json,
)
from deepseek_frontend.formats._dsml import DsmlSpelling, parse_completion
from deepseek_frontend.formats.segments import PromptSegment

_RESPONSE_FORMAT_TEMPLATE = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{schema}"
)


@dataclass(frozen=True)
class Spellings:
    """The spellings and texts every DeepSeek family table has.

    The defaults are the tokens V4 and V3.2 spell alike. ``tool_calls_block`` and
    ``tools_template`` have none: each family words them itself, so a family table
    (a subclass) must set them. A subclass adds the fields only it has.
    """

    tool_calls_block: str
    """Name of the DSML element around the calls: ``tool_calls`` (V4), ``function_calls`` (V3.2)."""
    tools_template: str
    """The tools appendix, ``str.format`` syntax: ``{dsml}``, ``{think_start}``,
    ``{think_end}`` are spellings (special segments), ``{schemas}`` is request text."""
    bos: str = "<｜begin▁of▁sentence｜>"
    eos: str = "<｜end▁of▁sentence｜>"
    user: str = "<｜User｜>"
    assistant: str = "<｜Assistant｜>"
    think_start: str = "<think>"
    think_end: str = "</think>"
    dsml: str = "｜DSML｜"
    response_format_template: str = _RESPONSE_FORMAT_TEMPLATE
    """The response-format appendix; ``{schema}`` is request text."""
    invoke_tag: str = "invoke"
    """Name of the DSML call element (V4.1: `` invoke``: plain text after the ``｜DSML｜`` token)."""
    parameter_tag: str = "parameter"
    """Name of the DSML parameter element (V4.1: `` parameter``)."""

    def special_spellings(self) -> frozenset[str]:
        """Every spelling this family's renderer may emit as a special segment."""
        return frozenset(
            (self.bos, self.eos, self.user, self.assistant, self.think_start, self.think_end, self.dsml)
        )


_SCHEMA_SEPARATOR = "\n\n"
"""Written before each appendix (tools, response format)."""


class ChatFormat:
    """The renderer and parser of one family for one spellings table.

    Builds, once per table, what every render reuses: one special segment per
    spelling (``_bos``, ``_eos``, ``_user``, ``_assistant``, ``_think_start``,
    ``_think_end``), the compiled appendix templates and the DSML spellings. A
    family subclass adds ``render_prompt_segments`` (with ``encode_messages =
    joined(render_prompt_segments)``) and its hot loop.
    """

    family: str
    spellings: Spellings
    special_spellings: frozenset[str]
    """Every spelling the renderer may emit as special (the module's ``SPECIAL_SPELLINGS``)."""

    def __init__(self, spellings: Spellings, family: str) -> None:
        self.family = family
        self.spellings = sp = spellings
        tokens = {"dsml": sp.dsml, "think_start": sp.think_start, "think_end": sp.think_end}
        self._tools = compile_template(sp.tools_template, tokens)
        self._response_format = compile_template(sp.response_format_template, tokens)
        self._dsml = DsmlSpelling(
            sp.bos,
            sp.eos,
            sp.think_start,
            sp.think_end,
            sp.dsml,
            sp.tool_calls_block,
            sp.invoke_tag,
            sp.parameter_tag,
        )
        self._bos = PromptSegment(sp.bos, True)
        self._eos = PromptSegment(sp.eos, True)
        self._user = PromptSegment(sp.user, True)
        self._assistant = PromptSegment(sp.assistant, True)
        self._think_start = PromptSegment(sp.think_start, True)
        self._think_end = PromptSegment(sp.think_end, True)
        self.special_spellings = sp.special_spellings()

    def parse_message_from_completion_text(self, text: str, thinking_mode: str) -> dict[str, Any]:
        """Strictly parse one whole raw completion into an assistant message.

        ``text`` is everything generated after the prompt, normally ending with EOS.
        Returns ``{"role": "assistant", "content", "reasoning_content", "tool_calls"}``
        with OpenAI-shaped calls whose ``arguments`` string is built exactly as the
        reference builds it. Raises :class:`FormatError` for anything malformed or
        truncated that the reference rejects (a block cut right after an ``invoke``
        line is accepted, as there).
        """
        return parse_completion(text, thinking_mode, self._dsml)

    # --- rendering pieces both families write alike ------------------------------------------

    def _render_system(self, out: PromptBuilder, m: Message) -> None:
        """A system message: its content, if any, then its appendices."""
        if content := m.raw.get("content"):
            out.parts.append(content if content.__class__ is str else field_text(m, "content", content))
        self._render_schemas(out, m)

    def _render_schemas(self, out: PromptBuilder, m: Message) -> None:
        """The tools and response-format appendix of a system or developer message."""
        raw = m.raw
        if raw.get("tools"):
            functions = read_tool_schemas(raw["tools"], f"{m.path}.tools")
            schemas = "\n".join(to_json(f, f"{m.path}.tools") for f in functions)
            out.parts.append(_SCHEMA_SEPARATOR)
            expand_template(out, self._tools, schemas=schemas)
        if raw.get("response_format"):
            out.parts.append(_SCHEMA_SEPARATOR)
            schema = to_json(raw["response_format"], f"{m.path}.response_format")
            expand_template(out, self._response_format, schema=schema)
