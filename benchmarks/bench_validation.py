"""Hand-written request validation against msgspec and pydantic v2, on agent-sized chat requests.

Usage::

    .venv/bin/python benchmarks/bench_validation.py              # about a minute and a half
    .venv/bin/python benchmarks/bench_validation.py --repeat 10  # quicker, noisier

What runs, in process (no server): deterministic OpenAI chat completions bodies of an agent
session -- a long system prompt, 50 function tools with nested JSON-schema parameters, user
turns (some as text parts), assistant turns with reasoning and tool calls, tool results of
file-listing and source-code size (some as text parts) -- with 100, 1,000 and 3,000 messages.
Each body is bytes, as the server receives it. Per size, one run times (CPU time of the
thread, median; the collector set up as ``serve`` sets it), interleaved, in rotating order:

* ``orjson.loads``: the parse alone, a floor for everything else;
* ours: what ``POST /v1/chat/completions`` does from body bytes to the internal request,
  ``parse_json_object`` (orjson) then ``to_chat_request`` (validation and mapping onto
  ``ChatRequest``, tool schemas checked through the per-schema cache that agent loops hit);
* msgspec: ``msgspec.json.decode(body, type=ChatCompletionRequest)``;
* msgspec + mapping: the same, then what a type cannot do -- the cross-field checks, the tool
  schema check and the mapping onto ``ChatRequest`` (``msgspec_to_chat_request``, checked to
  give the same ``ChatRequest`` as ours before timing): what replacing ours would cost;
* pydantic: ``PydanticChatCompletionRequest.model_validate_json(body)``.

The typed definitions (``_validation_models.py``) accept and reject what ours does field by
field; decoding alone does not do the checks a type cannot express nor the mapping onto
``ChatRequest`` (listed there), so the msgspec and pydantic columns are lower bounds.

Then eight typical bad inputs, made from the 3,000-message body, go through all three; the
second table prints each error and whether it names the field path.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pydantic

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

from _validation_models import msgspec_decode, msgspec_to_chat_request, pydantic_validate  # noqa: E402
from deepseek_frontend.api.openai.chat_request import to_chat_request  # noqa: E402
from deepseek_frontend.edge.body import parse_json_object  # noqa: E402
from deepseek_frontend.errors import RequestError  # noqa: E402
from deepseek_frontend.fleet.config import ModelConfig, ServerConfig  # noqa: E402

CONFIG = ServerConfig(ModelConfig(served_model_name="deepseek-v4-flash"))
SIZES = (100, 1_000, 3_000)
N_TOOLS = 50

# --------------------------------------------------------------------------- requests

_WORDS = (
    *("request", "worker", "prefill", "decode", "token", "cache", "router", "schema", "stream"),
    *("chunk", "batch", "queue", "retry", "timeout", "config", "handler", "session", "context"),
    *("prompt", "render", "engine", "metric", "span", "buffer", "offset"),
    *("café", "naïve", "résumé", "東京", "数据", "→", "≤", "—", "✓"),
)
_CODE = (
    "def {a}_{b}(self, {c}: int) -> dict[str, Any]:",
    '    """Return the {a} {b} for ``{c}``."""',
    "    if {c} is None or {c} < 0:",
    '        raise ValueError(f"{a}: bad {c} {{self.{b}!r}}")',
    '    return {{"{a}": self.{b}[{c}], "path": "C:\\\\tmp\\\\{c}"}}',
    "\tfor {a} in sorted({b}_items, key=lambda x: x.{c}):",
    "// {a} {b}: {c}",
    "{a}/{b}/{c}.py:{n}: warning: unused variable '{c}'",
    "  {n:>5} | {a} {b} {c}",
)


def _line(rng: random.Random) -> str:
    a, b, c = (rng.choice(_WORDS) for _ in range(3))
    return rng.choice(_CODE).format(a=a, b=b, c=c, n=rng.randrange(10_000))


def _text(rng: random.Random, chars: int) -> str:
    lines: list[str] = []
    size = 0
    while size < chars:
        lines.append(_line(rng))
        size += len(lines[-1]) + 1
    return "\n".join(lines)


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def tool_schema(rng: random.Random, i: int) -> dict[str, Any]:
    """A tool's parameters of the size coding agents declare: a dozen properties, nesting, a ``$ref``."""
    return {
        "type": "object",
        "$defs": {
            "Range": {
                "type": "object",
                "properties": {"start": {"type": "integer", "minimum": 0}, "end": {"type": "integer"}},
                "required": ["start", "end"],
            }
        },
        "properties": {
            f"path_{i}": {"type": "string", "description": _prose(rng, 12)},
            "mode": {"type": "string", "enum": ["read", "write", "append"], "description": _prose(rng, 8)},
            "range": {"$ref": "#/$defs/Range"},
            "encoding": {"type": ["string", "null"]},
            "recursive": {"type": "boolean", "default": False},
            "limit": {"type": "integer", "minimum": 1, "maximum": 10_000},
            "patterns": {"type": "array", "items": {"type": "string"}, "description": _prose(rng, 10)},
            "edits": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "old": {"type": "string"},
                        "new": {"type": "string"},
                        "count": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                    },
                    "required": ["old", "new"],
                    "additionalProperties": False,
                },
            },
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "timeout": {"type": "number", "exclusiveMinimum": 0},
            "dry_run": {"type": "boolean"},
        },
        "required": [f"path_{i}", "mode"],
        "additionalProperties": False,
    }


