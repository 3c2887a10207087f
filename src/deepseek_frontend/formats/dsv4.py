"""DeepSeek-V4 chat format: messages -> prompt segments, and strict completion parsing.

Mirrors DeepSeek's reference encoder ``encoding/encoding_dsv4.py`` (V4-Flash / V4-Pro
April preview; the 0731 refresh differs only in its reasoning-effort texts, selected
by ``reasoning_effort_profile``). The golden cases in
``shared/fixtures/dsv4-reference/dsv4_*.jsonl`` pin the output byte for byte.

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
from typing import Any

from deepseek_frontend.formats._common import (
    Item,
    ToolCall,
    check_thinking_mode,
    compile_template,
    expand_template,
    fail,
    merge_plain,
    optional_text,
    read_tool_calls,
    read_tool_schemas,
    required_text,
    to_json,
    type_name,
)
from deepseek_frontend.formats._dsml import (
    DsmlSpelling,
    lenient_arguments,
    parse_completion,
    render_tool_calls,
)
from deepseek_frontend.formats.segments import PromptSegment, join_segments

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

_TOOLS_TEMPLATE = """## Tools

You have access to a set of tools to help answer the user's question. \
You can invoke tools by writing a "<{dsml}tool_calls>" block like the following:

<{dsml}tool_calls>
<{dsml}invoke name="$TOOL_NAME">
<{dsml}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml}parameter>
...
</{dsml}invoke>
<{dsml}invoke name="$TOOL_NAME2">
...
</{dsml}invoke>
</{dsml}tool_calls>

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


