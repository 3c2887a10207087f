"""DeepSeek-V4 chat format: messages -> prompt segments, and strict completion parsing.

Mirrors DeepSeek's reference encoder ``encoding/encoding_dsv4.py`` (V4-Flash / V4-Pro
April preview; the 0731 refresh differs only in its reasoning-effort texts, selected
by ``reasoning_effort_profile``). The golden cases in
``tests/fixtures/dsv4-reference/dsv4_*.jsonl`` pin the output byte for byte.

Every spelling and template text lives in :data:`DSV4_SPELLINGS`. A family variant
(V4.1 is expected to change a few spellings) is another :class:`V4Spellings` value
passed to :class:`V4ChatFormat`, not a copy of this module.

Pipeline, as in the reference, but each step is one pass over the conversation:

1. type each message (``messages[i]`` / ``context[i]`` paths kept for errors);
2. fold ``tool`` messages into user messages as tool-result blocks, and join
   consecutive user messages (the V4 format has no tool role);
3. order each user's tool results by the call order of the assistant before it;
4. in thinking mode with ``drop_thinking`` (and no tools anywhere), drop earlier
   turns' reasoning and the developer messages before the last user message;
5. render each message of the requested range. The reference looks for the last
   user message again for every message it renders, which is quadratic on long
   agent loops; here it is found once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, NoReturn, TypeVar

from deepseek_frontend.formats._common import (
    NO_CALLS,
    Message,
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
from deepseek_frontend.formats._dsml import dsml_example, lenient_arguments, render_tool_calls
from deepseek_frontend.formats._family import ChatFormat, Spellings
from deepseek_frontend.formats.segments import PromptSegment

_ABSOLUTE_MAXIMUM = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the "
    "root cause, rigorously stress-testing your logic against all potential paths, edge cases, and "
    "adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n"
)
_BEYOND_MAXIMUM = (
    "Reasoning Effort: Beyond maximum \u2014 exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
    "decompose the problem into its most fundamental components, trace every causal chain to its root, and "
    "resolve the underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are "
    "certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
)


def tools_template(block: str = "tool_calls", invoke: str = "invoke", parameter: str = "parameter") -> str:
    """The tools appendix of a V4-style family (``str.format`` syntax, see :attr:`Spellings.tools_template`).

    ``block``, ``invoke`` and ``parameter`` are the family's DSML element names (V4.1
    spells them `` calls``, `` invoke``, `` parameter``); the prose is otherwise the same.
    """
    return (
        """## Tools

You have access to a set of tools to help answer the user's question. \
You can invoke tools by writing a "<{dsml}"""
        + block
        + """>" block like the following:

"""
        + dsml_example(block, "TOOL_NAME", invoke, parameter)
        + """
String parameters should be specified as is and set `string="true"`. \
For all other types (numbers, booleans, arrays, objects), \
pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {think_start}), you MUST output your complete reasoning \
inside {think_start}...{think_end} BEFORE any tool calls or final response.

Otherwise, output directly after {think_end} with tool calls or final response.

### Available Tool Schemas

{schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""
    )


_TOOLS_TEMPLATE = tools_template()


@dataclass(frozen=True)
class V4Spellings(Spellings):
    """Every token spelling and template text of one V4-style family (the spellings
    V4 shares with V3.2 are the defaults of :class:`Spellings`).

    ``effort_prompts[profile][effort]`` is the text written before the first message
    in thinking mode; the keys of a profile's mapping are the efforts the encoder
    accepts (``None`` included), ``default_effort`` what ``None`` means.
    """

    tool_calls_block: str = "tool_calls"
    tools_template: str = _TOOLS_TEMPLATE
    latest_reminder: str = "<｜latest_reminder｜>"
    tasks: Mapping[str, str] = field(
        default_factory=lambda: {
            "action": "<｜action｜>",
            "query": "<｜query｜>",
            "authority": "<｜authority｜>",
            "domain": "<｜domain｜>",
            "title": "<｜title｜>",
            "read_url": "<｜read_url｜>",
        }
    )
    tool_result_open: str = "<tool_result>"
    tool_result_close: str = "</tool_result>"
    effort_prompts: Mapping[str, Mapping[str | None, str]] = field(
        default_factory=lambda: {
            # April preview encoder: only "max" writes a prefix.
            "preview": {None: "", "high": "", "max": _ABSOLUTE_MAXIMUM},
            # 0731 official encoder: DEFAULT_REASONING_EFFORT is "low" (no prefix);
            # "high" writes the preview's max text, "max" the newer one.
            "official": {None: "", "low": "", "high": _ABSOLUTE_MAXIMUM, "max": _BEYOND_MAXIMUM},
        }
    )

    def special_spellings(self) -> frozenset[str]:
        """Every spelling this family's renderer may emit as a special segment."""
        return super().special_spellings() | {self.latest_reminder, *self.tasks.values()}


