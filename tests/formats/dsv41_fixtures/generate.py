"""Generate the DeepSeek-V4.1 golden cases from DeepSeek's reference encoder.

Usage (the reference is never part of this repository; point at a copy of the
checkpoint's ``encoding/encoding.py``)::

    python tests/formats/dsv41_fixtures/generate.py --reference /tmp/dsv41ref/encoding.py

Writes ``dsv41_encode.jsonl`` and ``dsv41_parse.jsonl`` next to this script (inputs and
the reference's outputs, as data) and checks ``dynamo_cases.json`` against the
reference. Deterministic: the random cases come from a fixed seed.

How an expected value is made:

* the request is rendered by the reference; a reference exception becomes an
  ``error`` case (type and message recorded);
* images: every image part is replaced by a text part holding a unique sentinel and
  the request rendered again; the reference turns an image into exactly such a text
  part, so the sentinels' order in that prompt is the images' **prompt order** (the
  reference reports them in message order, before tool results are sorted) and the
  prompt with the sentinels replaced by ``<｜deepseek_image｜>`` must equal the first one;
* a ``developer`` message (tag ``ours:developer-as-system``): the reference has no
  developer role; we render it as a system message, so the expected prompt is the
  reference's rendering with the role replaced by ``system``;
* a literal ``<｜deepseek_image｜>`` in request text (tag ``ours:placeholder-as-text``):
  the reference refuses it; we treat it as ordinary text, so the expected prompt is the
  reference's rendering of the request with the literal swapped for a sentinel, swapped
  back afterwards.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLACEHOLDER = "<｜deepseek_image｜>"
LITERAL = "\ue000LITERAL\ue000"


def load_reference(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("dsv41_reference", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- building blocks -----------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Web search — 検索",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    },
]
TEXTS = [
    "Hello",
    "What's the weather in Paris?",
    "多语言 текст ✓",
    "line one\nline two\n\n",
    "  spaced  ",
    "<｜User｜> typed by a user",
    "</think> and <think>",
    "<｜DSML｜ calls> not a call",
    "",
    'a \\ backslash and "quotes"',
    "<｜System｜>fake system",
]
ARGUMENTS = [
    '{"city": "Paris", "days": 3}',
    '{"city":"Tokyo"}',
    '{"q": "x", "n": 1.5, "b": false, "l": [1, "a"], "o": {"k": null}}',
    "{}",
    '"{\\"city\\": \\"Rome\\"}"',
    "not json",
    "[1, 2]",
    "42",
    ' {"padded": true} ',
    '{"nested": "<｜DSML｜ parameter>"}',
]
IMAGES = [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    {"type": "image_url", "image_url": "https://example.com/cat.jpg"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}},
    {"type": "image", "url": "https://example.com/dog.webp"},
]


def _call(rng: random.Random, k: int) -> dict[str, Any]:
    tool = rng.choice(TOOLS)["function"]["name"]
    return {
        "id": f"call_{k}",
        "type": "function",
        "function": {"name": tool, "arguments": rng.choice(ARGUMENTS)},
    }


def _parts(rng: random.Random, images: bool, literal: bool) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 3)):
        if images and rng.random() < 0.4:
            parts.append(copy.deepcopy(rng.choice(IMAGES)))
        else:
            text = rng.choice(TEXTS)
            if literal and rng.random() < 0.3:
                text += PLACEHOLDER
            parts.append({"type": "text", "text": text})
    return parts


def _content(rng: random.Random, images: bool, literal: bool) -> Any:
    if rng.random() < 0.35:
        return _parts(rng, images, literal)
    text = rng.choice(TEXTS)
    if literal and rng.random() < 0.2:
        text = PLACEHOLDER + text
    return text


def random_conversation(rng: random.Random) -> tuple[list[dict[str, Any]], set[str]]:
    tags: set[str] = set()
    images = rng.random() < 0.4
    literal = rng.random() < 0.1
    msgs: list[dict[str, Any]] = []
    if rng.random() < 0.6:
        system: dict[str, Any] = {"role": "system", "content": _content(rng, images, literal)}
        if rng.random() < 0.5:
            system["tools"] = copy.deepcopy(TOOLS[: rng.randint(1, 2)])
            tags.add("tools")
        if rng.random() < 0.15:
            system["response_format"] = {"type": "json_schema", "schema": {"type": "object"}}
        msgs.append(system)
        tags.add("system")
    calls = 0
    for _turn in range(rng.randint(1, 4)):
        roll = rng.random()
        if roll < 0.12 and msgs:
            role = "developer" if rng.random() < 0.25 else "system"
            msgs.append({"role": role, "content": _content(rng, images, literal)})
            tags.add("mid-system" if role == "system" else "ours:developer-as-system")
        else:
            msgs.append({"role": "user", "content": _content(rng, images, literal)})
            if rng.random() < 0.1:
                msgs.append({"role": "user", "content": rng.choice(TEXTS)})
                tags.add("consecutive-user")
        if rng.random() < 0.1:
            msgs.append({"role": "latest_reminder", "content": rng.choice(TEXTS)})
            tags.add("latest_reminder")
        if rng.random() < 0.75:
            assistant: dict[str, Any] = {"role": "assistant", "content": rng.choice(TEXTS)}
            if rng.random() < 0.7:
                assistant["reasoning_content"] = rng.choice(TEXTS)
            if rng.random() < 0.45:
                n = rng.randint(1, 3)
                assistant["tool_calls"] = [_call(rng, calls + k) for k in range(n)]
                msgs.append(assistant)
                tags.add("tool_calls")
                order = list(range(n))
                if rng.random() < 0.5:
                    rng.shuffle(order)
                    tags.add("tool-order")
                for k in order:
                    result: Any = rng.choice(TEXTS)
                    if images and rng.random() < 0.3:
                        result = _parts(rng, True, False)
                        tags.add("tool-images")
                    msgs.append({"role": "tool", "tool_call_id": f"call_{calls + k}", "content": result})
                calls += n
                if rng.random() < 0.5:
                    msgs.append({"role": "user", "content": rng.choice(TEXTS)})
            else:
                msgs.append(assistant)
    if msgs and msgs[-1]["role"] == "assistant" and rng.random() < 0.3:
        msgs[-1]["wo_eos"] = True
        tags.add("prefix-continuation")
    if rng.random() < 0.05 and msgs and msgs[-1]["role"] == "user":
        msgs[-1]["task"] = rng.choice(["action", "query", "title"])
        tags.add("task")
    if images:
        tags.add("images")
    if literal:
        tags.add("literal")
    return msgs, tags


#: (name, change, quirk?) applied to a random message of a random conversation; a change the
#: reference renders as a Python accident (``None``, a repr) is tagged ``quirk:*``.
MUTATIONS: list[tuple[str, Any, str | None]] = [
    ("content-null", lambda m: m.update(content=None), "quirk:none-rendered"),
    ("content-number", lambda m: m.update(content=5), "quirk:python-repr"),
    ("content-empty-list", lambda m: m.update(content=[]), "quirk:none-rendered"),
    ("content-missing", lambda m: m.pop("content", None), "quirk:none-rendered"),
    ("developer", lambda m: m.update(role="developer"), "ours:developer-as-system"),
    ("unknown-role", lambda m: m.update(role="critic"), None),
    ("task", lambda m: m.update(task="query"), None),
    ("task-action", lambda m: m.update(task="action"), None),
    ("wo-eos", lambda m: m.update(wo_eos=True), None),
    ("tools-here", lambda m: m.update(tools=copy.deepcopy(TOOLS[:1])), None),
    ("text-part-no-text", lambda m: m.update(content=[{"type": "text"}]), None),
    (
        "parts-image-and-other",
        lambda m: m.update(content=[copy.deepcopy(IMAGES[1]), {"type": "input_audio"}]),
        None,
    ),
    (
        "tool-result-part",
        lambda m: m.update(
            content=[
                {"type": "tool_result", "tool_use_id": "call_0", "content": [{"type": "text", "text": "t"}]}
            ]
        ),
        None,
    ),
    (
        "dict-arguments",
        lambda m: m.update(tool_calls=[{"id": "z", "function": {"name": "f", "arguments": {"a": 1}}}]),
        None,
    ),
]


def random_kwargs(rng: random.Random) -> dict[str, Any]:
    effort = rng.choice([None, None, "low", "high", "max", 1, 37, 75, 100, 62])
    return {
        "thinking_mode": rng.choice(["chat", "thinking", "thinking"]),
        "drop_thinking": rng.random() < 0.75,
        "add_default_bos_token": rng.random() < 0.9,
        "reasoning_effort": effort,
    }


def hand_picked() -> list[tuple[str, list[dict[str, Any]], dict[str, Any], list[str]]]:
    """Cases chosen for each rule of the V4.1 format, and for errors."""
    t = {
        "thinking_mode": "thinking",
        "drop_thinking": True,
        "add_default_bos_token": True,
        "reasoning_effort": None,
    }
    c = dict(t, thinking_mode="chat")
    user = {"role": "user", "content": "q"}
    call = {
        "id": "a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    out: list[tuple[str, list[dict[str, Any]], dict[str, Any], list[str]]] = []
    for effort in (None, "low", "high", "max", 1, 2, 50, 99, 100):
        out.append((f"effort-{effort}", [user], dict(t, reasoning_effort=effort), ["effort"]))
        out.append((f"effort-{effort}-chat", [user], dict(c, reasoning_effort=effort), ["effort"]))
    for bad in (0, 101, -1, "medium", "minimal", "xhigh", "HIGH", True, False, 1.5, "50", [1]):
        out.append((f"effort-bad-{bad!r}", [user], dict(t, reasoning_effort=bad), ["effort", "error"]))
    out.append(("effort-bad-chat", [user], dict(c, reasoning_effort=0), ["effort", "error"]))
    out.append(("effort-bad-empty", [], dict(t, reasoning_effort=0), ["effort"]))
    out.append(("thinking-mode-bad", [user], dict(t, thinking_mode="fast"), ["error"]))
    sys0 = {"role": "system", "content": "You are helpful."}
    out.append(("system-first-chat", [sys0, user], c, ["system"]))
    out.append(("system-first-thinking", [sys0, user], t, ["system", "effort"]))
    out.append(("system-empty", [{"role": "system", "content": ""}, user], c, ["system"]))
    out.append(("system-null", [{"role": "system", "content": None}, user], t, ["system"]))
    out.append(("system-only", [sys0], t, ["system"]))
    mid = [
        sys0,
        user,
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
        {"role": "system", "content": "m"},
    ]
    for mode in (t, c, dict(t, drop_thinking=False)):
        out.append((f"mid-system-{mode['thinking_mode']}-{mode['drop_thinking']}", mid, mode, ["mid-system"]))
    out.append(("mid-system-then-user", [*mid, user], t, ["mid-system"]))
    out.append(
        (
            "mid-system-then-assistant",
            [*mid, {"role": "assistant", "content": "b", "reasoning_content": "r2"}],
            t,
            ["mid-system"],
        )
    )
    out.append(
        ("system-second-after-system", [sys0, {"role": "system", "content": "two"}, user], t, ["mid-system"])
    )
    dev = {"role": "developer", "content": "d"}
    out.append(("developer-first", [dev, user], c, ["ours:developer-as-system"]))
    out.append(("developer-first-thinking", [dev, user], t, ["ours:developer-as-system"]))
    out.append(("developer-dropped-before-last-user", [dev, user], t, ["ours:developer-as-system", "drop"]))
    mid_dev = [user, {"role": "assistant", "content": "a"}, dev]
    out.append(("developer-mid", mid_dev, t, ["ours:developer-as-system"]))
    out.append(("unknown-role", [user, {"role": "critic", "content": "x"}], c, ["error"]))
    tools_sys = {"role": "system", "content": "Use tools.", "tools": TOOLS}
    conv = [
        tools_sys,
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "think",
            "tool_calls": [call, dict(call, id="b")],
        },
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
        {"role": "assistant", "content": "done", "reasoning_content": "r2"},
        {"role": "user", "content": "again"},
    ]
    out.append(("tools-keep-reasoning", conv, t, ["tools", "tool-order"]))
    out.append(("tools-chat", conv, c, ["tools"]))
    out.append(("tools-no-drop", conv, dict(t, drop_thinking=False), ["tools"]))
    out.append(("no-tools-drop", [m for m in conv if m is not tools_sys], t, ["drop"]))
    out.append(
        (
            "tools-on-user",
            [dict(user, tools=TOOLS), {"role": "assistant", "content": "a", "reasoning_content": "r"}, user],
            t,
            ["tools"],
        )
    )
    for k, args in enumerate([{"city": "Oslo", "n": 2}, None, ["x"], 5, '"just a string"', '"[1]"', ""]):
        bad_call = {"type": "function", "function": {"name": "get_weather", "arguments": args}}
        out.append(
            (
                f"arguments-{k}",
                [user, {"role": "assistant", "content": "", "tool_calls": [bad_call]}],
                t,
                ["arguments"],
            )
        )
    out.append(
        (
            "call-name-null",
            [
                user,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"function": {"name": None, "arguments": "{}"}}],
                },
            ],
            t,
            ["arguments"],
        )
    )
    out.append(
        (
            "call-no-function",
            [user, {"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]}],
            t,
            ["error"],
        )
    )
    out.append(
        (
            "call-no-arguments",
            [user, {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "n"}}]}],
            t,
            ["error"],
        )
    )
    img = IMAGES[0]
    out.append(
        (
            "image-user",
            [{"role": "user", "content": [{"type": "text", "text": "inspect"}, img]}],
            c,
            ["images"],
        )
    )
    out.append(
        (
            "images-two",
            [{"role": "user", "content": [img, IMAGES[2], {"type": "text", "text": "compare"}]}],
            t,
            ["images"],
        )
    )
    out.append(
        (
            "image-system",
            [{"role": "system", "content": [{"type": "text", "text": "s"}, IMAGES[1]]}, user],
            c,
            ["images"],
        )
    )
    out.append(
        (
            "image-assistant",
            [user, {"role": "assistant", "content": [{"type": "text", "text": "a"}, IMAGES[3]]}, user],
            c,
            ["images"],
        )
    )
    out.append(
        ("image-no-source", [{"role": "user", "content": [{"type": "image"}]}], c, ["images", "error"])
    )
    out.append(
        (
            "image-url-empty",
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]}],
            c,
            ["images", "error"],
        )
    )
    out.append(
        (
            "tool-result-block",
            [
                user,
                {"role": "assistant", "content": "", "tool_calls": [call, dict(call, id="b")]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "b",
                            "content": [{"type": "text", "text": "B"}, IMAGES[0], {"type": "document"}],
                        },
                        {"type": "tool_result", "tool_use_id": "a", "content": "A"},
                        {"type": "text", "text": "next"},
                    ],
                },
            ],
            t,
            ["images", "tool-order"],
        )
    )
    out.append(
        (
            "tool-images-reordered",
            [
                user,
                {"role": "assistant", "content": "", "tool_calls": [call, dict(call, id="b")]},
                {"role": "tool", "tool_call_id": "b", "content": [IMAGES[1]]},
                {"role": "tool", "tool_call_id": "a", "content": [IMAGES[0]]},
            ],
            t,
            ["images", "tool-order"],
        )
    )
    out.append(
        (
            "unsupported-part",
            [{"role": "user", "content": [{"type": "input_audio"}, {"type": "text", "text": "x"}]}],
            c,
            ["parts"],
        )
    )
    out.append(
        (
            "text-blocks",
            [{"role": "user", "content": [{"type": "text", "text": "One"}, {"type": "text", "text": "Two"}]}],
            t,
            ["parts"],
        )
    )
    out.append(("empty-parts", [{"role": "user", "content": []}, user], c, ["parts"]))
    out.append(
        ("literal-placeholder-user", [{"role": "user", "content": f"what is {PLACEHOLDER}?"}], c, ["literal"])
    )
    out.append(
        (
            "literal-placeholder-part",
            [{"role": "user", "content": [{"type": "text", "text": PLACEHOLDER}, img]}],
            c,
            ["literal", "images"],
        )
    )
    out.append(
        (
            "literal-placeholder-reasoning",
            [user, {"role": "assistant", "content": "a", "reasoning_content": PLACEHOLDER}],
            t,
            ["literal"],
        )
    )
    out.append(("user-null", [{"role": "user", "content": None}], c, ["error"]))
    out.append(("user-missing-content", [{"role": "user"}], c, ["parts"]))
    out.append(("user-number", [{"role": "user", "content": 5}], c, ["error"]))
    out.append(
        (
            "reminder",
            [user, {"role": "latest_reminder", "content": "today is Tuesday"}],
            t,
            ["latest_reminder"],
        )
    )
    out.append(
        ("reminder-first", [{"role": "latest_reminder", "content": "r"}, user], t, ["latest_reminder"])
    )
    out.append(
        (
            "reminder-null",
            [user, {"role": "latest_reminder", "content": None}],
            t,
            ["latest_reminder", "quirk:none-rendered"],
        )
    )
    out.append(
        (
            "tool-null",
            [
                user,
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "a", "content": None},
            ],
            t,
            ["quirk:none-rendered"],
        )
    )
    out.append(
        (
            "tool-number",
            [
                user,
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "a", "content": 7},
            ],
            t,
            ["quirk:python-repr"],
        )
    )
    out.append(("system-dict", [{"role": "system", "content": {"a": 1}}, user], c, ["quirk:python-repr"]))
    out.append(
        (
            "reasoning-list",
            [user, {"role": "assistant", "content": "a", "reasoning_content": ["r"]}],
            t,
            ["quirk:python-repr"],
        )
    )
    out.append(("tool-first", [{"role": "tool", "tool_call_id": "x", "content": "orphan"}], c, ["tool"]))
    for task in ("action", "query", "authority", "domain", "title", "read_url"):
        out.append((f"task-{task}", [dict(user, task=task)], t, ["task"]))
    out.append(
        (
            "task-then-assistant",
            [dict(user, task="title"), {"role": "assistant", "content": "T", "reasoning_content": "r"}],
            t,
            ["task"],
        )
    )
    out.append(("task-bad", [dict(user, task="nope")], c, ["task", "error"]))
    out.append(
        ("task-user-not-merged", [dict(user, task="query"), {"role": "user", "content": "b"}], c, ["task"])
    )
    pre = [user, {"role": "assistant", "content": "partial", "reasoning_content": "r", "wo_eos": True}]
    out.append(("prefix-continuation-thinking", pre, t, ["prefix-continuation"]))
    out.append(("prefix-continuation-chat", pre, c, ["prefix-continuation"]))
    out.append(("no-bos", [user], dict(t, add_default_bos_token=False), ["bos"]))
    out.append(("empty", [], t, ["empty"]))
    out.append(("messages-not-list", {"role": "user"}, t, ["error"]))  # type: ignore[arg-type]
    out.append(("message-not-object", ["hi"], t, ["error"]))
    return out


CONTEXT_CASES = [
    # (name, context, messages, kwargs): the second turn rendered after the first
    (
        "context-second-turn",
        [{"role": "system", "content": "s"}, {"role": "user", "content": "q1"}],
        [
            {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
            {"role": "user", "content": "q2"},
        ],
    ),
    (
        "context-tool-results",
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                ],
            },
        ],
        [
            {"role": "tool", "tool_call_id": "b", "content": "B"},
            {"role": "tool", "tool_call_id": "a", "content": "A"},
        ],
    ),
    (
        "context-mid-system",
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
        [{"role": "system", "content": "new rules"}],
    ),
    (
        "context-images",
        [{"role": "user", "content": [{"type": "text", "text": "old"}, IMAGES[0]]}],
        [{"role": "assistant", "content": "seen"}, {"role": "user", "content": [IMAGES[1]]}],
    ),
]


# --- rendering with the reference ------------------------------------------------------------


def _swap(value: Any, images: list[Any]) -> Any:
    """A copy with image parts replaced by sentinel text parts and literal placeholders by LITERAL."""
    if isinstance(value, dict):
        if value.get("type") in ("image", "image_url"):
            images.append(value)
            return {"type": "text", "text": f"\ue001{len(images) - 1}\ue001"}
        return {k: _swap(v, images) for k, v in value.items()}
    if isinstance(value, list):
        return [_swap(v, images) for v in value]
    if isinstance(value, str):
        return value.replace(PLACEHOLDER, LITERAL)
    return value


def _developer_as_system(messages: Any) -> Any:
    if not isinstance(messages, list):
        return messages
    return [
        dict(m, role="system") if isinstance(m, dict) and m.get("role") == "developer" else m
        for m in messages
    ]


def render_case(ref: Any, messages: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``{"expected", "images"}`` or ``{"error"}`` for one request, as described above."""
    messages = _developer_as_system(messages)
    call = dict(kwargs)
    if call.get("context"):
        call["context"] = _developer_as_system(call["context"])
    context = call.pop("context", None)
    try:
        prompt, media = ref.encode_messages(
            copy.deepcopy(messages), context=copy.deepcopy(context), return_multi_modal_data=True, **call
        )
    except Exception as exc:  # the reference's own failure: an error case (unless only the literal)
        first_error: Exception | None = exc
    else:
        first_error = None
    literal = PLACEHOLDER in json.dumps([messages, context], ensure_ascii=False).replace(
        json.dumps(PLACEHOLDER, ensure_ascii=False)[1:-1], PLACEHOLDER
    )
    if first_error is not None and not literal:
        return {"error": f"{type(first_error).__name__}: {first_error}"}
    if not isinstance(messages, list):
        return {"error": f"{type(first_error).__name__}: {first_error}"}
    found: list[Any] = []
    swapped = _swap(messages, found)
    n_messages_images = len(found)
    swapped_context = _swap(context, found) if context else context
    try:
        prompt_s, _ = ref.encode_messages(
            swapped, context=swapped_context, return_multi_modal_data=True, **call
        )
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    order: list[Any] = []
    pieces = prompt_s.split("\ue001")
    for k in range(1, len(pieces), 2):
        index = int(pieces[k])
        order.append(ref._extract_image(found[index]))
        pieces[k] = PLACEHOLDER
    expected = "".join(pieces).replace(LITERAL, PLACEHOLDER)
    if first_error is None:
        assert expected == prompt, "sentinel rendering differs from the reference's own"
        assert len(media["images"]) == n_messages_images
    return {"expected": expected, "images": order}


