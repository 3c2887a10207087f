"""The simulated engine's "model": a deterministic function from prompt text to DSV4 output.

Pure functions, no I/O. :func:`read_prompt` finds the DeepSeek prompt structure in the
decoded prompt; :func:`plan_output` writes the completion as a list of :class:`Piece`
(markup pieces contain special-token spellings and are encoded with special tokens
recognised; text pieces never are, so echoed user text cannot become a special token).

Rules (documented for users in docs/serving.md, "What the simulated model answers"; tests rely on them):

* **Mode.** The prompt ends with ``<think>`` -> thinking mode: a one-sentence reasoning, then
  ``</think>``. Ends with ``</think>`` (or anything else) -> the answer starts at once.
* **Context blocks.** ``<system-reminder>`` and ``<environment_context>`` blocks in the last
  user turn (Claude Code's and Codex's context, mid-conversation system messages) are not the
  user's words: every rule below reads past them.
* **Tools.** Declared tools are the JSON lines ``{"name": ...}`` of the system prompt
  (V4 "### Available Tool Schemas", V3.2 ``<functions>``). A tool is *asked for* when the
  last user turn names it (``get_weather`` or ``get weather``), contains one of its name
  parts of four or more letters as a word (``weather``), or -- naming none -- says
  "use/call ... tool(s)", which picks the first tool.
* **Parallel calls.** When the turn also says "parallel", "both" or "each": one invoke per
  tool asked for, or, with a single tool, one invoke per capitalised word that does not
  start a sentence (``Paris``, ``Tokyo``), used as that call's location-like argument.
* **Arguments** come from the tool's JSON schema (:func:`example_value`): they are valid
  against it (types, enums, const, bounds, required, nested objects and arrays) -- up to a size:
  a value writes at most :data:`MAX_EXAMPLE_ITEMS` array items and strings of at most
  :data:`MAX_EXAMPLE_CHARS` characters. A real model's output ends at ``max_new_tokens`` whatever
  the schema asks (SGLang ``python/sglang/srt/managers/schedule_batch.py`` ``check_finished``:
  ``FINISH_LENGTH``), and the frontend refuses schemas no output could meet
  (api/schema_bounds.py); the bound keeps planning a reply cheap whatever reaches the engine.
* **Loaded tools.** JSON lines ``{"name": ...}`` inside a tool result of the last user turn are
  tools that result loaded (a deferred tool an Anthropic ``tool_reference`` named: the frontend
  writes its schema there, see docs/apis.md); from then on they are declared tools. A tool
  result that loads tools gets a call to the first of them (the model searched for a tool and
  now uses it), with schema-valid arguments.
* **Tool search.** When no declared tool is asked for, a declared tool whose name is made of
  the words "tool" and "search" (``ToolSearch``, ``tool_search``) is called when the turn holds
  a tool-like word -- CamelCase with two or more capitals (``TaskList``) or with an underscore
  (``get_weather``) -- that names no declared tool: its first required string argument (the
  query) is ``select:<word>``, the other arguments come from its schema.
* **Tool results.** A ``<tool_result>`` / ``<function_results>`` after the last user turn
  means a tool already answered: reply in text that quotes the newest results (those after
  the turn's last assistant message).
* **Text answers.** "Reply with exactly: X" -> ``X`` (to the end of the line);
  "write N words" -> N words; otherwise an echo of the turn's first words.
* **Seeds** rotate the opener wording and enum picks; the same seed gives the same output.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "NO_HEAD",
    "SHORT_ANSWER_WORDS",
    "USER_TURN",
    "Piece",
    "PromptHead",
    "PromptView",
    "answer_is_short",
    "answer_reads_head",
    "dsml_block",
    "example_value",
    "extend_head",
    "plan_for_grammar",
    "plan_output",
    "read_head",
    "read_last_turn",
    "read_prompt",
    "tool_arguments",
]

#: the user turn opener (a special token)
USER_TURN = "<｜User｜>"
_ASSISTANT = "<｜Assistant｜>"
_DSML = "｜DSML｜"
_THINK_END = "</think>"
_EOS = "<｜end▁of▁sentence｜>"

_OPENERS = ("You said: ", "Echo: ", "Noted: ", "Here is what I read: ")
_WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
]
_EXACT = re.compile(r"reply with exactly:?\s*(.+)", re.IGNORECASE)
_N_WORDS = re.compile(r"\bwrite\s+(\d+)\s+words\b", re.IGNORECASE)
_PARALLEL = re.compile(r"\b(parallel|both|each)\b", re.IGNORECASE)
_USE_TOOL = re.compile(r"\b(use|call)\b.*\btools?\b", re.IGNORECASE | re.DOTALL)
_CAPITALISED = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][a-z]+)\b")
_RESULT = re.compile(r"<(?:tool_result|result)>(.*?)</(?:tool_result|result)>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Piece:
    """Output text; ``markup`` pieces may contain special-token spellings."""

    text: str
    markup: bool = False


@dataclass(frozen=True, slots=True)
class PromptView:
    """What the simulated model sees of a prompt."""

    tools: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    last_user: str = ""
    thinking: bool = False
    tool_result: str | None = None
    #: "tool_calls" (V4), "function_calls" (V3.2) or " calls" (V4.1, spaced DSML),
    #: taken from the prompt's own tool section
    block_name: str = "tool_calls"
    #: the JSON schema of the prompt's "Response Format" section (``{}``: any JSON), or None
    response_schema: dict[str, Any] | None = None
    #: the prompt ends inside an opened calls block (DeepSeek's grammar-less tool_choice fallback)
    open_block: bool = False
    #: ``(width, height, colour name)`` of the prompt's images, in placeholder order (the image input)
    images: tuple[tuple[int, int, str], ...] = ()
    #: tools the last turn's tool results loaded (also in ``tools``), in order
    loaded_tools: tuple[str, ...] = ()


#: context blocks agents put into user turns: Claude Code's (and our mid-conversation system
#: messages') <system-reminder>, Codex's <environment_context>
_REMINDER = re.compile(r"<(system-reminder|environment_context)>.*?</\1>\s*", re.S)


@dataclass(frozen=True, slots=True)
class PromptHead:
    """What the simulated model reads before the last user turn: the declared tools, the calls
    block name and the response-format schema (see :class:`PromptView`); and, to read a longer
    head that starts with this one (:func:`extend_head`), the length of the text read and how many
    of ``tools`` its last line declared (0 or 1: that line may go on in the longer text)."""

    tools: list[tuple[str, dict[str, Any]]]
    block_name: str
    response_schema: dict[str, Any] | None
    chars: int = 0
    last_line_tools: int = 0


def _schema_lines(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``(name, parameters)`` of each line of ``text`` that is a JSON tool schema ``{"name": ...}``."""
    tools: list[tuple[str, dict[str, Any]]] = []
    for line in text.split("\n"):
        if not line.startswith('{"name"'):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            params = obj.get("parameters")
            tools.append((obj["name"], params if isinstance(params, dict) else {}))
    return tools