DSV4_SPELLINGS = V4Spellings()
"""The DeepSeek-V4 table (V4-Flash, V4-Pro, preview and 0731)."""


class _Msg(NamedTuple):
    """A typed message after tool folding.

    ``raw`` is the caller's dict (read-only); fields are validated when the message
    is rendered, because the reference never reads a message it drops (a developer
    message with empty content before the last user turn is legal in thinking mode).
    ``blocks`` (user messages only) holds ``(is_tool, value, tool_call_id, index)``
    entries, ``index`` being the block's position in ``source``.

    A named tuple built with ``tuple.__new__``: one is built per message per render,
    and a class ``__init__`` cost more than the rest of typing a message. The path
    (``messages[3]``) is built only for an error message.
    """

    role: Any
    source: str
    """``"messages"`` or ``"context"``."""
    position: int
    """Index in ``source``."""
    raw: Mapping[str, Any]
    task: Any
    blocks: list[_Block] | None
    tool_calls: list[ToolCall]
    keep_reasoning: bool

    @property
    def path(self) -> str:
        return item_path(self.source, self.position)


_Block = tuple[bool, Any, Any, int]
_new_tuple = tuple.__new__
_EMPTY: Mapping[str, Any] = {}


def _fold(raw_messages: Any, source: str) -> tuple[list[_Msg], bool]:
    """Type messages and fold tool results / consecutive user turns into single user messages.

    Also returns whether a non-user message carries ``tools`` (which switches
    ``drop_thinking`` off), read in the same pass.
    """
    if raw_messages.__class__ is not list and not isinstance(raw_messages, list):
        fail(source, f"must be a list of messages, got {type_name(raw_messages)}")
    out: list[_Msg] = []
    append = out.append
    has_tools = False
    last: _Msg | None = None  # out[-1]
    for i, raw in enumerate(raw_messages):
        if raw.__class__ is not dict and not isinstance(raw, dict):
            fail(item_path(source, i), f"must be an object, got {type_name(raw)}")
        role = raw.get("role")
        if role == "tool":
            block = (True, raw.get("content", ""), raw.get("tool_call_id", ""), i)
            if last is not None and last.role == "user":
                last.blocks.append(block)  # type: ignore[union-attr]
                continue
            last = _new_tuple(_Msg, ("user", source, i, _EMPTY, None, [block], NO_CALLS, True))
        elif role == "user":
            block = (False, raw.get("content", ""), None, i)
            # A user turn joins the previous user message unless that one carries a
            # task (its own task, if any, is then lost -- reference behaviour).
            if last is not None and last.role == "user" and last.task is None:
                last.blocks.append(block)  # type: ignore[union-attr]
                continue
            last = _new_tuple(_Msg, ("user", source, i, raw, raw.get("task"), [block], NO_CALLS, True))
        else:
            # (Folded user messages lose their tools, as in the reference.)
            if not has_tools and raw.get("tools"):
                has_tools = True
            calls = read_tool_calls(raw.get("tool_calls"), source, i) if role == "assistant" else NO_CALLS
            last = _new_tuple(_Msg, (role, source, i, raw, raw.get("task"), None, calls, True))
        append(last)
    return out, has_tools


