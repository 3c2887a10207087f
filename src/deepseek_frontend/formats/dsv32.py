"""DeepSeek-V3.2 chat format: messages -> prompt segments, and strict completion parsing.

Mirrors DeepSeek's reference encoder ``encoding/encoding_dsv32.py`` (the one shipped
with the DeepSeek-V3.2 weights, which uses asserts; SGLang's adapted copy differs in
error types and template blank lines). The golden cases in
``tests/fixtures/dsv4-reference/dsv32_*.jsonl`` pin the output byte for byte.

Differences from V4 worth knowing: tool results stay separate ``tool`` messages
rendered inside ``<function_results>``; the assistant opener is written right
after every user turn; developer content is appended after its tools as "The
user's message is"; there is no ``latest_reminder`` role, no tasks and no
reasoning effort. All spellings and texts live in :data:`DSV32_SPELLINGS`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from deepseek_frontend.formats._common import (
    NO_CALLS,
    PromptBuilder,
    ToolCall,
    build_segments,
    check_thinking_mode,
    checked_text,
    fail,
    field_text,
    item_path,
    joined,
    last_user_index,
    read_tool_calls,
    type_name,
)
from deepseek_frontend.formats._dsml import dsml_example, render_tool_calls, strict_arguments
from deepseek_frontend.formats._family import ChatFormat, Spellings
from deepseek_frontend.formats.segments import PromptSegment

_TOOLS_TEMPLATE = (
    """## Tools

You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<{dsml}function_calls>" block like the following \
as part of your reply to the user:
"""
    + dsml_example("function_calls", "FUNCTION_NAME")
    + """
String and scalar parameters should be specified as is without any escaping or quotes, \
while lists and objects should use JSON format. The "string" attribute should be set to "true" \
for string type parameters and "false" for other types (numbers, booleans, arrays, objects).

If the thinking_mode is enabled, then after function results you should strongly consider \
outputting a thinking block. Here is an example:

<{dsml}function_calls>
...
</{dsml}function_calls>

<function_results>
...
</function_results>

{think_start}...thinking about results{think_end}