def read_head(head: str) -> PromptHead:
    """Tools, the calls block name and the response schema of the text before the last user turn."""
    return _head(head, _schema_lines(head))


def extend_head(previous: PromptHead, head: str) -> PromptHead:
    """:func:`read_head` of ``head``, a text that starts with the text ``previous`` was read from
    (an agent's conversation one or more turns on): only the lines from the last one of that text
    on are searched for tool schemas -- the rest of the text is the conversation's whole history,
    about 0.5 ms of line splitting at 100K characters -- and give the same tools in the same order."""
    start = head.rfind("\n", 0, previous.chars) + 1  # where that text's last line starts
    kept = previous.tools[: len(previous.tools) - previous.last_line_tools]
    return _head(head, [*kept, *_schema_lines(head[start:])])


def _head(head: str, tools: list[tuple[str, dict[str, Any]]]) -> PromptHead:
    """The :class:`PromptHead` of ``head``, whose tool schemas are ``tools``."""
    block = "function_calls" if f"<{_DSML}function_calls>" in head else "tool_calls"
    if f"<{_DSML} calls>" in head:
        block = " calls"  # DeepSeek-V4.1
    last_line = len(_schema_lines(head[head.rfind("\n") + 1 :]))
    return PromptHead(tools, block, _response_schema(head), len(head), last_line)