def _sort_tool_results(msgs: list[_Msg]) -> None:
    """Order each user's tool results by the preceding assistant's call order.

    Results whose id is unknown sort as position 0 (the reference's default);
    the sort is stable and other blocks keep their places. The call-order table is
    built only for a user message with two or more results to order.
    """
    calls: list[ToolCall] = NO_CALLS
    for m in msgs:
        if m.tool_calls and m.role == "assistant":
            calls = m.tool_calls
            for call in calls:
                # The ids key a table; an unhashable one is an error wherever it is.
                if call.call_id.__class__ is not str:
                    _check_hashable_id(call)
        elif calls and m.blocks is not None and len(m.blocks) > 1 and m.role == "user":
            blocks = m.blocks
            slots = [k for k, b in enumerate(blocks) if b[0]]
            order = {call.call_id: n for n, call in enumerate(calls) if call.call_id}
            if len(slots) < 2 or not order:
                continue
            ordered = sorted((blocks[k] for k in slots), key=lambda b, o=order, m=m: _rank(o, b, m))
            for k, block in zip(slots, ordered, strict=True):
                blocks[k] = block


def _check_hashable_id(call: ToolCall) -> None:
    try:
        hash(call.call_id)
    except TypeError:
        fail(f"{call.path}.id", "must be a string")


def _rank(order: dict[Any, int], block: _Block, m: _Msg) -> int:
    try:
        return order.get(block[2], 0)
    except TypeError:  # an unhashable tool_call_id
        fail(f"{item_path(m.source, block[3])}.tool_call_id", "must be a string")


_KEPT_ROLES = frozenset({"user", "system", "tool", "latest_reminder", "direct_search_results"})


def _drop_thinking(msgs: list[_Msg]) -> list[_Msg]:
    """Earlier turns lose their reasoning; developer/unknown messages before the last user go."""
    return drop_earlier_thinking(msgs, last_user_index(msgs))


_M = TypeVar("_M", bound=Any)
"""A family's message tuple (V4's or V4.1's ``_Msg``)."""


def drop_earlier_thinking(msgs: list[_M], last_user: int) -> list[_M]:
    """``msgs`` without what thinking mode hides before ``last_user`` (the family's last user turn).

    Messages from ``last_user`` on, and those of a kept role, stay; earlier assistant
    messages lose their reasoning; developer and unknown-role messages before it go.
    Works for any message tuple with ``role`` and ``keep_reasoning`` fields (V4, V4.1).
    """
    out: list[_M] = []
    for i, m in enumerate(msgs):
        if i >= last_user or _is_kept(m.role):
            out.append(m)
        elif m.role == "assistant":
            out.append(m._replace(keep_reasoning=False))
    return out


def _is_kept(role: Any) -> bool:
    try:
        return role in _KEPT_ROLES
    except TypeError:  # an unhashable role: not a kept one
        return False