Here are the functions available in JSONSchema format:
<functions>
{schemas}
</functions>
"""
)


@dataclass(frozen=True)
class V32Spellings(Spellings):
    """Every token spelling and template text of the V3.2 family (the spellings it
    shares with V4 are the defaults of :class:`Spellings`)."""

    tool_calls_block: str = "function_calls"
    tools_template: str = _TOOLS_TEMPLATE
    developer_content_prefix: str = "\n\n# The user's message is: "
    results_open: str = "\n\n<function_results>"
    result_open: str = "\n<result>"
    result_close: str = "</result>"
    results_close: str = "\n</function_results>"


DSV32_SPELLINGS = V32Spellings()
"""The DeepSeek-V3.2 table."""

_DROP_KEPT_ROLES = ("user", "system", "tool", "assistant")


class _Msg(NamedTuple):
    """A typed message: its role, the caller's dict, where it came from, its tool calls.

    Built with ``tuple.__new__`` once per message per render; the path
    (``messages[3]``) is built only for an error message.
    """

    role: Any
    raw: Mapping[str, Any]
    source: str
    position: int
    """Index in ``source``."""
    calls: list[ToolCall]

    @property
    def path(self) -> str:
        return item_path(self.source, self.position)


_new_tuple = tuple.__new__


class V32ChatFormat(ChatFormat):
    """The V3.2 renderer and parser for one spellings table."""

    spellings: V32Spellings

    def __init__(self, spellings: V32Spellings, family: str = "deepseek_v32") -> None:
        super().__init__(spellings, family)

    def render_prompt_segments(
        self,
        messages: list[dict[str, Any]],
        thinking_mode: str,
        context: list[dict[str, Any]] | None = None,
        drop_thinking: bool = True,
        add_default_bos_token: bool = True,
    ) -> list[PromptSegment]:
        """Render ``messages`` (after the already-rendered ``context``) as prompt segments.

        Same meaning as the reference ``encode_messages``. Raises
        :class:`~deepseek_frontend.errors.FormatError` naming the message and field for
        every input the reference rejects, and for the Python accidents it would
        render (see docs/formats.md, "Quirks").
        """
        thinking = thinking_mode == "thinking"
        ctx = self._type(context, "context") if context else []
        new = self._type(messages, "messages")
        full = ctx + new
        if new:
            # Checked only when something is rendered, as the reference does.
            check_thinking_mode(thinking_mode)
        last_user = last_user_index(full)
        if new and thinking and drop_thinking:
            for m in full[: max(last_user, 0)]:
                if m.role not in _DROP_KEPT_ROLES:
                    # The reference drops this message but still renders as many
                    # messages as were given, so its indexes run past the end.
                    fail(
                        m.path,
                        f"a {m.role!r} message before the last user message cannot be rendered in "
                        "thinking mode with drop_thinking (the reference encoder fails on it)",
                    )
        anchors = _tool_anchors(full)
        bos = add_default_bos_token and not ctx
        start = len(ctx)
        return build_segments(lambda out: self._render(out, full, start, bos, last_user, anchors, thinking))

    encode_messages = joined(render_prompt_segments)

    # --- rendering ---------------------------------------------------------------------------

    @staticmethod
    def _type(raw_messages: Any, source: str) -> list[_Msg]:
        if raw_messages.__class__ is not list and not isinstance(raw_messages, list):
            fail(source, f"must be a list of messages, got {type_name(raw_messages)}")
        typed: list[_Msg] = []
        append = typed.append
        for i, raw in enumerate(raw_messages):
            if raw.__class__ is not dict and not isinstance(raw, dict):
                fail(item_path(source, i), f"must be an object, got {type_name(raw)}")
            role = raw.get("role")
            calls = read_tool_calls(raw.get("tool_calls"), source, i) if role == "assistant" else NO_CALLS
            append(_new_tuple(_Msg, (role, raw, source, i, calls)))
        return typed

    def _render(
        self,
        out: PromptBuilder,
        full: list[_Msg],
        start: int,
        bos: bool,
        last_user: int,
        anchors: list[int],
        thinking: bool,
    ) -> None:
        """Append messages ``full[start:]`` (and BOS) to ``out``: the hot loop, with the
        roles inline and what it touches per message in locals (as in :mod:`.dsv4`).

        Kept apart from V4's look-alike loop on purpose: here ``tool`` messages are
        their own role inside ``<function_results>``, the assistant opener follows every
        user turn, and reasoning after the last user turn is required (see
        ``V4ChatFormat._render`` on why the roles are not shared methods).
        """
        sp = self.spellings
        parts = out.parts
        add = parts.append
        special = out.specials.append
        mark = out.mark
        user_seg, assistant_seg, eos_seg = self._user, self._assistant, self._eos
        think_start_seg, think_end_seg = self._think_start, self._think_end
        dsml = self._dsml
        if bos:
            add(mark)
            special(self._bos)
        for index in range(start, len(full)):
            m = full[index]
            role = m.role
            raw = m.raw
            if role == "assistant":
                calls = m.calls
                if thinking and index > last_user:
                    reasoning = raw.get("reasoning_content")
                    if not (reasoning or calls):
                        fail(
                            f"{m.path}.reasoning_content",
                            "in thinking mode an assistant message after the last user message needs "
                            "reasoning_content or tool_calls",
                        )
                    if reasoning:
                        if reasoning.__class__ is not str:
                            reasoning = field_text(m, "reasoning_content", reasoning)
                        add(reasoning)
                    add(mark)
                    special(think_end_seg)
                if content := raw.get("content"):
                    add(content if content.__class__ is str else field_text(m, "content", content))
                if calls:
                    render_tool_calls(out, calls, dsml, strict_arguments)
                # wo_eos: an assistant prefix the model continues (formats.request.place_instructions);
                # V4's reference reads the same key.
                if not raw.get("wo_eos", False):
                    add(mark)
                    special(eos_seg)
            elif role == "tool":
                anchor = anchors[index]
                if anchor < 0 or full[anchor].role != "assistant":
                    # (quirk:negative-index) The reference wraps around to the last
                    # message when a tool result opens the conversation.
                    fail(f"{m.path}.role", "a tool message must follow an assistant message with tool_calls")
                order = index - anchor
                expected = len(full[anchor].calls)
                if expected < order:
                    fail(m.path, f"more tool results than the {expected} tool call(s) of {full[anchor].path}")
                content = raw.get("content")
                if content.__class__ is not str:
                    content = _str_or_none(content, f"{m.path}.content")
                if order == 1:
                    add(sp.results_open)
                parts += (sp.result_open, content, sp.result_close)
                if order == expected:
                    add(sp.results_close)
                    add("\n\n")
                    add(mark)
                    special(think_start_seg if thinking and index >= last_user else think_end_seg)
            elif role == "user" or role == "developer":
                content = raw.get("content")
                add(mark)
                special(user_seg)
                if role == "developer":
                    if not content:
                        fail(f"{m.path}.content", "a developer message needs non-empty content")
                    self._render_schemas(out, m)
                    add(sp.developer_content_prefix)
                if content.__class__ is not str:
                    content = _str_or_none(content, f"{m.path}.content")
                add(content)
                add(mark)
                special(assistant_seg)
                add(mark)
                special(think_start_seg if thinking and index == last_user else think_end_seg)
            elif role == "system":
                self._render_system(out, m)
            else:
                expected_roles = "system, developer, user, tool or assistant"
                fail(f"{m.path}.role", f"unknown role {role!r} (expected {expected_roles})")


def _str_or_none(value: Any, path: str) -> str:
    """User and tool text as V3.2 writes it: with str(), so null (or absent) is "None".

    Untagged golden cases pin ``None`` for V3.2 user turns, so it is reproduced
    (``quirk:none-rendered``); other non-strings would be a Python repr and are refused.
    """
    if value is None:
        return "None"
    return checked_text(value, path)


def _tool_anchors(full: list[_Msg]) -> list[int]:
    """For each index, the nearest earlier non-tool message (-1 if none): one pass, not one per tool."""
    anchors: list[int] = []
    last = -1
    for i, m in enumerate(full):
        anchors.append(last)
        if m.role != "tool":
            last = i
    return anchors


_V32 = V32ChatFormat(DSV32_SPELLINGS)
FAMILY = _V32.family
SPECIAL_SPELLINGS: frozenset[str] = _V32.special_spellings
TOOL_REFERENCE_TEMPLATE = (
    "Here are the functions available in JSONSchema format:\n<functions>\n{schemas}\n</functions>"
)
"""How a tool result lists the tools it loads (``formats.request.expand_tool_references``): the
schema part of :data:`_TOOLS_TEMPLATE`, word for word (V4 and V4.1 use ``request``'s default)."""


# The module is the format object the registry hands out: its three entry points
# are the bound methods (same signatures and docstrings as on the class).
render_prompt_segments = _V32.render_prompt_segments
encode_messages = _V32.encode_messages
parse_message_from_completion_text = _V32.parse_message_from_completion_text