#: how a prompt ending inside an opened calls block ends (V4, V3.2, V4.1)
_OPEN_BLOCKS = (f"<{_DSML}tool_calls>\n", f"<{_DSML}function_calls>\n", f"<{_DSML} calls>\n")


def read_last_turn(head: PromptHead, turn: str | None, whole: str = "") -> PromptView:
    """The view of a prompt from its :func:`read_head` and the text after its last ``<｜User｜>``
    (``turn``; None when the prompt has no user turn, then ``whole`` is the prompt's text)."""
    tail = turn if turn is not None else ""
    ending = turn if turn is not None else whole
    # Context blocks inside the turn (Claude Code's reminders, Codex's environment context,
    # mid-conversation system messages as formats/request.py renders them) are not the user's words.
    user = _REMINDER.sub("", tail.split(_ASSISTANT, 1)[0])
    result = None
    tools = head.tools
    loaded: tuple[str, ...] = ()
    if _brings_results(tail):
        # The newest results: those after the turn's last assistant message (V3.2 keeps a loop's
        # results in the user turn that started it, each block after the call it answers).
        cut = tail.rfind(_EOS)
        results = _RESULT.findall(tail if cut < 0 else tail[cut:])
        # parallel calls come back as several results: quote them all, in order
        result = "; ".join(r.strip() for r in results)
        # schemas a result carries are tools it loaded (Anthropic tool_reference, docs/apis.md):
        # declared from then on; the newest results' are the ones just loaded
        earlier = _RESULT.findall(tail[:cut]) if cut >= 0 else []
        new = [t for r in (*earlier, *results) if '{"name"' in r for t in _schema_lines(r)]
        if new:
            tools = [*tools, *new]
            loaded = tuple(name for r in results if '{"name"' in r for name, _ in _schema_lines(r))
    open_block = ending.endswith(_OPEN_BLOCKS)
    return PromptView(
        tools,
        user,
        ending.endswith("<think>"),
        result,
        head.block_name,
        head.response_schema,
        open_block,
        loaded_tools=loaded,
    )


#: what :func:`read_last_turn` is given in place of a head not read (:func:`answer_reads_head`)
NO_HEAD = PromptHead([], "tool_calls", None)


def answer_reads_head(turn: str) -> bool:
    """Whether :func:`plan_output`'s unconstrained answer to a prompt whose last user turn is
    ``turn`` (the text after its last ``<｜User｜>``) depends on what comes before that turn: the
    declared tools, the calls block's name, the response schema.

    It does not when the turn brings tool results that load no tools (no ``{"name"`` in it) and
    does not end inside an opened calls block -- an agent's usual follow-up. The answer then
    quotes the results (a text answer, or thinking that ends in one): no tool is asked for, the
    tool search rule is for fresh user turns, and nothing is written in a calls block. So the
    answer is the same from ``read_last_turn(NO_HEAD, turn)``, and the engine need not read the
    conversation's history for it.
    """
    return not _brings_results(turn) or '{"name"' in turn or turn.endswith(_OPEN_BLOCKS)


def _brings_results(turn: str) -> bool:
    """Whether a last user turn's text holds tool results (V4's ``<tool_result>``, V3.2's
    ``<function_results>``): then :func:`read_last_turn` reads them as the view's tool result."""
    return "<tool_result>" in turn or "<function_results>" in turn