class V4ChatFormat(ChatFormat):
    """The V4 renderer and parser for one spellings table."""

    spellings: V4Spellings

    def __init__(self, spellings: V4Spellings, family: str = "deepseek_v4") -> None:
        super().__init__(spellings, family)
        self._reminder = PromptSegment(spellings.latest_reminder, True)
        self._tasks = {name: PromptSegment(text, True) for name, text in spellings.tasks.items()}

    # --- public API --------------------------------------------------------------------------

    def render_prompt_segments(
        self,
        messages: list[dict[str, Any]],
        thinking_mode: str,
        context: list[dict[str, Any]] | None = None,
        drop_thinking: bool = True,
        add_default_bos_token: bool = True,
        reasoning_effort: str | None = None,
        *,
        reasoning_effort_profile: str = "preview",
    ) -> list[PromptSegment]:
        """Render ``messages`` (after the already-rendered ``context``) as prompt segments.

        Arguments mean what they mean for the reference ``encode_messages``:
        ``thinking_mode`` is ``"chat"`` or ``"thinking"``; ``context`` is an earlier
        prefix whose rendering is *not* returned; ``drop_thinking`` hides earlier
        turns' reasoning (ignored once any message carries tools);
        ``add_default_bos_token`` writes BOS when there is no context;
        ``reasoning_effort`` must be one the profile accepts (preview: None, "high",
        "max"; official: None, "low", "high", "max").

        Raises :class:`~deepseek_frontend.errors.FormatError` naming the message and
        field for every input the reference rejects, and for the Python accidents
        it would render (see docs/formats.md, "Quirks").
        """
        prompts = self.spellings.effort_prompts.get(reasoning_effort_profile)
        if prompts is None:
            fail(
                "reasoning_effort_profile",
                f"must be one of {sorted(self.spellings.effort_prompts)}, got {reasoning_effort_profile!r}",
            )
        thinking = thinking_mode == "thinking"
        full, start, drop = self._conversation(messages, context, thinking, drop_thinking)

        if start < len(full):
            # Checked only when something is rendered: the reference checks both
            # per rendered message, so an empty request renders without complaint.
            check_thinking_mode(thinking_mode)
            if not isinstance(reasoning_effort, str | None) or reasoning_effort not in prompts:
                allowed = ", ".join(repr(k) for k in prompts)
                fail(
                    "reasoning_effort",
                    f"{reasoning_effort!r} is not accepted by the {reasoning_effort_profile!r} profile "
                    f"(allowed: {allowed})",
                )
        bos = add_default_bos_token and not context  # no context: no folded context messages
        effort_text = prompts.get(reasoning_effort, "") if thinking else ""
        return build_segments(lambda out: self._render(out, full, start, bos, effort_text, thinking, drop))

    encode_messages = joined(render_prompt_segments)

    # The family's message pipeline (a V4-style family replaces these with its own).
    _fold = staticmethod(_fold)
    _sort_tool_results = staticmethod(_sort_tool_results)
    _drop_thinking = staticmethod(_drop_thinking)

    def _conversation(
        self, messages: Any, context: Any, thinking: bool, drop_thinking: bool
    ) -> tuple[list[Any], int, bool]:
        """``(full, start, drop)``: context and messages typed, folded and ordered (with
        earlier thinking dropped when ``drop`` is on), the index of the first message to
        render, and whether thinking is dropped (``drop_thinking`` and no tools anywhere).
        """
        ctx, ctx_tools = self._fold(context, "context") if context else ([], False)
        new, new_tools = self._fold(messages, "messages")
        full = ctx + new
        self._sort_tool_results(full)

        # Tools anywhere switch dropping off, so tool-related reasoning stays visible.
        drop = drop_thinking and not (ctx_tools or new_tools)
        if thinking and drop:
            full = self._drop_thinking(full)
            # Reference quirk (quirk:context-count, also pinned by untagged cases): the
            # context's survivors are counted on the context alone. When the full
            # conversation drops a context developer message that the context alone
            # keeps, the first new messages are skipped. Reproduced for parity.
            return full, len(self._drop_thinking(ctx)), drop
        return full, len(ctx), drop

    # --- rendering ---------------------------------------------------------------------------

    def _render(
        self,
        out: PromptBuilder,
        full: list[_Msg],
        start: int,
        bos: bool,
        effort_text: str,
        thinking: bool,
        drop: bool,
    ) -> None:
        """Append messages ``full[start:]`` (and BOS / the effort text) to ``out``.

        One loop over the messages with the common roles inline and everything it
        touches per message read into locals: this loop is the renderer's hot path
        (a method call and attribute lookups per message were a visible share).
        A special token is ``add(mark); special(segment)`` (see :class:`PromptBuilder`).

        V3.2's loop looks alike (same locals, same assistant tail) and stays separate
        on purpose: the role rules differ (folded tool results, tasks, ``wo_eos``,
        reasoning kept or dropped), and a shared per-role method would put a call per
        message back on this path.
        """
        parts = out.parts
        add = parts.append
        special = out.specials.append
        mark = out.mark
        user_seg, assistant_seg, eos_seg = self._user, self._assistant, self._eos
        think_start_seg, think_end_seg = self._think_start, self._think_end
        dsml = self._dsml
        last_user = last_user_index(full)
        n = len(full)
        if bos:
            add(mark)
            special(self._bos)
        for index in range(start, n):
            if index == 0 and effort_text:
                add(effort_text)
            m = full[index]
            role = m.role
            raw = m.raw
            if role == "assistant":
                # The previous message's task suppresses the thinking close (reference).
                after_task = index > 0 and full[index - 1].task is not None
                if thinking and (not drop or index > last_user) and not after_task:
                    if m.keep_reasoning and (reasoning := raw.get("reasoning_content")):
                        if reasoning.__class__ is not str:
                            reasoning = field_text(m, "reasoning_content", reasoning)
                        add(reasoning)
                    add(mark)
                    special(think_end_seg)
                if content := raw.get("content"):
                    add(content if content.__class__ is str else field_text(m, "content", content))
                if m.tool_calls:
                    render_tool_calls(out, m.tool_calls, dsml, lenient_arguments)
                if not raw.get("wo_eos", False):
                    add(mark)
                    special(eos_seg)
            elif role == "user":
                add(mark)
                special(user_seg)
                self._user_blocks(out, m)
            elif role == "system":
                self._render_system(out, m)
            elif role == "developer":
                content = raw.get("content")
                if not content:
                    fail(f"{m.path}.content", "a developer message needs non-empty content")
                add(mark)
                special(user_seg)
                add(content if content.__class__ is str else field_text(m, "content", content))
                self._render_schemas(out, m)
            elif role == "latest_reminder":
                out.special(self._reminder)
                add(checked_text(raw.get("content"), f"{m.path}.content"))
            else:
                fail_unknown_role(m)

            # What follows the message: nothing when the next message opens itself;
            # otherwise a task token, or the assistant turn opener after user input.
            if index + 1 < n and full[index + 1].role not in ("assistant", "latest_reminder"):
                continue
            if m.task is not None:
                self._render_task(out, m, thinking)
            elif role == "user" or role == "developer":
                add(mark)
                special(assistant_seg)
                # With drop on, only the last user turn opens thinking (a later user turn
                # cannot exist at that point, so index >= last_user means "is the last").
                add(mark)
                special(think_start_seg if thinking and (not drop or index >= last_user) else think_end_seg)

    def _render_task(self, out: PromptBuilder, m: _Msg, thinking: bool) -> None:
        """The task token after a message carrying ``task`` (``action`` opens the turn first)."""
        task = self._tasks.get(m.task) if isinstance(m.task, str) else None
        if task is None:
            fail(f"{m.path}.task", f"unknown task {m.task!r} (expected one of {sorted(self._tasks)})")
        if m.task == "action":
            out.special(self._assistant)
            out.special(self._think_start if thinking else self._think_end)
        out.special(task)

    def _user_blocks(self, out: PromptBuilder, m: _Msg) -> None:
        """A folded user message's text: its turns and tool results, joined by blank lines."""
        blocks = m.blocks or ()
        sp = self.spellings
        if len(blocks) == 1:
            # The common cases -- one user turn, or one tool result -- without a list.
            block = blocks[0]
            value = block[1]
            if not block[0]:
                out.parts.append(value if value.__class__ is str else _block_text(m, block))
            else:
                if value.__class__ is not str:
                    value = _tool_result_text(m, block)
                out.parts += (sp.tool_result_open, value, sp.tool_result_close)
            return
        texts: list[str] = []
        for block in blocks:
            is_tool, value = block[0], block[1]
            if not is_tool:
                texts.append(value if value.__class__ is str else _block_text(m, block))
                continue
            if value.__class__ is not str:
                value = _tool_result_text(m, block)
            texts.append(sp.tool_result_open + value + sp.tool_result_close)
        out.parts.append("\n\n".join(texts))