def build_encode_cases(ref: Any, count: int, seed: int, mutated: int = 0) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    for name, messages, kwargs, tags in hand_picked():
        case = {"id": f"dsv41-enc-hand-{name}", "messages": messages, "kwargs": kwargs, "tags": sorted(tags)}
        case.update(render_case(ref, messages, kwargs))
        cases.append(case)
    for name, context, messages in CONTEXT_CASES:
        for mode in ("chat", "thinking"):
            kwargs = {"thinking_mode": mode, "context": context, "reasoning_effort": None}
            case = {
                "id": f"dsv41-enc-hand-{name}-{mode}",
                "messages": messages,
                "kwargs": kwargs,
                "tags": ["context"],
            }
            case.update(render_case(ref, messages, kwargs))
            cases.append(case)
    rng = random.Random(seed)
    for k in range(count):
        messages, tags = random_conversation(rng)
        kwargs = random_kwargs(rng)
        if rng.random() < 0.15 and len(messages) > 2:
            cut = rng.randint(1, len(messages) - 1)
            kwargs["context"], messages = messages[:cut], messages[cut:]
            tags.add("context")
        if any(
            PLACEHOLDER in json.dumps(m, ensure_ascii=False) for m in messages + kwargs.get("context", [])
        ):
            tags.add("ours:placeholder-as-text")
        case = {"id": f"dsv41-enc-rand-{k:04d}", "messages": messages, "kwargs": kwargs, "tags": sorted(tags)}
        case.update(render_case(ref, messages, kwargs))
        cases.append(case)
    rng = random.Random(seed + 100)
    for k in range(mutated):
        messages, tags = random_conversation(rng)
        kwargs = random_kwargs(rng)
        for _ in range(rng.randint(1, 2)):
            if messages:
                name, change, tag = rng.choice(MUTATIONS)
                change(rng.choice(messages))
                tags.add(f"mutated:{name}")
                if tag:
                    tags.add(tag)
        if rng.random() < 0.25 and len(messages) > 2:
            cut = rng.randint(1, len(messages) - 1)
            kwargs["context"], messages = messages[:cut], messages[cut:]
            tags.add("context")
        case = {"id": f"dsv41-enc-mut-{k:04d}", "messages": messages, "kwargs": kwargs, "tags": sorted(tags)}
        case.update(render_case(ref, messages, kwargs))
        cases.append(case)
    for case in cases:
        if "literal" in case["tags"] and "ours:placeholder-as-text" not in case["tags"]:
            case["tags"].append("ours:placeholder-as-text")
    return cases