def read_prompt(text: str) -> PromptView:
    """Find tools, the last user turn, the thinking mode and a tool result in ``text``."""
    last = text.rfind(USER_TURN)
    if last < 0:
        return read_last_turn(read_head(text), None, text)
    return read_last_turn(read_head(text[:last]), text[last + len(USER_TURN) :])


_FORMAT_INTRO = "You MUST strictly adhere to the following schema to reply:\n"


def _response_schema(head: str) -> dict[str, Any] | None:
    """The JSON schema of the prompt's response-format section, or None when there is none."""
    at = head.rfind(_FORMAT_INTRO)
    if at < 0:
        return None
    try:
        fmt, _ = json.JSONDecoder().raw_decode(head, at + len(_FORMAT_INTRO))
    except ValueError:
        return None
    if not isinstance(fmt, dict):
        return None
    # the frontend renders the schema itself; a whole OpenAI response_format object is read too
    spec = fmt.get("json_schema")
    if fmt.get("type") == "json_schema" and isinstance(spec, dict):
        schema = spec.get("schema")
        return schema if isinstance(schema, dict) else {}
    if fmt == {"type": "json_object"}:
        return {"type": "object"}
    return fmt


def _clean(text: str) -> str:
    """User text made safe to echo: no markup characters, one line."""
    return " ".join(text.replace("<", " ").replace(">", " ").replace("｜", " ").split())


def _first_words(text: str, n: int) -> str:
    """The first ``n`` words of ``_clean(text)``, reading only as much of ``text`` as they need
    (a cold prompt's user turn may be megabytes; the answer quotes a dozen words of it)."""
    size = 16 * (n + 1)
    while size < len(text):
        words = _clean(text[:size]).split()
        if len(words) > n:  # a word follows the n-th, so the cut did not shorten the n-th
            return " ".join(words[:n])
        size *= 4
    return " ".join(_clean(text).split()[:n])


def _tools_asked_for(view: PromptView) -> list[str]:
    if view.tool_result is not None:
        return list(view.loaded_tools[:1])  # a result that loaded tools: use the first one
    if not view.tools:
        return []
    lower = view.last_user.lower()
    words = set(re.findall(r"[a-z0-9]+", lower))
    asked = []
    for name, _ in view.tools:
        parts = [p for p in re.split(r"[_\-.]", name.lower()) if len(p) >= 4]
        if name.lower() in lower or name.lower().replace("_", " ") in lower or words.intersection(parts):
            asked.append(name)
    if not asked and _search_for(view) is not None:
        return asked  # the tool search rule (plan_output) looks the tool up first
    if not asked and _USE_TOOL.search(view.last_user):
        asked.append(view.tools[0][0])
    return asked


#: a tool-like word: CamelCase with two or more capitals, or holding an underscore
_TOOL_WORD = re.compile(r"\b(?:[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+|[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+)\b")


def _is_search_tool(name: str) -> bool:
    """``ToolSearch``, ``tool_search``, ``tool-search``: a name made of the words tool and search."""
    words = re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", name)
    return [w.lower() for w in words] == ["tool", "search"]


def _search_for(view: PromptView) -> tuple[str, str] | None:
    """``(search tool, word)`` when the tool search rule applies to a fresh user turn, else None."""
    if view.tool_result is not None or not view.tools:
        return None
    search = next((name for name, _ in view.tools if _is_search_tool(name)), None)
    if search is None:
        return None
    declared = {name for name, _ in view.tools}
    word = next((w for w in _TOOL_WORD.findall(view.last_user) if w not in declared), None)
    return None if word is None else (search, word)


def _search_call(view: PromptView, seed: int) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """The tool search call (module docstring, "Tool search"), or None when the rule does not apply."""
    found = _search_for(view)
    if found is None:
        return None
    name, word = found
    schema = dict(view.tools)[name]
    args = tool_arguments(schema, _Hints("Paris", word, seed))
    props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    query = next(
        (
            k
            for k in [*required, *props]
            if isinstance(props.get(k), Mapping) and props[k].get("type") == "string"
        ),
        None,
    )
    if query is not None:
        args[query] = f"select:{word}"
    return name, args, schema