def fail_unknown_role(m: Message) -> NoReturn:
    """Refuse a message whose role the V4-style renderers do not know (V4 and V4.1 alike)."""
    fail(
        f"{m.path}.role",
        f"unknown role {m.role!r} (expected system, developer, user, tool, assistant or latest_reminder)",
    )


def _block_text(m: _Msg, block: _Block) -> str:
    return checked_text(block[1], f"{item_path(m.source, block[3])}.content")


def _tool_result_text(m: _Msg, block: _Block) -> str:
    """A tool result given as content parts: text parts joined, others as placeholders."""
    value = block[1]
    path = item_path(m.source, block[3])
    if not isinstance(value, list):
        return checked_text(value, f"{path}.content")
    texts: list[str] = []
    for j, part in enumerate(value):
        if not isinstance(part, dict):
            fail(f"{path}.content[{j}]", f"must be an object, got {type_name(part)}")
        if part.get("type") == "text":
            texts.append(checked_text(part.get("text", ""), f"{path}.content[{j}].text"))
        else:
            texts.append(f"[Unsupported {part.get('type')}]")
    return "\n\n".join(texts)


_V4 = V4ChatFormat(DSV4_SPELLINGS)
FAMILY = _V4.family
SPECIAL_SPELLINGS: frozenset[str] = _V4.special_spellings


# The module is the format object the registry hands out: its three entry points
# are the bound methods (same signatures and docstrings as on the class).
render_prompt_segments = _V4.render_prompt_segments
encode_messages = _V4.encode_messages
parse_message_from_completion_text = _V4.parse_message_from_completion_text