def _tool_call(rng: random.Random, turn: int, k: int) -> dict[str, Any]:
    tool = rng.randrange(N_TOOLS)
    arguments = {
        f"path_{tool}": f"/repo/src/{rng.choice(_WORDS)}/{rng.choice(_WORDS)}.py",
        "mode": rng.choice(["read", "write", "append"]),
        "range": {"start": rng.randrange(500), "end": rng.randrange(500, 2000)},
        "edits": [{"old": _line(rng), "new": _line(rng)} for _ in range(rng.randrange(3))],
    }
    return {
        "id": f"call_{turn:05d}_{k}",
        "type": "function",
        "function": {"name": f"tool_{tool}", "arguments": orjson.dumps(arguments).decode()},
    }


def chat_request(n_messages: int, seed: int = 7) -> dict[str, Any]:
    """An agent session's chat body with ``n_messages`` messages (deterministic for a seed)."""
    rng = random.Random(seed + n_messages)
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": _prose(rng, rng.randrange(40, 120)),
                "parameters": tool_schema(rng, i),
            },
        }
        for i in range(N_TOOLS)
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _prose(rng, 300) + "\n\n" + _text(rng, 6_000)},
        {"role": "user", "content": _prose(rng, 150)},
    ]
    turn = 0
    while len(messages) < n_messages:
        turn += 1
        if turn % 15 == 0:  # the user steps in, sometimes as text parts
            if turn % 30 == 0:
                content: Any = [
                    {"type": "text", "text": _prose(rng, 60)},
                    {"type": "text", "text": _text(rng, 800)},
                ]
            else:
                content = _prose(rng, rng.randrange(20, 120))
            messages.append({"role": "user", "content": content})
            continue
        calls = [_tool_call(rng, turn, k) for k in range(1 + (rng.random() < 0.25))]
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": _prose(rng, rng.randrange(5, 40)) if rng.random() < 0.5 else None,
            "tool_calls": calls,
        }
        if rng.random() < 0.3:
            assistant["reasoning_content"] = _prose(rng, rng.randrange(30, 150))
        messages.append(assistant)
        for call in calls:
            result = _text(rng, int(rng.lognormvariate(7.0, 0.9)))  # median ~1.1 kB, a tail of 10+ kB
            content = [{"type": "text", "text": result}] if rng.random() < 0.1 else result
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return {
        "model": "deepseek-v4-flash",
        "messages": messages[:n_messages],
        "tools": tools,
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.6,
        "top_p": 0.95,
        "max_tokens": 8192,
        "reasoning_effort": "high",
    }