def _place_hints(text: str) -> list[str]:
    """Capitalised words that do not start a sentence, in order, without repeats."""
    seen: list[str] = []
    for word in _CAPITALISED.findall(text.strip()):
        if word not in seen:
            seen.append(word)
    return seen


@dataclass(frozen=True, slots=True)
class _Hints:
    place: str
    topic: str
    seed: int
    #: the top-level schema, for resolving local ``$ref`` pointers (``#/$defs/...``)
    root: Mapping[str, Any] | None = None
    #: what one value may still spend (a cell shared by the whole value): a value and each string
    #: character cost one; past it arrays stop growing and strings stop padding
    budget: list[int] = field(default_factory=lambda: [MAX_EXAMPLE_TOTAL])


_PLACE_KEYS = ("location", "city", "place", "where", "destination")
#: most items one array of an example value has (see the module docstring, "Arguments")
MAX_EXAMPLE_ITEMS = 1024
#: longest string of an example value
MAX_EXAMPLE_CHARS = 1 << 16
#: values and string characters one whole example value may have (nested arrays multiply)
MAX_EXAMPLE_TOTAL = 1 << 18


def _bounded_count(value: Any, default: int) -> int:
    """A count keyword's value as an int in ``[0, MAX_EXAMPLE_ITEMS]`` (``1e9`` is a count too)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return min(max(int(value), 0), MAX_EXAMPLE_ITEMS)


def example_value(
    schema: Mapping[str, Any], hints: _Hints | None = None, name: str = "", depth: int = 0
) -> Any:
    """A value valid against ``schema`` (the JSON Schema subset tools use), deterministic in ``hints``."""
    hints = hints or _Hints("Paris", "example", 0)
    if not isinstance(schema, Mapping):
        # boolean schemas: `true` accepts anything (`false` nothing; callers skip those)
        return hints.topic
    if depth == 0 and hints.root is None:
        hints = _Hints(hints.place, hints.topic, hints.seed, schema, hints.budget)
    hints.budget[0] -= 1
    ref = schema.get("$ref")
    if isinstance(ref, str) and depth < 16:
        target = _resolve_ref(hints.root or schema, ref)
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return example_value(merged, hints, name, depth + 1)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[hints.seed % len(enum)]
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            non_null = [o for o in options if isinstance(o, Mapping) and o.get("type") != "null"]
            return example_value((non_null or options)[0], hints, name, depth)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in schema["allOf"]:
            if isinstance(part, Mapping):
                for key, value in part.items():
                    if key == "properties":
                        merged["properties"] = {**merged.get("properties", {}), **value}
                    elif key == "required":
                        merged["required"] = [*merged.get("required", []), *value]
                    else:
                        merged[key] = value
        return example_value(merged, hints, name, depth)
    typ = schema.get("type")
    if isinstance(typ, list):
        typ = next((t for t in typ if t != "null"), "null")
    if typ is None:
        typ = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if typ == "string":
        return _example_string(schema, hints, name)
    if typ in ("integer", "number"):
        return _example_number(schema, integer=typ == "integer")
    if typ == "boolean":
        return True
    if typ == "null":
        return None
    if typ == "array":
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
        count = max(_bounded_count(schema.get("minItems"), 1), 1)
        if "maxItems" in schema:
            count = min(count, _bounded_count(schema["maxItems"], count))
        out_items = []
        for _ in range(count):
            if hints.budget[0] <= 0 and out_items:
                break  # past the budget (see MAX_EXAMPLE_TOTAL): a shorter array
            out_items.append(example_value(items, hints, name, depth + 1))
        return out_items
    if typ == "object":
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required_list = schema.get("required")
        required_list = (
            [r for r in required_list if isinstance(r, str)] if isinstance(required_list, list) else []
        )
        required = set(required_list)
        out: dict[str, Any] = {}
        for key, sub in props.items():
            # deep or wide objects keep to required fields so outputs stay short
            if (depth < 3 and len(props) <= 8) or key in required:
                out[key] = example_value(sub if isinstance(sub, Mapping) else {}, hints, key, depth + 1)
        extra = schema.get("additionalProperties")
        for key in required_list:
            if key not in out:
                # required but not listed under properties: valued by additionalProperties
                out[key] = example_value(extra if isinstance(extra, Mapping) else {}, hints, key, depth + 1)
        return out
    return None


def _resolve_ref(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    """A local JSON pointer (``#/$defs/Name``); anything else resolves to an empty schema."""
    if not ref.startswith("#"):
        return {}
    node: Any = root
    for part in ref[1:].split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, Mapping) or part not in node:
            return {}
        node = node[part]
    return node if isinstance(node, Mapping) else {}