@dataclass(frozen=True)
class V4Spellings:
    """Every token spelling and template text of one V4-style family.

    ``effort_prompts[profile][effort]`` is the text written before the first message
    in thinking mode; the keys of a profile's mapping are the efforts the encoder
    accepts (``None`` included), ``default_effort`` what ``None`` means.
    """

    bos: str = "<｜begin▁of▁sentence｜>"
    eos: str = "<｜end▁of▁sentence｜>"
    user: str = "<｜User｜>"
    assistant: str = "<｜Assistant｜>"
    latest_reminder: str = "<｜latest_reminder｜>"
    think_start: str = "<think>"
    think_end: str = "</think>"
    dsml: str = "｜DSML｜"
    tool_calls_block: str = "tool_calls"
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
    tools_template: str = _TOOLS_TEMPLATE
    response_format_template: str = (
        "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{schema}"
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
        fixed = (self.bos, self.eos, self.user, self.assistant, self.latest_reminder)
        return frozenset((*fixed, self.think_start, self.think_end, self.dsml, *self.tasks.values()))


DSV4_SPELLINGS = V4Spellings()
"""The DeepSeek-V4 table (V4-Flash, V4-Pro, preview and 0731)."""


class _Msg:
    """A typed message after tool folding.

    ``raw`` is the caller's dict (read-only); fields are validated when the message
    is rendered, because the reference never reads a message it drops (a developer
    message with empty content before the last user turn is legal in thinking mode).
    ``blocks`` (user messages only) holds ``("text", text, None, path)`` and
    ``("tool", content, tool_use_id, path)`` entries.
    """

    __slots__ = ("blocks", "from_context", "keep_reasoning", "path", "raw", "role", "task", "tool_calls")

    def __init__(
        self,
        role: Any,
        path: str,
        raw: Mapping[str, Any],
        task: Any = None,
        blocks: list[tuple[str, Any, Any, str]] | None = None,
        tool_calls: list[ToolCall] | tuple[()] = (),
        keep_reasoning: bool = True,
        from_context: bool = False,
    ) -> None:
        self.role = role
        self.path = path
        self.raw = raw
        self.task = task
        self.blocks = blocks
        self.tool_calls = tool_calls
        self.keep_reasoning = keep_reasoning
        self.from_context = from_context


_EMPTY: Mapping[str, Any] = {}


def _fold(raw_messages: Any, name: str, from_context: bool) -> list[_Msg]:
    """Type messages and fold tool results / consecutive user turns into single user messages."""
    if not isinstance(raw_messages, list):
        fail(name, f"must be a list of messages, got {type_name(raw_messages)}")
    out: list[_Msg] = []
    for i, raw in enumerate(raw_messages):
        path = f"{name}[{i}]"
        if not isinstance(raw, dict):
            fail(path, f"must be an object, got {type_name(raw)}")
        role = raw.get("role")
        if role == "tool":
            block = ("tool", raw.get("content", ""), raw.get("tool_call_id", ""), path)
            if out and out[-1].role == "user":
                out[-1].blocks.append(block)  # type: ignore[union-attr]
            else:
                out.append(_Msg("user", path, _EMPTY, blocks=[block], from_context=from_context))
        elif role == "user":
            block = ("text", raw.get("content", ""), None, path)
            # A user turn joins the previous user message unless that one carries a
            # task (its own task, if any, is then lost -- reference behaviour).
            if out and out[-1].role == "user" and out[-1].task is None:
                out[-1].blocks.append(block)  # type: ignore[union-attr]
            else:
                out.append(
                    _Msg("user", path, raw, task=raw.get("task"), blocks=[block], from_context=from_context)
                )
        else:
            calls = (
                read_tool_calls(raw.get("tool_calls"), f"{path}.tool_calls") if role == "assistant" else []
            )
            out.append(
                _Msg(role, path, raw, task=raw.get("task"), tool_calls=calls, from_context=from_context)
            )
    return out


def _sort_tool_results(msgs: list[_Msg]) -> None:
    """Order each user's tool results by the preceding assistant's call order.

    Results whose id is unknown sort as position 0 (the reference's default);
    the sort is stable and other blocks keep their places.
    """
    order: dict[Any, int] = {}
    for m in msgs:
        if m.role == "assistant" and m.tool_calls:
            order = {}
            for n, call in enumerate(m.tool_calls):
                if call.call_id:
                    try:
                        order[call.call_id] = n
                    except TypeError:
                        fail(f"{call.path}.id", "must be a string")
        elif m.role == "user" and m.blocks and order:
            slots = [k for k, b in enumerate(m.blocks) if b[0] == "tool"]
            if len(slots) < 2:
                continue

            ordered = sorted((m.blocks[k] for k in slots), key=lambda b, o=order: _rank(o, b))
            for k, block in zip(slots, ordered, strict=True):
                m.blocks[k] = block


def _rank(order: dict[Any, int], block: tuple[str, Any, Any, str]) -> int:
    try:
        return order.get(block[2], 0)
    except TypeError:  # an unhashable tool_call_id
        fail(f"{block[3]}.tool_call_id", "must be a string")


def _last_user_index(msgs: list[_Msg]) -> int:
    for i in range(len(msgs) - 1, -1, -1):
        if msgs[i].role in ("user", "developer"):
            return i
    return -1


_KEPT_ROLES = frozenset({"user", "system", "tool", "latest_reminder", "direct_search_results"})


def _drop_thinking(msgs: list[_Msg]) -> list[_Msg]:
    """Earlier turns lose their reasoning; developer/unknown messages before the last user go."""
    last_user = _last_user_index(msgs)
    out: list[_Msg] = []
    for i, m in enumerate(msgs):
        if m.role in _KEPT_ROLES or i >= last_user:
            out.append(m)
        elif m.role == "assistant":
            out.append(_Msg(m.role, m.path, m.raw, m.task, m.blocks, m.tool_calls, False, m.from_context))
    return out


class V4ChatFormat:
    """The V4 renderer and parser for one spellings table."""

    family: str

    def __init__(self, spellings: V4Spellings, family: str = "deepseek_v4") -> None:
        self.family = family
        self.spellings = spellings
        sp = spellings
        tokens = {"dsml": sp.dsml, "think_start": sp.think_start, "think_end": sp.think_end}
        self._tools = compile_template(sp.tools_template, tokens)
        self._response_format = compile_template(sp.response_format_template, tokens)
        self._dsml = DsmlSpelling(sp.bos, sp.eos, sp.think_start, sp.think_end, sp.dsml, sp.tool_calls_block)
        seg = PromptSegment
        self._bos = seg(sp.bos, True)
        self._eos = seg(sp.eos, True)
        self._user = seg(sp.user, True)
        self._assistant = seg(sp.assistant, True)
        self._reminder = seg(sp.latest_reminder, True)
        self._think_start = seg(sp.think_start, True)
        self._think_end = seg(sp.think_end, True)
        self._tasks = {name: seg(text, True) for name, text in sp.tasks.items()}
        self._sep = "\n\n"
        self.special_spellings = sp.special_spellings()

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

        ctx = _fold(context, "context", True) if context else []
        new = _fold(messages, "messages", False)
        full = ctx + new
        _sort_tool_results(full)

        out: list[Item] = []
        if add_default_bos_token and not ctx:
            out.append(self._bos)

        # Tools anywhere switch dropping off, so tool-related reasoning stays visible.
        # (Folded user messages have lost their tools, as in the reference.)
        drop = drop_thinking and not any(m.role != "user" and m.raw.get("tools") for m in full)
        if thinking and drop:
            full = _drop_thinking(full)
            # Reference quirk (quirk:context-count, also pinned by untagged cases): the
            # context's survivors are counted on the context alone. When the full
            # conversation drops a context developer message that the context alone
            # keeps, the first new messages are skipped. Reproduced for parity.
            start = len(_drop_thinking(ctx))
        else:
            start = len(ctx)

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
        last_user = _last_user_index(full)
        effort_text = prompts.get(reasoning_effort, "")
        for index in range(start, len(full)):
            if index == 0 and thinking and effort_text:
                out.append(effort_text)
            self._render_message(out, full, index, last_user, thinking, drop)
        return merge_plain(out)

    def encode_messages(
        self,
        messages: list[dict[str, Any]],
        thinking_mode: str,
        context: list[dict[str, Any]] | None = None,
        drop_thinking: bool = True,
        add_default_bos_token: bool = True,
        reasoning_effort: str | None = None,
        *,
        reasoning_effort_profile: str = "preview",
    ) -> str:
        """The prompt string: ``join_segments(render_prompt_segments(...))``."""
        return join_segments(
            self.render_prompt_segments(
                messages,
                thinking_mode,
                context,
                drop_thinking,
                add_default_bos_token,
                reasoning_effort,
                reasoning_effort_profile=reasoning_effort_profile,
            )
        )

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

    # --- rendering ---------------------------------------------------------------------------

    def _render_schemas(self, out: list[Item], m: _Msg) -> None:
        """The tools and response-format appendix of a system or developer message."""
        raw = m.raw
        if raw.get("tools"):
            functions = read_tool_schemas(raw["tools"], f"{m.path}.tools")
            schemas = "\n".join(to_json(f, f"{m.path}.tools") for f in functions)
            out.append(self._sep)
            expand_template(out, self._tools, schemas=schemas)
        if raw.get("response_format"):
            out.append(self._sep)
            schema = to_json(raw["response_format"], f"{m.path}.response_format")
            expand_template(out, self._response_format, schema=schema)

    def _user_blocks(self, out: list[Item], m: _Msg) -> None:
        sp = self.spellings
        parts: list[str] = []
        for kind, value, _tool_use_id, path in m.blocks or ():
            if kind == "text":
                parts.append(required_text(value, f"{path}.content"))
                continue
            if isinstance(value, list):
                texts: list[str] = []
                for j, part in enumerate(value):
                    if not isinstance(part, dict):
                        fail(f"{path}.content[{j}]", f"must be an object, got {type_name(part)}")
                    if part.get("type") == "text":
                        texts.append(required_text(part.get("text", ""), f"{path}.content[{j}].text"))
                    else:
                        texts.append(f"[Unsupported {part.get('type')}]")
                value = "\n\n".join(texts)
            else:
                value = required_text(value, f"{path}.content")
            parts.append(sp.tool_result_open + value + sp.tool_result_close)
        text = "\n\n".join(parts)
        if text:
            out.append(text)

    def _render_message(
        self,
        out: list[Item],
        full: list[_Msg],
        index: int,
        last_user: int,
        thinking: bool,
        drop: bool,
    ) -> None:
        m = full[index]
        role = m.role
        raw = m.raw
        if role == "system":
            content = optional_text(raw, "content", m.path)
            if content:
                out.append(content)
            self._render_schemas(out, m)
        elif role == "developer":
            content = raw.get("content")
            if not content:
                fail(f"{m.path}.content", "a developer message needs non-empty content")
            out.append(self._user)
            out.append(required_text(content, f"{m.path}.content"))
            self._render_schemas(out, m)
        elif role == "user":
            out.append(self._user)
            self._user_blocks(out, m)
        elif role == "latest_reminder":
            out.append(self._reminder)
            content = required_text(raw.get("content"), f"{m.path}.content")
            if content:
                out.append(content)
        elif role == "assistant":
            prev_has_task = index >= 1 and full[index - 1].task is not None
            if thinking and not prev_has_task and (not drop or index > last_user):
                reasoning = optional_text(raw, "reasoning_content", m.path) if m.keep_reasoning else ""
                if reasoning:
                    out.append(reasoning)
                out.append(self._think_end)
            content = optional_text(raw, "content", m.path)
            if content:
                out.append(content)
            if m.tool_calls:
                render_tool_calls(out, m.tool_calls, self._dsml, lenient_arguments)
            if not raw.get("wo_eos", False):
                out.append(self._eos)
        else:
            fail(
                f"{m.path}.role",
                f"unknown role {role!r} (expected system, developer, user, "
                "tool, assistant or latest_reminder)",
            )

        # What follows the message: nothing when the next message opens itself;
        # otherwise a task token, or the assistant turn opener after user input.
        if index + 1 < len(full) and full[index + 1].role not in ("assistant", "latest_reminder"):
            return
        if m.task is not None:
            task = self._tasks.get(m.task) if isinstance(m.task, str) else None
            if task is None:
                fail(f"{m.path}.task", f"unknown task {m.task!r} (expected one of {sorted(self._tasks)})")
            if m.task == "action":
                out.append(self._assistant)
                out.append(self._think_start if thinking else self._think_end)
            out.append(task)
        elif role in ("user", "developer"):
            out.append(self._assistant)
            # With drop on, only the last user turn opens thinking (a later user turn
            # cannot exist at that point, so index >= last_user means "is the last").
            open_thinking = thinking and (not drop or index >= last_user)
            out.append(self._think_start if open_thinking else self._think_end)


_V4 = V4ChatFormat(DSV4_SPELLINGS)
FAMILY = "deepseek_v4"
SPECIAL_SPELLINGS: frozenset[str] = _V4.special_spellings


# The module is the format object the registry hands out: its three entry points
# are the bound methods (same signatures and docstrings as on the class).
render_prompt_segments = _V4.render_prompt_segments
encode_messages = _V4.encode_messages
parse_message_from_completion_text = _V4.parse_message_from_completion_text