# --------------------------------------------------------------------------- speed


def ours(body: bytes) -> object:
    return to_chat_request(parse_json_object(body), CONFIG, "bench")


def msgspec_mapped(body: bytes) -> object:
    return msgspec_to_chat_request(msgspec_decode(body), CONFIG, "bench")


APPROACHES: dict[str, Callable[[bytes], object]] = {
    "orjson.loads": orjson.loads,
    "ours": ours,
    "msgspec": msgspec_decode,
    "msgspec + mapping": msgspec_mapped,
    "pydantic": pydantic_validate,
}


def time_interleaved(body: bytes, repeat: int) -> dict[str, float]:
    """Median CPU microseconds per call of every approach; each repetition runs all, in rotating order."""
    names = list(APPROACHES)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up: imports, schema cache, pydantic's lazy setup
        APPROACHES[name](body)
    for rep in range(repeat):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            fn = APPROACHES[name]
            # CPU time of this thread: the time a neighbour's process holds the core is not counted
            started = time.thread_time()
            fn(body)
            samples[name].append((time.thread_time() - started) * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def speed_table(bodies: dict[int, bytes], repeat: int) -> None:
    print(
        "| messages | body | orjson.loads (µs) | ours (µs) | msgspec (µs) | msgspec + mapping (µs) "
        "| pydantic (µs) |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for n, body in bodies.items():
        if msgspec_mapped(body) != ours(body):
            raise SystemExit(f"{n} messages: msgspec + mapping builds another ChatRequest than ours")
        reps = max(5, repeat * 1_000 // n) if n < 1_000 else repeat
        med = time_interleaved(body, reps)
        base = med["ours"]

        def cell(name: str, med: dict[str, float] = med, base: float = base) -> str:
            return f"{med[name]:,.0f} ({med[name] / base:.2f}×)"

        print(
            f"| {n:,} | {len(body) / 2**20:.2f} MiB | {cell('orjson.loads')} | {base:,.0f} (1.00×) "
            f"| {cell('msgspec')} | {cell('msgspec + mapping')} | {cell('pydantic')} |"
        )


# --------------------------------------------------------------------------- error quality


def bad_inputs(base: dict[str, Any]) -> list[tuple[str, str, bytes]]:
    """(case, the field path a good error names, body) for eight typical mistakes."""

    def variant(edit: Callable[[dict[str, Any]], None]) -> bytes:
        body = orjson.loads(orjson.dumps(base))
        edit(body)
        return orjson.dumps(body)

    def deep_arguments(b: dict[str, Any]) -> None:
        call = _tool_call(random.Random(1), 1234, 0)
        call["function"]["arguments"] = 42
        b["messages"][1234] = {"role": "assistant", "content": None, "tool_calls": [call]}

    def unknown_part(b: dict[str, Any]) -> None:
        b["messages"][1]["content"] = [
            {"type": "text", "text": "What is in this clip?"},
            {"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}},
        ]

    return [
        ("wrong type deep (arguments: 42)", "messages[1234].tool_calls[0].function.arguments",
         variant(deep_arguments)),
        ("missing role", "messages[5].role", variant(lambda b: b["messages"][5].pop("role"))),
        ("unknown role", "messages[5].role", variant(lambda b: b["messages"][5].update(role="robot"))),
        ("content part of unknown type", "messages[1].content[1].type", variant(unknown_part)),
        ("parameters not an object", "tools[3].function.parameters",
         variant(lambda b: b["tools"][3]["function"].update(parameters="object"))),
        ('temperature as a string ("0.7")', "temperature", variant(lambda b: b.update(temperature="0.7"))),
        ("messages empty", "messages", variant(lambda b: b.update(messages=[]))),
        ("unknown top-level field (temprature)", "temprature",
         variant(lambda b: b.update(temprature=0.7))),
    ]  # fmt: skip


def _split_path(path: str) -> list[str]:
    return [p for p in re.split(r"[.\[\]]+", path) if p]


def _is_subsequence(want: list[str], parts: list[str]) -> bool:
    it = iter(parts)
    return all(part in it for part in want)


_VERDICTS = (
    "yes",
    "parent + field name",
    "yes, among union labels",
    "parent + field name, among union labels",
)


def _names(expected: str, reported: list[str], message: str) -> str:
    """How the reported location names ``expected``: exactly; as the parent with the field's name in
    the message; either with extra union labels (pydantic's ``assistant``, ``str``) in between."""
    want = _split_path(expected)
    if reported == want:
        return _VERDICTS[0]
    if reported == want[:-1] and want[-1] in message:
        return _VERDICTS[1]
    if _is_subsequence(want, reported):
        return _VERDICTS[2]
    if _is_subsequence(want[:-1], reported) and f"'{want[-1]}'" in message:
        return _VERDICTS[3]
    return "no"


def _outcome(name: str, body: bytes, expected: str, strict: bool) -> tuple[str, str] | None:
    """(the error a client would read, how it names ``expected``), or None when the body is accepted."""
    try:
        if name == "ours":
            ours(body)
        elif name == "msgspec":
            msgspec_decode(body, strict)
        else:
            pydantic_validate(body, strict)
    except RequestError as exc:
        return exc.message, _names(expected, _split_path(exc.param or ""), exc.message)
    except msgspec.ValidationError as exc:
        found = re.search(r" - at `\$(.*)`$", str(exc))
        return str(exc), _names(expected, _split_path(found.group(1)) if found else [], str(exc))
    except pydantic.ValidationError as exc:
        # one error per union member tried; the client reads them all, so the best one counts
        shown = [
            (f"{'.'.join(map(str, e['loc']))}: {e['msg']}", [str(p) for p in e["loc"]]) for e in exc.errors()
        ]
        verdicts = [_names(expected, loc, text) for text, loc in shown]
        ranked = [_VERDICTS.index(v) if v in _VERDICTS else len(_VERDICTS) for v in verdicts]
        best = ranked.index(min(ranked))
        if len(shown) == 1:
            return shown[0][0], verdicts[0]
        text = f"{len(shown)} errors; #1: {shown[0][0]}"
        if best:
            text += f"; #{best + 1}: {shown[best][0]}"
        return text, verdicts[best] + ("" if best == 0 else f" (error #{best + 1})")
    return None


def _cell(text: str, limit: int = 240) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def error_table(base: dict[str, Any]) -> None:
    print("| bad input | approach | error message | names the path |")
    print("| --- | --- | --- | --- |")
    for case, expected, body in bad_inputs(base):
        for name in ("ours", "msgspec", "pydantic"):
            outcome = _outcome(name, body, expected, strict=False)
            if outcome is None and name == "ours":
                outcome = ("accepted (field ignored)", "-")
            elif outcome is None:  # what the variant forbidding unknown fields says
                message, verdict = _outcome(name, body, expected, strict=True) or ("accepted", "-")
                outcome = (f"accepted (field ignored); forbidding unknown fields: {message}", verdict)
            print(f"| {case} | {name} | {_cell(outcome[0])} | {outcome[1]} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=150, help="repetitions at 1,000 and 3,000 messages")
    args = parser.parse_args()
    started = time.perf_counter()
    requests = {n: chat_request(n) for n in SIZES}
    bodies = {n: orjson.dumps(request) for n, request in requests.items()}
    # The collector as `serve` sets it up: start-up objects frozen, young generation every 10,000
    # allocations (api/app.py, api/serve_command.py); a collection that falls into a call is its cost.
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 10)
    print(
        f"msgspec {msgspec.__version__}, pydantic {pydantic.VERSION}, orjson {orjson.__version__}, "
        f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f} at the start\n"
    )
    speed_table(bodies, args.repeat)
    print()
    error_table(requests[3_000])
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