def _example_string(schema: Mapping[str, Any], hints: _Hints, name: str) -> str:
    fmt = schema.get("format")
    if fmt == "date":
        value = "2025-01-15"
    elif fmt == "date-time":
        value = "2025-01-15T12:00:00Z"
    elif fmt == "email":
        value = "user@example.com"
    elif fmt in ("uri", "url"):
        value = "https://example.com/"
    elif fmt == "uuid":
        value = "123e4567-e89b-42d3-a456-426614174000"
    elif any(k in name.lower() for k in _PLACE_KEYS):
        value = hints.place
    else:
        value = hints.topic
    min_len = schema.get("minLength", 0)
    ok = isinstance(min_len, int | float) and not isinstance(min_len, bool) and math.isfinite(min_len)
    min_len = min(int(min_len), MAX_EXAMPLE_CHARS, max(hints.budget[0], 0)) if ok else 0
    max_len = schema.get("maxLength")
    if len(value) < min_len:
        value = value + "x" * (min_len - len(value))
    hints.budget[0] -= len(value)
    if isinstance(max_len, int | float) and not isinstance(max_len, bool) and math.isfinite(max_len):
        value = value[: max(int(max_len), 0)]
    return value


def _example_number(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    value: float = 3 if integer else 2.5
    low = schema.get("minimum")
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        low = schema["exclusiveMinimum"] + (1 if integer else 0.5)
    high = schema.get("maximum")
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        high = schema["exclusiveMaximum"] - (1 if integer else 0.5)
    if isinstance(low, int | float) and value < low:
        value = low
    if isinstance(high, int | float) and value > high:
        value = high
    step = schema.get("multipleOf")
    if isinstance(step, int | float) and step > 0 and math.isfinite(value / step):
        # the smallest multiple at or above the value (bounds permitting); a step so small that
        # value / step overflows leaves the value as it is
        value = math.ceil(value / step) * step
        if isinstance(high, int | float) and value > high:
            value -= step
    if not math.isfinite(value):
        value = 0
    return int(value) if integer else float(value)


def dsml_block(block_name: str, calls: list[tuple[str, dict[str, Any], dict[str, Any]]]) -> str:
    """The canonical DSML block for ``(name, arguments, parameters_schema)`` calls.

    String values are written raw with ``string="true"``; everything else as ``json.dumps``
    text with ``string="false"`` (the reference encoder's rule and separators).
    """
    # V4.1's element names carry a leading space (`<｜DSML｜ invoke`), like its block name
    space = " " if block_name.startswith(" ") else ""
    invoke, parameter = f"{space}invoke", f"{space}parameter"
    lines = [f"\n\n<{_DSML}{block_name}>"]
    for name, args, _schema in calls:
        lines.append(f'<{_DSML}{invoke} name="{name}">')
        for key, value in args.items():
            # like DeepSeek's encoder: decided by the value (a string is raw), not by the schema
            is_str = isinstance(value, str)
            text = value if is_str else json.dumps(value, ensure_ascii=False)
            flag = "true" if is_str else "false"
            lines.append(f'<{_DSML}{parameter} name="{key}" string="{flag}">{text}</{_DSML}{parameter}>')
        lines.append(f"</{_DSML}{invoke}>")
    lines.append(f"</{_DSML}{block_name}>")
    return "\n".join(lines)


def tool_arguments(schema: Any, hints: _Hints | None = None) -> dict[str, Any]:
    """Arguments for a tool with parameters ``schema``: always a JSON object.

    Tool arguments are an object whatever the schema says at the root: OpenAI function tools
    may omit ``parameters`` and Anthropic tools may send ``input_schema: {}``, both meaning
    "an object, no declared properties" (an untyped ``{}`` would otherwise give a string).
    """
    if not isinstance(schema, Mapping):
        return {}
    if "type" not in schema:
        schema = {**schema, "type": "object"}
    value = example_value(schema, hints)
    return value if isinstance(value, dict) else {}


def plan_tool_calls(view: PromptView, names: list[str], seed: int) -> list[tuple[str, dict[str, Any], dict]]:
    """The calls for ``names`` (with the parallel rule), arguments generated from each schema."""
    schemas = dict(view.tools)
    topic = _first_words(view.last_user, 8) or "query"
    places = _place_hints(view.last_user)
    # (a call after a tool result -- a loaded tool -- is one call: the turn is the result's text)
    parallel = view.tool_result is None and bool(_PARALLEL.search(view.last_user))
    calls = []
    if parallel and len(names) == 1 and len(places) >= 2:
        for place in places:
            hints = _Hints(place, place, seed)
            calls.append((names[0], tool_arguments(schemas[names[0]], hints), schemas[names[0]]))
        return calls
    for name in names if parallel else names[:1]:
        hints = _Hints(places[0] if places else "Paris", topic, seed)
        calls.append((name, tool_arguments(schemas[name], hints), schemas[name]))
    return calls


def _may_mention(lowered: str | None, word: str) -> bool:
    """False only when the text cannot match a case-insensitive pattern that needs ``word``
    (lower-case ASCII). ``lowered`` is the text lower-cased if it is ASCII, else None: non-ASCII
    text always goes to the pattern (under Unicode case folding, K and long s match ASCII
    letters). A substring test is ~20x cheaper than such a search over a long turn, and a
    load-test engine plans every cold prompt."""
    return lowered is None or word in lowered


#: a "write N words" answer of at most this many words is short (:func:`answer_is_short`)
SHORT_ANSWER_WORDS = 1024


def answer_is_short(view: PromptView) -> bool:
    """Whether :func:`plan_output` answers ``view`` in a few hundred characters: a text answer that
    no "write N words" makes longer than :data:`SHORT_ANSWER_WORDS` -- not tool calls, whose
    arguments are example values of the declared schemas (up to :data:`MAX_EXAMPLE_TOTAL`
    characters). The engine writes a short answer on the event loop, where it costs less than
    the hop to its planning thread."""
    if (view.open_block and view.tools) or _tools_asked_for(view):
        return False
    if view.images or view.tool_result is not None:
        return True
    turn = view.last_user
    lowered = turn.lower() if turn.isascii() else None
    count = _N_WORDS.search(turn) if _may_mention(lowered, "words") else None
    return count is None or int(count.group(1)) <= SHORT_ANSWER_WORDS


def _text_answer(view: PromptView, seed: int) -> str:
    if view.images:
        # what a vision model would be asked first: what it sees; sizes and colours show the images arrived
        seen = "; ".join(f"image {i}: {w}x{h}, {colour}" for i, (w, h, colour) in enumerate(view.images, 1))
        return f"I see {len(view.images)} image{'s' if len(view.images) > 1 else ''} ({seen})."
    if view.tool_result is not None:
        return f"Based on the tool result: {_first_words(view.tool_result, 20)}."
    turn = view.last_user
    lowered = turn.lower() if turn.isascii() else None  # once for both gates
    exact = _EXACT.search(turn) if _may_mention(lowered, "exactly") else None
    if exact:
        return exact.group(1).split("\n")[0].strip()
    count = _N_WORDS.search(turn) if _may_mention(lowered, "words") else None
    if count:
        n = min(int(count.group(1)), 100_000)
        return " ".join(_WORDS[(i + seed) % len(_WORDS)] for i in range(n))
    words = _first_words(view.last_user, 12)
    return _OPENERS[seed % len(_OPENERS)] + (words or "nothing") + "."


def reasoning_text(view: PromptView, tool_names: list[str]) -> str:
    """The one-sentence reasoning written in thinking mode (without ``</think>``)."""
    if view.tool_result is not None:
        then = f"I should call {', '.join(tool_names)}." if tool_names else "I can answer now."
        return f"The tool returned: {_first_words(view.tool_result, 8) or 'nothing'}. {then}"
    topic = _first_words(view.last_user, 8)
    plan = f"I should call {', '.join(tool_names)}." if tool_names else "I will answer directly."
    return f"The user wrote: {topic or 'nothing'}. {plan}"


def plan_output(
    view: PromptView, *, seed: int = 0, json_schema: Mapping[str, Any] | None = None
) -> list[Piece]:
    """The unconstrained completion for ``view`` (or a JSON document when ``json_schema`` is given)."""
    if view.open_block and view.tools and json_schema is None:
        # the prompt opened the calls block: the model can only continue it with calls
        names = _tools_asked_for(view) or [view.tools[0][0]]
        block = dsml_block(view.block_name, plan_tool_calls(view, names, seed))
        opening = f"<{_DSML}{view.block_name}>\n"
        return [Piece(block[block.index(opening) + len(opening) :], markup=True)]
    tool_names = [] if json_schema is not None else _tools_asked_for(view)
    search = _search_call(view, seed) if json_schema is None and not tool_names else None
    pieces: list[Piece] = []
    if view.thinking:
        pieces.append(Piece(reasoning_text(view, tool_names or ([search[0]] if search else []))))
        pieces.append(Piece(_THINK_END, markup=True))
    if json_schema is not None:
        hints = _Hints(
            _place_hints(view.last_user)[0] if _place_hints(view.last_user) else "Paris", "text", seed
        )
        value = example_value(json_schema, hints)
        pieces.append(Piece(json.dumps(value, ensure_ascii=False)))
    elif tool_names:
        pieces.append(
            Piece(dsml_block(view.block_name, plan_tool_calls(view, tool_names, seed)), markup=True)
        )
    elif search is not None:
        pieces.append(Piece(dsml_block(view.block_name, [search]), markup=True))
    else:
        pieces.append(Piece(_text_answer(view, seed)))
    return pieces


def plan_for_grammar(view: PromptView, seed: int, grammar: str) -> list[Piece]:
    """An output ``grammar`` accepts, as a constrained model would write it.

    The grammar only filters: the "model" still prefers what it would have written (a JSON
    answer to the prompt's response format, the tool calls it was asked for), then a call to
    each declared tool in turn, and only then the grammar's own shortest sentence. Under a
    grammar the calls block starts right at the answer (no blank line before it).
    """
    from deepseek_frontend.parsing.constraints import ebnf_accepts, ebnf_example

    prefix: list[Piece] = []
    if view.thinking:
        prefix = [Piece(reasoning_text(view, [n for n, _ in view.tools][:1])), Piece(_THINK_END, markup=True)]
    candidates: list[list[Piece]] = []
    if view.response_schema is not None:
        candidates.append(plan_output(view, seed=seed, json_schema=view.response_schema))
    natural = plan_output(view, seed=seed)
    candidates.append([Piece(p.text.lstrip("\n"), p.markup) if p.markup else p for p in natural])
    for name, _ in view.tools:
        block = dsml_block(view.block_name, plan_tool_calls(view, [name], seed)).lstrip("\n")
        candidates.append([*prefix, Piece(block, markup=True)])
    for pieces in candidates:
        if ebnf_accepts(grammar, "".join(p.text for p in pieces)):
            return pieces
    return [Piece(ebnf_example(grammar), markup=True)]