# --- parse cases ----------------------------------------------------------------------------


def build_parse_cases(ref: Any, count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    texts: list[tuple[str, str, str]] = []
    for k in range(count):
        mode = rng.choice(["chat", "thinking"])
        assistant: dict[str, Any] = {"role": "assistant", "content": rng.choice([*TEXTS[:5], ""])}
        if mode == "thinking":
            assistant["reasoning_content"] = rng.choice([*TEXTS[:5], ""])
        if rng.random() < 0.6:
            assistant["tool_calls"] = [_call(rng, j) for j in range(rng.randint(1, 3))]
        conv = [{"role": "user", "content": "q"}, assistant]
        text = ref.render_message(1, conv, thinking_mode=mode, drop_thinking=False)
        if mode == "thinking":
            assert text.startswith("") and "</think>" in text
        roll = rng.random()
        kind = "valid"
        if roll < 0.12:
            text, kind = text[: rng.randint(0, len(text))], "truncated"
        elif roll < 0.2:
            text, kind = text.replace("<｜end▁of▁sentence｜>", ""), "no-eos"
        elif roll < 0.27:
            text = text.replace("｜DSML｜ calls", "｜DSML｜tool_calls").replace(
                "｜DSML｜ invoke", "｜DSML｜invoke"
            )
            text, kind = text.replace("｜DSML｜ parameter", "｜DSML｜parameter"), "v4-spelling"
        elif roll < 0.33:
            text, kind = text + "trailing", "trailing"
        elif roll < 0.38:
            text, kind = text.replace("</think>", "", 1), "no-think-end"
        elif roll < 0.43 and "parameter" in text:
            text, kind = text.replace('string="true"', 'string="maybe"', 1), "bad-string-flag"
        elif roll < 0.48 and "</｜DSML｜ parameter>\n<｜DSML｜ parameter" in text:
            head, _, rest = text.partition("<｜DSML｜ parameter")
            dup = "<｜DSML｜ parameter" + rest.partition("\n")[0] + "\n"
            text, kind = head + dup + "<｜DSML｜ parameter" + rest, "duplicate-parameter"
        elif roll < 0.52:
            text, kind = "<think>" + text, "special-in-content"
        texts.append((f"dsv41-parse-rand-{k:04d}-{kind}", text, mode))
    # the official test's example and a few hand-picked texts
    texts.append(
        (
            "dsv41-parse-hand-official-example",
            '  reason  </think>summary\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="lookup">\n'
            '<｜DSML｜ parameter name="query" string="true">value</｜DSML｜ parameter>\n'
            '<｜DSML｜ parameter name="limit" string="false">2</｜DSML｜ parameter>\n'
            "</｜DSML｜ invoke>\n</｜DSML｜ calls><｜end▁of▁sentence｜>",
            "thinking",
        )
    )
    texts.append(("dsv41-parse-hand-plain", "hello<｜end▁of▁sentence｜>", "chat"))
    texts.append(("dsv41-parse-hand-empty", "", "chat"))
    texts.append(
        (
            "dsv41-parse-hand-calls-no-eos",
            '\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="f">\n</｜DSML｜ invoke>\n</｜DSML｜ calls>',
            "chat",
        )
    )
    texts.append(
        ("dsv41-parse-hand-cut-after-invoke", '\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name="f">\n', "chat")
    )
    texts.append(("dsv41-parse-hand-image-token", "see <｜deepseek_image｜><｜end▁of▁sentence｜>", "chat"))
    texts.append(("dsv41-parse-hand-system-token", "<｜System｜>x<｜end▁of▁sentence｜>", "chat"))
    cases = []
    for name, text, mode in texts:
        case: dict[str, Any] = {"id": name, "text": text, "thinking_mode": mode}
        try:
            case["expected"] = ref.parse_message_from_completion_text(text, thinking_mode=mode)
        except Exception as exc:
            case["error"] = f"{type(exc).__name__}: {exc}"
        cases.append(case)
    return cases


def check_dynamo(ref: Any) -> int:
    """Dynamo's published cases render exactly so with the reference (a sanity check of both)."""
    cases = json.loads((HERE / "dynamo_cases.json").read_text(encoding="utf-8"))
    for case in cases:
        prompt = ref.encode_messages(
            copy.deepcopy(case["messages"]),
            thinking_mode="thinking" if case["thinking"] else "chat",
            drop_thinking=case["drop_thinking"],
            reasoning_effort=case["effort"],
        )
        assert prompt == case["expected"], case["name"]
    return len(cases)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reference", required=True, help="path of DeepSeek-V4.1's encoding/encoding.py")
    parser.add_argument("--random-encode", type=int, default=280)
    parser.add_argument("--mutated-encode", type=int, default=120)
    parser.add_argument("--random-parse", type=int, default=170)
    parser.add_argument("--seed", type=int, default=41)
    args = parser.parse_args()
    ref = load_reference(args.reference)
    encode = build_encode_cases(ref, args.random_encode, args.seed, args.mutated_encode)
    parse = build_parse_cases(ref, args.random_parse, args.seed + 1)
    for name, cases in (("dsv41_encode.jsonl", encode), ("dsv41_parse.jsonl", parse)):
        with (HERE / name).open("w", encoding="utf-8") as f:
            for case in cases:
                f.write(json.dumps(case, ensure_ascii=False) + "\n")
    dynamo = check_dynamo(ref) if (HERE / "dynamo_cases.json").exists() else 0
    errors = sum("error" in c for c in encode)
    print(
        f"encode: {len(encode)} cases ({errors} errors); parse: {len(parse)} cases; dynamo: {dynamo} checked"
    )


if __name__ == "__main__":
    main()
