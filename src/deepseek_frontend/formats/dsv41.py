"""DeepSeek-V4.1 chat format: messages (text and images) -> prompt segments, and strict parsing.

Mirrors DeepSeek's reference encoder ``encoding/encoding.py`` of DeepSeek-V4.1-Flash
(release revision, 2026-09-10). The golden cases in ``tests/formats/dsv41_fixtures/``
pin the output byte for byte. V4.1 is V4 with these changes (all in
:data:`DSV41_SPELLINGS` or in :meth:`V41ChatFormat._render`):

* ``<｜System｜>`` opens the prompt (index 0) when the first message is a system
  message or an effort line is written; a system message later in the conversation
  writes its own ``<｜System｜>``, counts as a user turn for "the last user message"
  and is followed by the assistant header like a user turn;
* reasoning effort is a number: ``Reasoning Effort: {N} (range 1-100, ...)`` in
  thinking mode, ``N`` an integer 1-100 or a word of the checkpoint's table (see
  :data:`EFFORT_TABLES`; default ``high``);
* spaced DSML: ``<｜DSML｜ calls>``, ``<｜DSML｜ invoke name=...>``,
  ``<｜DSML｜ parameter ...>`` -- `` calls`` is ordinary text after the ``｜DSML｜`` token;
* no developer role: the reference refuses one; here a developer message is a system
  message (``<｜System｜>``, also mid-conversation); tool results fold
  into the next user turn as ``<tool_result>`` blocks (as V4), also from Anthropic-style
  ``tool_result`` content parts;
* content given as a list of parts: text parts joined by a blank line, and one
  ``<｜deepseek_image｜>`` special token per image;
* tool-call arguments: a dict is taken as is and a doubly JSON-encoded string is
  decoded twice; anything else that is not a JSON object becomes one ``arguments``
  parameter.

Images (for the images engineer)
--------------------------------
An image is a content part of a message's ``content`` list, in any role, and inside
an Anthropic-style ``tool_result`` part's ``content`` list. Three spellings are
accepted: an :class:`ImagePart` (the typed part the API converters fill: URL or bytes
reference plus dimensions), an OpenAI ``{"type": "image_url", "image_url": {"url": ...}}``
dict or an Anthropic-style ``{"type": "image", "source" | "url" | "data": ...}`` dict.
Each renders as exactly one special ``<｜deepseek_image｜>`` segment (the engine expands
it), and ``encode_messages(..., return_multi_modal_data=True)`` /
``render_prompt_segments(..., images=[])`` report one record per placeholder **in
prompt order**: the :class:`ImagePart` itself, or for a dict the reference's record
(``{"type": "image", "url": ...}``). A ``<｜deepseek_image｜>`` typed in request text is
ordinary text (the reference rejects it; refusing wedges conversations whose clients
resend the failing turn).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from deepseek_frontend.formats._common import (
    NO_CALLS,
    PromptBuilder,
    ToolCall,
    build_segments,
    check_thinking_mode,
    fail,
    from_json,
    item_path,
    read_tool_calls,
    read_tool_schemas,
    type_name,
)
from deepseek_frontend.formats._dsml import render_tool_calls
from deepseek_frontend.formats.dsv4 import (
    V4ChatFormat,
    V4Spellings,
    drop_earlier_thinking,
    fail_unknown_role,
    tools_template,
)
from deepseek_frontend.formats.segments import PromptSegment, join_segments

_TOOLS_TEMPLATE = tools_template(" calls", " invoke", " parameter")

EFFORT_TABLES: Mapping[str, Mapping[str, int]] = {
    # The release encoder (2026-09-10): REASONING_EFFORT_MAPPINGS low/high/max.
    "release": {"low": 50, "high": 75, "max": 100},
    # The pre-release table (four words, 25 apart) that SGLang shipped by mistake; a
    # checkpoint trained on it is served with --reasoning-effort-profile prerelease.
    "prerelease": {"low": 25, "medium": 50, "high": 75, "max": 100},
}
"""Effort word -> budget, per checkpoint setting (``reasoning_effort_profile``)."""

V41_EFFORT_PROFILES: tuple[str, ...] = tuple(EFFORT_TABLES)


@dataclass(frozen=True)
class ImagePart:
    """One image of a message, as the API converters hand it to the format.

    ``url`` (a ``data:``/``http(s):`` URL or a path) or ``data`` (the encoded bytes)
    says where the image is; ``media_type``, ``width`` and ``height`` are what the
    converter read from the image header (``None`` when not known). The format reads
    none of these: it writes one ``<｜deepseek_image｜>`` token per part and returns the
    part itself as the image's record, so whatever the engine hand-off needs can ride
    along (``extra``).
    """

    url: str | None = None
    data: bytes | None = None
    media_type: str | None = None
    width: int | None = None
    height: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class V41Spellings(V4Spellings):
    """The V4.1 table: V4's spellings plus ``<｜System｜>``, the image token, spaced DSML
    element names and the numeric effort line."""

    tool_calls_block: str = " calls"
    invoke_tag: str = " invoke"
    parameter_tag: str = " parameter"
    tools_template: str = _TOOLS_TEMPLATE
    system: str = "<｜System｜>"
    image: str = "<｜deepseek_image｜>"
    effort_template: str = (
        "Reasoning Effort: {budget} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
    )
    effort_tables: Mapping[str, Mapping[str, int]] = field(default_factory=lambda: EFFORT_TABLES)
    default_effort: str = "high"
    effort_prompts: Mapping[str, Mapping[str | None, str]] = field(default_factory=dict)
    """(V4's word texts; V4.1 writes :attr:`effort_template` instead.)"""

    def special_spellings(self) -> frozenset[str]:
        return super().special_spellings() | {self.system, self.image}


DSV41_SPELLINGS = V41Spellings()
"""The DeepSeek-V4.1-Flash table."""


class _Image(NamedTuple):
    """An image inside rendered content: written as one image token, ``record`` reported."""

    record: Any


class _Bad(NamedTuple):
    """Content the renderer refuses, reported only if the message is rendered: the reference
    never reads a context message's content, so a bad one there is no error."""

    path: str
    value: Any


Pieces = str | list[Any]
"""Rendered content: a string, or a list of strings and :class:`_Image` entries (or a :class:`_Bad`)."""

_SEP = "\n\n"


class _Msg(NamedTuple):
    """A typed V4.1 message after tool folding (see ``dsv4._Msg``).

    ``blocks`` (user messages) holds ``(is_tool, pieces, tool_use_id)`` entries;
    ``content`` (other roles) the message's content as pieces, ``None`` when absent.
    """

    role: Any
    source: str
    position: int
    raw: Mapping[str, Any]
    task: Any
    blocks: list[tuple[bool, Any, Any]] | None
    content: Any
    tool_calls: list[ToolCall]
    keep_reasoning: bool

    @property
    def path(self) -> str:
        return item_path(self.source, self.position)


_new_tuple = tuple.__new__
_EMPTY: Mapping[str, Any] = {}
_ABSENT = object()


def _image_record(part: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The reference's record of an image dict part (its ``_extract_image``)."""
    record: dict[str, Any] = {"type": "image"}
    if part.get("type") == "image_url":
        image_url = part.get("image_url")
        if isinstance(image_url, str):
            record["url"] = image_url
        elif image_url is None or isinstance(image_url, dict):
            record["url"] = (image_url or {}).get("url", "")
        else:
            fail(f"{path}.image_url", f"must be an object with a url, got {type_name(image_url)}")
    else:
        for key in ("source", "url", "data"):
            if key in part:
                record[key] = part[key]
    if not any(record.get(key) for key in ("source", "url", "data")):
        fail(path, "an image part needs a non-empty source, url or data")
    return record


def _is_image(part: Any) -> bool:
    return part.__class__ is ImagePart or (
        part.__class__ is dict and part.get("type") in ("image", "image_url")
    )


def _joined(pieces_list: list[Any]) -> Pieces:
    """Pieces joined by a blank line; a plain string when no image is involved."""
    if all(p.__class__ is str for p in pieces_list):
        return _SEP.join(pieces_list)
    out: list[Any] = []
    for k, pieces in enumerate(pieces_list):
        if k:
            out.append(_SEP)
        if pieces.__class__ is list:
            out.extend(pieces)
        else:
            out.append(pieces)
    return out


def _part_text(part: Mapping[str, Any], path: str) -> str:
    text = part.get("text", "")
    if not isinstance(text, str):
        fail(f"{path}.text", f"must be a string, got {type_name(text)}")
    return text


def _flat_parts(parts: list[Any], path: str) -> Pieces:
    """Content parts of a non-user message (or a tool message): text parts and images
    joined by a blank line; other parts are left out, as in the reference."""
    texts: list[Any] = []
    for j, part in enumerate(parts):
        if _is_image(part):
            texts.append(
                [_Image(part if part.__class__ is ImagePart else _image_record(part, f"{path}[{j}]"))]
            )
        elif isinstance(part, dict) and part.get("type") == "text":
            texts.append(_part_text(part, f"{path}[{j}]"))
    return _joined(texts)


def _text_value(value: Any, path: str, *, absent_ok: bool) -> Pieces:
    """A content field: a string, or content parts; ``None`` / non-strings are refused
    (the reference would write ``None`` or a Python repr)."""
    if value.__class__ is str:
        return value
    if value is _ABSENT and absent_ok:
        return ""
    if isinstance(value, list):
        return _flat_parts(value, path)
    if isinstance(value, str):
        return str(value)
    fail(
        path,
        f"must be a string or a list of content parts, got {type_name(None if value is _ABSENT else value)}",
    )


def _tool_result_parts(parts: list[Any], path: str) -> Pieces:
    """An Anthropic-style tool_result's content list: texts, images, others as placeholders."""
    texts: list[Any] = []
    for j, part in enumerate(parts):
        if _is_image(part):
            texts.append(
                [_Image(part if part.__class__ is ImagePart else _image_record(part, f"{path}[{j}]"))]
            )
        elif not isinstance(part, dict):
            fail(f"{path}[{j}]", f"must be an object, got {type_name(part)}")
        elif part.get("type") == "text":
            texts.append(_part_text(part, f"{path}[{j}]"))
        else:
            texts.append(f"[Unsupported {part.get('type')}]")
    return _joined(texts)


def _user_blocks(content: Any, path: str) -> list[tuple[bool, Any, Any]]:
    """A user message's content as blocks ``(is_tool, pieces, tool_use_id)``."""
    if content.__class__ is str:
        return [(False, content, None)]
    if content is _ABSENT:
        return [(False, "", None)]
    if not isinstance(content, list):
        if isinstance(content, str):
            return [(False, str(content), None)]
        return [(False, _Bad(path, content), None)]
    blocks: list[tuple[bool, Any, Any]] = []
    for j, part in enumerate(content):
        where = f"{path}[{j}]"
        if _is_image(part):
            record = part if part.__class__ is ImagePart else _image_record(part, where)
            blocks.append((False, [_Image(record)], None))
        elif not isinstance(part, dict):
            fail(where, f"must be an object, got {type_name(part)}")
        elif part.get("type") == "text":
            blocks.append((False, _part_text(part, where), None))
        elif part.get("type") == "tool_result":
            value = part.get("content", "")
            if isinstance(value, list):
                value = _tool_result_parts(value, f"{where}.content")
            elif not isinstance(value, str):
                value = _Bad(f"{where}.content", value)
            blocks.append((True, value, part.get("tool_use_id", "")))
        else:
            blocks.append((False, f"[Unsupported {part.get('type')}]", None))
    return blocks


def _fold(raw_messages: Any, source: str) -> tuple[list[_Msg], bool]:
    """Type messages, fold tool messages and consecutive user turns into user messages.

    Returns the messages and whether any of them carries ``tools`` (which keeps the
    reasoning of the whole conversation). A folded user message keeps the first
    turn's fields (``task``, ``tools``), as the reference's merge does.
    """
    if not isinstance(raw_messages, list):
        fail(source, f"must be a list of messages, got {type_name(raw_messages)}")
    out: list[_Msg] = []
    has_tools = False
    last: _Msg | None = None
    for i, raw in enumerate(raw_messages):
        path = item_path(source, i)
        if not isinstance(raw, dict):
            fail(path, f"must be an object, got {type_name(raw)}")
        if "content_blocks" in raw:
            fail(f"{path}.content_blocks", "is not supported; send the parts as a content list")
        role = raw.get("role")
        if role == "developer":
            # V4.1 has no developer role (the reference raises); OpenAI clients send their
            # instructions as developer messages, and V4.1's native place for them is <｜System｜>.
            role = "system"
        content = raw.get("content", _ABSENT)
        if role == "tool":
            if content is _ABSENT or isinstance(content, str | list):
                value = _text_value(content, f"{path}.content", absent_ok=True)
            else:
                value = _Bad(f"{path}.content", content)
            block = (True, value, raw.get("tool_call_id", ""))
            if last is not None and last.role == "user":
                last.blocks.append(block)  # type: ignore[union-attr]
                continue
            last = _new_tuple(_Msg, ("user", source, i, _EMPTY, None, [block], None, NO_CALLS, True))
        elif role == "user":
            blocks = _user_blocks(content, f"{path}.content")
            if last is not None and last.role == "user" and last.task is None:
                last.blocks.extend(blocks)  # type: ignore[union-attr]
                continue
            if raw.get("tools"):
                has_tools = True
            last = _new_tuple(_Msg, ("user", source, i, raw, raw.get("task"), blocks, None, NO_CALLS, True))
        else:
            if raw.get("tools"):
                has_tools = True
            calls = read_tool_calls(raw.get("tool_calls"), source, i) if raw.get("tool_calls") else NO_CALLS
            last = _new_tuple(_Msg, (role, source, i, raw, raw.get("task"), None, content, calls, True))
        out.append(last)
    return out, has_tools


def _sort_tool_results(msgs: list[_Msg]) -> None:
    """Order each user's tool results by the call order of the assistant before it
    (unknown ids rank 0; stable; other blocks keep their places)."""
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
            blocks = m.blocks
            slots = [k for k, b in enumerate(blocks) if b[0]]
            if len(slots) < 2:
                continue

            def rank(block: tuple[bool, Any, Any], m: _Msg = m, order: dict[Any, int] = order) -> int:
                try:
                    return order.get(block[2], 0)
                except TypeError:
                    fail(f"{m.path}.tool_call_id", "must be a string")

            ordered = sorted((blocks[k] for k in slots), key=rank)
            for k, block in zip(slots, ordered, strict=True):
                blocks[k] = block


def _last_user(msgs: list[_Msg]) -> int:
    """The last user message, a system message after the first counting as one."""
    for i in range(len(msgs) - 1, -1, -1):
        role = msgs[i].role
        if role == "user" or (role == "system" and i > 0):
            return i
    return -1


def _drop_thinking(msgs: list[_Msg]) -> list[_Msg]:
    """Earlier turns lose their reasoning; developer/unknown messages before the last user go."""
    return drop_earlier_thinking(msgs, _last_user(msgs))


def _v41_arguments(call: ToolCall) -> dict[str, Any]:
    """V4.1's reading of ``function.arguments``: a dict as is, a JSON object string
    (decoded up to twice, for doubly encoded arguments), else one ``arguments``
    parameter holding the raw value."""
    raw = call.arguments
    value = raw
    if not isinstance(value, dict):
        for _ in range(2):
            if not isinstance(value, str):
                break
            try:
                value = from_json(value)
            except Exception:  # the reference's catch-all: not JSON keeps the raw text
                break
        if not isinstance(value, dict):
            return {"arguments": raw}
    for key in value:
        if not isinstance(key, str):
            fail(f"{call.path}.function.arguments", f"keys must be strings, got {type_name(key)}")
    return value


class V41ChatFormat(V4ChatFormat):
    """The V4.1 renderer and parser for one spellings table."""

    spellings: V41Spellings

    # V4.1's message pipeline, run by :meth:`V4ChatFormat._conversation`.
    _fold = staticmethod(_fold)
    _sort_tool_results = staticmethod(_sort_tool_results)
    _drop_thinking = staticmethod(_drop_thinking)

    def __init__(self, spellings: V41Spellings, family: str = "deepseek_v41") -> None:
        super().__init__(spellings, family)
        self._system = PromptSegment(spellings.system, True)
        self._image = PromptSegment(spellings.image, True)

    def effort_budget(self, reasoning_effort: Any, profile: str = "release") -> int:
        """The number the effort line writes for ``reasoning_effort`` (``None`` is the
        table's default word); :class:`FormatError` for anything the encoder rejects."""
        table = self.spellings.effort_tables.get(profile)
        if table is None:
            fail(
                "reasoning_effort_profile",
                f"must be one of {sorted(self.spellings.effort_tables)}, got {profile!r}",
            )
        effort = self.spellings.default_effort if reasoning_effort is None else reasoning_effort
        if effort.__class__ is int and 1 <= effort <= 100:
            return int(effort)
        if isinstance(effort, str) and effort in table:
            return table[effort]
        words = ", ".join(repr(w) for w in table)
        fail(
            "reasoning_effort",
            f"{reasoning_effort!r} is not accepted: expected an integer 1-100 or one of {words}",
        )

    def render_prompt_segments(
        self,
        messages: list[dict[str, Any]],
        thinking_mode: str,
        context: list[dict[str, Any]] | None = None,
        drop_thinking: bool = True,
        add_default_bos_token: bool = True,
        reasoning_effort: int | str | None = None,
        *,
        reasoning_effort_profile: str = "release",
        images: list[Any] | None = None,
    ) -> list[PromptSegment]:
        """Render ``messages`` (after the already-rendered ``context``) as prompt segments.

        Arguments as for the reference ``encode_messages``; ``reasoning_effort`` is an
        integer 1-100, a word of the profile's table (``release``: low/high/max =
        50/75/100; ``prerelease``: low/medium/high/max = 25/50/75/100) or ``None``
        (``high``). When ``images`` is a list, the record of every image written is
        appended to it, in prompt order. Raises :class:`FormatError` naming the
        message and field for every input the reference rejects.
        """
        thinking = thinking_mode == "thinking"
        full, start, drop = self._conversation(messages, context, thinking, drop_thinking)
        budget = 0
        if start < len(full):
            # Validated per rendered message by the reference: nothing rendered, nothing checked.
            check_thinking_mode(thinking_mode)
            budget = self.effort_budget(reasoning_effort, reasoning_effort_profile)
        effort_text = self.spellings.effort_template.format(budget=budget) if thinking and budget else ""
        bos = add_default_bos_token and not context  # no context: no folded context messages
        records: list[Any] = []

        def render(out: PromptBuilder) -> None:
            records.clear()  # a render may run twice (marker clash); report one pass
            self._render(out, full, start, bos, effort_text, thinking, drop, records)

        segments = build_segments(render)
        if images is not None:
            images.extend(records)
        return segments

    def encode_messages(
        self,
        messages: list[dict[str, Any]],
        thinking_mode: str,
        context: list[dict[str, Any]] | None = None,
        drop_thinking: bool = True,
        add_default_bos_token: bool = True,
        reasoning_effort: int | str | None = None,
        return_multi_modal_data: bool = False,
        *,
        reasoning_effort_profile: str = "release",
    ) -> Any:
        """The prompt string; with ``return_multi_modal_data`` ``(prompt, {"images": [...]})``
        with one image record per ``<｜deepseek_image｜>`` token, in prompt order."""
        images: list[Any] = []
        prompt = join_segments(
            self.render_prompt_segments(
                messages,
                thinking_mode,
                context,
                drop_thinking,
                add_default_bos_token,
                reasoning_effort,
                reasoning_effort_profile=reasoning_effort_profile,
                images=images,
            )
        )
        return (prompt, {"images": images}) if return_multi_modal_data else prompt

    # --- rendering ---------------------------------------------------------------------------

    def _write(self, out: PromptBuilder, pieces: Any, records: list[Any]) -> None:
        if pieces.__class__ is str:
            out.parts.append(pieces)
            return
        if pieces.__class__ is _Bad:
            got = type_name(pieces.value)
            fail(pieces.path, f"must be a string or a list of content parts, got {got}")
        for piece in pieces:
            if piece.__class__ is _Image:
                out.special(self._image)
                records.append(piece.record)
            else:
                out.parts.append(piece)

    def _render(  # type: ignore[override]
        self,
        out: PromptBuilder,
        full: list[_Msg],
        start: int,
        bos: bool,
        effort_text: str,
        thinking: bool,
        drop: bool,
        records: list[Any],
    ) -> None:
        """Append messages ``full[start:]`` (and BOS / ``<｜System｜>`` / the effort line)."""
        add = out.parts.append
        last_user = _last_user(full)
        n = len(full)
        if bos:
            out.special(self._bos)
        for index in range(start, n):
            m = full[index]
            role = m.role
            raw = m.raw
            if raw.get("tools"):
                read_tool_schemas(raw["tools"], f"{m.path}.tools")
            if index == 0 and (effort_text or role == "system"):
                out.special(self._system)
            if index == 0 and effort_text:
                add(effort_text)
            if role == "assistant":
                after_task = index > 0 and full[index - 1].task is not None
                if thinking and (not drop or index > last_user) and not after_task:
                    if m.keep_reasoning:
                        reasoning = raw.get("reasoning_content")
                        if reasoning:
                            if not isinstance(reasoning, str):
                                fail(
                                    f"{m.path}.reasoning_content",
                                    f"must be a string, got {type_name(reasoning)}",
                                )
                            add(reasoning)
                    out.special(self._think_end)
                content = m.content
                if content is not _ABSENT and content:  # the reference writes ``content or ""``
                    self._write(out, _text_value(content, f"{m.path}.content", absent_ok=True), records)
                if m.tool_calls:
                    render_tool_calls(out, m.tool_calls, self._dsml, _v41_arguments)
                if not raw.get("wo_eos", False):
                    out.special(self._eos)
            elif role == "user":
                out.special(self._user)
                self._write_blocks(out, m, records)
            elif role == "system":
                if index > 0:
                    out.special(self._system)
                content = m.content
                if content is not _ABSENT and content:
                    self._write(out, _text_value(content, f"{m.path}.content", absent_ok=True), records)
                self._render_schemas(out, m)
            elif role == "latest_reminder":
                out.special(self._reminder)
                content = m.content
                if content is None or content is _ABSENT or content == []:
                    # the reference writes the text "None" here (an empty list reads as absent)
                    fail(f"{m.path}.content", "must be a string or a non-empty list of content parts")
                self._write(out, _text_value(content, f"{m.path}.content", absent_ok=False), records)
            else:
                fail_unknown_role(m)
            if index + 1 < n and full[index + 1].role not in ("assistant", "latest_reminder"):
                continue
            if m.task is not None:
                self._render_task(out, m, thinking)  # type: ignore[arg-type]
            elif role == "user" or (role == "system" and index > 0):
                out.special(self._assistant)
                opens = thinking and (not drop or index >= last_user)
                out.special(self._think_start if opens else self._think_end)

    def _write_blocks(self, out: PromptBuilder, m: _Msg, records: list[Any]) -> None:
        """A folded user message: its texts, images and tool results, joined by blank lines."""
        sp = self.spellings
        for k, (is_tool, pieces, _id) in enumerate(m.blocks or ()):
            if k:
                out.parts.append(_SEP)
            if is_tool:
                out.parts.append(sp.tool_result_open)
                self._write(out, pieces, records)
                out.parts.append(sp.tool_result_close)
            else:
                self._write(out, pieces, records)


_V41 = V41ChatFormat(DSV41_SPELLINGS)
FAMILY = _V41.family
SPECIAL_SPELLINGS: frozenset[str] = _V41.special_spellings
IMAGE_TOKEN: str = DSV41_SPELLINGS.image
"""``<｜deepseek_image｜>``: the one special token written per image."""
NATIVE_SYSTEM_ROLE = True
"""A system message may stand anywhere (``<｜System｜>``): ``formats.place_instructions`` keeps
mid-conversation instructions as system messages instead of user-turn reminders."""

render_prompt_segments = _V41.render_prompt_segments
encode_messages = _V41.encode_messages
parse_message_from_completion_text = _V41.parse_message_from_completion_text
effort_budget = _V41.effort_budget
