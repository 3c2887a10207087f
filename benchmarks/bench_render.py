"""Prompt rendering speed: time, cost relative to ``json.dumps``, and growth with length.

Run by hand (not a test)::

    python benchmarks/bench_render.py            # every family (V4, V4.1, V3.2), all shapes
    python benchmarks/bench_render.py --quick    # fewer repeats
    python benchmarks/bench_render.py --decode   # the decode table alone
    python benchmarks/bench_render.py --short-text  # the short-text table alone
    python benchmarks/bench_render.py --joined   # the joined-batch table alone

Workloads are agent conversations with 20 tools (realistic JSON schemas on the
system message), reasoning, tool calls and tool results, at 10 / 100 / 1000 / 3000
messages, in two shapes:

* ``agent``: user -> assistant call -> tool result -> assistant answer, repeated;
* ``one-user``: one user message followed by assistant/tool turns only -- the shape
  on which DeepSeek's reference encoder goes quadratic.

Columns (one function each in :data:`COLUMNS`; add one to extend the table):

* ``render ms``: best-of-N CPU time of ``encode_messages`` (segments joined);
* ``json ms``: best-of-N ``json.dumps(messages, ensure_ascii=False)`` -- the cost floor
  of touching every byte of the request once;
* ``x json``: render / json (DeepSeek's reference encoder measures 1.5-2.2);
* ``growth``: exponent k in time ~ n^k against the previous size of the same shape
  (1 is linear, 2 quadratic).

A second table compares prepare CPU time (render + cold tokenization) of V4 and V4.1 on the
same conversations, plus a V4.1 request with 20 images (V4.1 on its stand-in tokenizer).

A third table measures tokenization of the rendered prompt
(``PromptTokenizer.encode_segments``, loaded once) on an agent conversation grown to
about ``--tokens`` tokens (default 400 000), V4 format, thinking mode:

* ``cold ms`` / ``cold MB/s``: best-of wall time with empty caches (run and prefix), and
  prompt bytes (UTF-8) per second -- the first request of a conversation;
* ``warm render+tok ms``: the same conversation plus one new user turn (new text each
  repeat), rendered and tokenized with the cache the earlier requests filled -- the
  next request of a multi-turn conversation;
* ``warm tok ms``: the tokenization part of that alone;
* ``tok warm/cold``: warm tokenization over cold tokenization (the share of a first request's
  tokenization that a follow-up pays);
* ``render+tok warm/cold``: the whole prompt side, warm over cold (render is not cached:
  every request re-renders its conversation).

A fourth table measures decoding a rendered V4 agent prompt's ids, as the in-process simulated
engine reads every prompt it serves (``PromptTokenizer.decode``): the tokenizer's ``array("i")``
decoded as it is, against a list made of it first and then decoded (a caller's copy, and the
sign check then boxes every id again), best-of wall time, prompts cut to 1,000 / 17,000 /
100,000 ids.

A fifth table measures encoding short ASCII text (what the in-process engine writes as an answer,
a follow-up's few new words: at most ``SHORT_TEXT_CHARS`` characters, encoded holding the GIL) by
``tokenizers``' ``Tokenizer.encode`` and by the checked ``tiktoken`` pieces
(``TiktokenText.encode_short_ascii``), interleaved, best-of wall time.

A sixth table measures what the batch thread does with many prompts' cold text
(``TiktokenText.encode_arrays``: joined by a rare digit, the ids handed over by ``tiktoken`` as one
buffer and cut at the join's id), against the way before it (joined by ``"0"``, the ids as a list
of Python ints, cut where the summed byte lengths of the ids reach each text's end, then copied
into an ``array("i")`` per text), interleaved, best-of wall time, on unique 1,000-word prompts and
on the runs of an agent's first turn. ``buffer encode alone``: the joined text's buffer encode
without the cut; what a path takes beyond it is held with the GIL.

Wall time here, not CPU time: ``encode_batch`` runs on several Rust threads. The
tokenizer's sampled self-check (1 request in 512 re-encoded whole) is switched off
while timing; it adds one cold encode per 512 requests (~0.2% of cold on average).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from deepseek_frontend.formats import dsv4, dsv32, dsv41, join_segments

SIZES: tuple[int, ...] = (10, 100, 1000, 3000)
SHAPES: tuple[str, ...] = ("agent", "one-user")
REPEATS = 7
"""Minimum best-of count per measurement; the minimum is the least noisy estimate of the cost."""
BUDGET_S = 1.0
"""Keep repeating a measurement until this much CPU time is spent (more samples for the
minimum on a busy machine); ``--quick`` sets it to 0."""


# --- workloads ------------------------------------------------------------------------------


def _tool(n: int) -> dict[str, Any]:
    props = {
        "query": {"type": "string", "description": f"What to look up with tool {n}, in plain words."},
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
        "filters": {
            "type": "object",
            "properties": {
                "since": {"type": "string", "format": "date-time"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "exact": {"type": "boolean"},
            },
        },
        "mode": {"type": "string", "enum": ["fast", "balanced", "thorough"]},
    }
    return {
        "type": "function",
        "function": {
            "name": f"tool_{n:02d}",
            "description": f"Tool number {n}: searches an internal index and returns ranked JSON records.",
            "parameters": {"type": "object", "properties": props, "required": ["query"]},
        },
    }


def _call(n: int) -> dict[str, Any]:
    args = {"query": f"status of order #{n} (ünïcode ok)", "limit": 5, "filters": {"tags": ["a", "b"]}}
    return {
        "id": f"call_{n}",
        "type": "function",
        "function": {"name": f"tool_{n % 20:02d}", "arguments": json.dumps(args)},
    }


def build_conversation(size: int, shape: str) -> list[dict[str, Any]]:
    """``size`` messages of the given shape (the system message included)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an operations agent.", "tools": [_tool(n) for n in range(20)]},
        {"role": "user", "content": "Check the orders and summarise what is late."},
    ]
    n = 0
    while len(messages) < size:
        reasoning = f"Step {n}: the previous result mentions order {n}; I should look it up next."
        if shape == "agent" and n % 3 == 2:
            messages.append(
                {"role": "assistant", "content": f"Order {n} is late.", "reasoning_content": reasoning}
            )
            messages.append({"role": "user", "content": f"Thanks. Now check batch {n}."})
        else:
            messages.append(
                {"role": "assistant", "content": "", "reasoning_content": reasoning, "tool_calls": [_call(n)]}
            )
            result = {"order": n, "status": "late" if n % 2 else "ok", "eta_days": n % 7, "notes": "x" * 80}
            messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": json.dumps(result)})
        n += 1
    return messages[:size]


# --- measurement ----------------------------------------------------------------------------


def best_time(fn: Callable[[], object], repeats: int, budget_s: float = BUDGET_S) -> float:
    """Minimum CPU time of ``fn`` over ``repeats`` runs, in seconds.

    CPU time of this process (``time.process_time``), not wall time: rendering is
    single-threaded and CPU-bound, and on a shared machine wall time mostly measures
    the neighbours. The garbage collector is off while timing, as in ``timeit``: a
    collection triggered by earlier allocations would land on whichever call runs.
    """
    best = math.inf
    spent = 0.0
    runs = 0
    gc.collect()
    gc.disable()
    try:
        while runs < repeats or spent < budget_s:
            start = time.process_time()
            fn()
            took = time.process_time() - start
            best = min(best, took)
            spent += took
            runs += 1
    finally:
        gc.enable()
    return best


@dataclass
class Row:
    """One workload and what was measured on it; columns read and fill ``values``."""

    family: str
    module: ModuleType
    shape: str
    size: int
    messages: list[dict[str, Any]]
    repeats: int
    budget_s: float
    previous: Row | None
    values: dict[str, float] = field(default_factory=dict)


def col_render_ms(row: Row) -> float:
    def run() -> object:
        # Tools are on the system message, so V4 keeps all reasoning (drop is off).
        return row.module.encode_messages(row.messages, "thinking")

    return best_time(run, row.repeats, row.budget_s) * 1e3


def col_json_ms(row: Row) -> float:
    return best_time(lambda: json.dumps(row.messages, ensure_ascii=False), row.repeats, row.budget_s) * 1e3


def col_ratio(row: Row) -> float:
    return row.values["render ms"] / row.values["json ms"]


def col_growth(row: Row) -> float:
    prev = row.previous
    if prev is None:
        return math.nan
    return math.log(row.values["render ms"] / prev.values["render ms"]) / math.log(row.size / prev.size)


Column = tuple[str, str, Callable[[Row], float]]
COLUMNS: list[Column] = [
    ("render ms", "{:9.3f}", col_render_ms),
    ("json ms", "{:8.3f}", col_json_ms),
    ("x json", "{:6.2f}", col_ratio),
    ("growth", "{:6.2f}", col_growth),
]
"""(header, format, function) per column, computed left to right; a column may read earlier ones."""


def print_rows(head: list[str], rows: list[list[str]]) -> None:
    """``rows`` of cells under ``head``, each column right-aligned to its widest cell."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def print_table(rows: list[Row], columns: list[Column]) -> None:
    head = ["family", "shape", "messages"] + [name for name, _, _ in columns]
    cells = [
        [r.family, r.shape, str(r.size)]
        + [
            "-" if math.isnan(r.values[name]) else fmt.format(r.values[name]).strip()
            for name, fmt, _ in columns
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths, strict=True)))


# --- tokenization ---------------------------------------------------------------------------

TOKENS_TARGET = 400_000


def grown_agent_conversation(tokens: float, tokens_per_message: float) -> list[dict[str, Any]]:
    """An agent conversation of about ``tokens`` tokens that ends with an assistant answer
    (so that a new user turn appends to it without changing the rendered prefix)."""
    messages = build_conversation(max(10, round(tokens / tokens_per_message)), "agent")
    while messages[-1]["role"] != "assistant" or messages[-1].get("tool_calls"):
        messages.pop()
    return messages


def _best_wall(fn: Callable[[], object], repeats: int) -> float:
    best = math.inf
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - start)
    finally:
        gc.enable()
    return best


def tokenization_table(tokens_target: int, repeats: int) -> None:
    from deepseek_frontend.tokenization import PromptTokenizer

    tok = PromptTokenizer.load()
    tok.self_check_rate = 0.0
    render = dsv4.render_prompt_segments

    # Size the conversation from the tokens per message of a sample (its fixed head --
    # the system prompt with 20 tool schemas -- taken out by the difference).
    small, large = (
        len(tok.encode_segments(render(build_conversation(n, "agent"), "thinking"))) for n in (100, 1000)
    )
    fixed = small - (large - small) / 900 * 100
    messages = grown_agent_conversation(tokens_target - fixed, (large - small) / 900)
    segments = render(messages, "thinking")
    prompt_bytes = len(join_segments(segments).encode("utf-8"))

    def cold() -> list[int]:
        tok.cache.clear()
        tok.prefix_cache.clear()
        return tok.encode_segments(segments)

    cold_ids = cold()
    cold_s = _best_wall(cold, repeats)
    cold_render_s = _best_wall(lambda: render(messages, "thinking"), repeats)
    tok.encode_segments(segments)  # the cache now holds the conversation, as after its last request

    turn = 0
    best_total = best_tok = math.inf
    gc.collect()
    gc.disable()
    try:
        for _ in range(max(repeats, 5)):
            turn += 1
            follow_up = [
                *messages,
                {"role": "user", "content": f"Thanks. Now check batch {turn} and report."},
            ]
            start = time.perf_counter()
            new_segments = render(follow_up, "thinking")
            rendered = time.perf_counter()
            ids = tok.encode_segments(new_segments)
            done = time.perf_counter()
            best_total = min(best_total, done - start)
            best_tok = min(best_tok, done - rendered)
    finally:
        gc.enable()
    assert ids[: len(cold_ids)] == cold_ids, "a follow-up request must extend the previous prompt's ids"

    head = [
        "family",
        "messages",
        "tokens",
        "prompt MB",
        "cold ms",
        "cold MB/s",
        "warm render+tok ms",
        "warm tok ms",
        "tok warm/cold",
        "render+tok warm/cold",
    ]
    row = [
        "dsv4",
        str(len(messages)),
        str(len(cold_ids)),
        f"{prompt_bytes / 1e6:.2f}",
        f"{cold_s * 1e3:.1f}",
        f"{prompt_bytes / cold_s / 1e6:.2f}",
        f"{best_total * 1e3:.1f}",
        f"{best_tok * 1e3:.1f}",
        f"{best_tok / cold_s:.1%}",
        f"{best_total / (cold_s + cold_render_s):.1%}",
    ]
    print_rows(head, [row])


def prepare_table(repeats: int) -> None:
    """Prepare CPU time (render + cold tokenization, no caches) of V4 and V4.1 on the same conversations,
    and of a V4.1 request with 20 images (each one placeholder id; the engine expands it)."""
    from deepseek_frontend.tokenization import PromptTokenizer, load_v41_stand_in

    tokenizers = {"dsv4": PromptTokenizer.load(), "dsv41": load_v41_stand_in()}
    modules = {"dsv4": dsv4, "dsv41": dsv41}

    def prepare_ms(family: str, messages: list[dict[str, Any]]) -> tuple[float, int]:
        tok, render = tokenizers[family], modules[family].render_prompt_segments
        tok.self_check_rate = 0.0

        def once() -> list[int]:
            tok.cache.clear()
            tok.prefix_cache.clear()
            return tok.encode_segments(render(messages, "thinking"))

        ids = once()
        # CPU time of the process (all tokenizer threads): the two families' cost, not the neighbours'
        return best_time(once, max(repeats, 9), 0.0) * 1e3, len(ids)

    image = dsv41.ImagePart(url="data:image/png;base64,iVBORw0KGgo=", width=640, height=480)
    images = [
        {"role": "user", "content": [{"type": "text", "text": f"Photo {k}:"}, image]} for k in range(20)
    ]
    workloads = [(f"agent {n}", build_conversation(n, "agent")) for n in (10, 100, 1000)]
    workloads.append(("20 images", [{"role": "system", "content": "Describe the photos."}, *images]))
    head = ["workload", "tokens", "V4 prepare ms", "V4.1 prepare ms", "V4.1 / V4"]
    rows = []
    for name, messages in workloads:
        v41_ms, v41_tokens = prepare_ms("dsv41", messages)
        if name == "20 images":  # V4 has no image token: the same request is V4.1-only
            rows.append([name, str(v41_tokens), "-", f"{v41_ms:.2f}", "-"])
            continue
        v4_ms, _ = prepare_ms("dsv4", messages)
        rows.append([name, str(v41_tokens), f"{v4_ms:.2f}", f"{v41_ms:.2f}", f"{v41_ms / v4_ms:.2f}"])
    print_rows(head, rows)


DECODE_SIZES: tuple[int, ...] = (1_000, 17_000, 100_000)


def decode_table(repeats: int) -> None:
    """Decoding a prompt's ids: the array as it is, against a list made of it first."""
    from array import array

    from deepseek_frontend.tokenization import PromptTokenizer

    tok = PromptTokenizer.load()
    tok.self_check_rate = 0.0
    messages = grown_agent_conversation(max(DECODE_SIZES) * 1.2, 60)
    segments = dsv4.render_prompt_segments(messages, "thinking")
    ids = tok.encode_segments(segments)
    assert len(ids) >= max(DECODE_SIZES), len(ids)
    head = ["ids", "array ms", "list of it, then decode ms", "array / list"]
    rows = []
    for size in DECODE_SIZES:
        cut = array("i", ids[:size])
        assert tok.decode(cut) == tok.decode(list(cut))
        # interleaved, so that a shared machine's load falls on both alike
        as_array = as_list = math.inf
        for _ in range(max(repeats, 7)):
            as_array = min(as_array, _best_wall(lambda cut=cut: tok.decode(cut), 3))
            as_list = min(as_list, _best_wall(lambda cut=cut: tok.decode(list(cut)), 3))
        rows.append(
            [f"{size:,}", f"{as_array * 1e3:.3f}", f"{as_list * 1e3:.3f}", f"{as_array / as_list:.2f}"]
        )
    print_rows(head, rows)


SHORT_TEXTS: tuple[str, ...] = (
    "Sure.",
    "Understood: the limiter now admits the burst.",
    "Based on the tool result: def admit(self, key: str) -> bool: return self.tokens[key] > 0 "
    "and self.window.allows(key, now=time.monotonic()).",
    "I ran the tests after the change: 212 passed, 3 skipped. The rate limiter refused requests "
    "it should admit because the refill used integer division; it now refills 2.5 tokens a second "
    "as configured, and a test covers the fractional refill. Next I will look at the window's "
    "clock, which still reads wall time instead of the monotonic clock.",
)


def short_text_table(repeats: int) -> None:
    """Encoding short ASCII text holding the GIL: ``tokenizers`` against ``tiktoken``'s pieces."""
    from deepseek_frontend.tokenization import PromptTokenizer

    tok = PromptTokenizer.load()
    fast = tok.text_encoder.fast
    assert fast is not None and fast.short_ascii, "the bundled tokenizer's short path is not checked"
    head = ["chars", "tokenizers encode us", "tiktoken pieces us", "pieces / tokenizers"]
    rows = []
    for text in SHORT_TEXTS:
        reference = tok.text.encode(text, add_special_tokens=False).ids
        assert fast.encode_short_ascii(text) == reference
        by_reference = by_pieces = math.inf
        for _ in range(max(repeats, 7)):
            by_reference = min(
                by_reference,
                _best_wall(
                    lambda t=text: [tok.text.encode(t, add_special_tokens=False).ids for _ in range(100)], 3
                ),
            )
            by_pieces = min(
                by_pieces, _best_wall(lambda t=text: [fast.encode_short_ascii(t) for _ in range(100)], 3)
            )
        rows.append(
            [
                str(len(text)),
                f"{by_reference * 1e4:.1f}",
                f"{by_pieces * 1e4:.1f}",
                f"{by_pieces / by_reference:.2f}",
            ]
        )
    print_rows(head, rows)


def _lists_cut_by_bytes(fast: Any, texts: list[str]) -> list[Any]:
    """The batch thread's work before ``encode_arrays`` (a measurement reference): the texts joined
    by ``"0"``, the ids as a list, cut where the ids' summed byte lengths reach each text's end,
    each part copied into an ``array("i")``."""
    from array import array
    from bisect import bisect_left
    from itertools import accumulate

    lengths = _byte_lengths(fast)
    ids = fast.encoding.encode_ordinary("0".join(texts))
    ends = list(accumulate(map(lengths.__getitem__, ids)))
    parts, start, end = [], 0, 0
    for index, text in enumerate(texts):
        if index:
            start += 1
            end += 1
        end += len(text.encode("utf-8"))
        last = bisect_left(ends, end, start)
        parts.append(array("i", ids[start : last + 1]))
        start = last + 1
    return parts


_LENGTHS: dict[int, list[int]] = {}


def _byte_lengths(fast: Any) -> list[int]:
    if id(fast) not in _LENGTHS:
        table = [0] * (max(fast._ranks.values()) + 1)
        for token, token_id in fast._ranks.items():
            table[token_id] = len(token)
        _LENGTHS[id(fast)] = table
    return _LENGTHS[id(fast)]


def joined_table(repeats: int) -> None:
    """Many prompts' cold text encoded together: the ids as one buffer cut at the joins, against a
    list cut by summed byte lengths (see the module docstring)."""
    import random
    import sys
    from pathlib import Path

    from deepseek_frontend.tokenization import PromptTokenizer
    from deepseek_frontend.tokenization.tiktoken_encoder import _joinable

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _conversations import conversation_bodies, unique_prompt_body

    tok = PromptTokenizer.load()
    fast = tok.text_encoder.fast
    assert fast is not None, "the bundled tokenizer is not encoded by tiktoken"
    fast.claim_thread()
    unique = [json.loads(unique_prompt_body(i, 1000, 150))["messages"][-1]["content"] for i in range(50)]
    first_turn = json.loads(conversation_bodies(0, 1, 70_000, 70_000, 150)[0])["messages"]
    runs = [m["content"] for m in first_turn if isinstance(m.get("content"), str) and m["content"]]
    random.Random(0).shuffle(runs)
    workloads = [
        ("10 unique 1,000-word prompts", unique[:10]),
        ("50 unique 1,000-word prompts", unique),
        (f"an agent's first turn, {len(runs)} messages' text", runs),
    ]
    head = ["texts", "characters", "ids", "list, cut by bytes ms", "buffer, cut at joins ms",
            "buffer encode alone ms", "held after: list / buffer ms"]  # fmt: skip
    rows = []
    for label, texts in workloads:
        # the texts both ways join: no digit at either end, no join character inside
        joinable = [t for t in texts if _joinable(t) and fast._join not in t]
        expected = [ids.tolist() for ids in _lists_cut_by_bytes(fast, joinable)]
        assert [ids.tolist() for ids in fast.encode_arrays(joinable)] == expected
        joined = fast._join.join(joinable)
        by_lists = by_buffer = alone = math.inf
        for _ in range(max(repeats, 7)):
            by_lists = min(by_lists, _best_wall(lambda t=joinable: _lists_cut_by_bytes(fast, t), 3))
            by_buffer = min(by_buffer, _best_wall(lambda t=joinable: fast.encode_arrays(t), 3))
            alone = min(alone, _best_wall(lambda j=joined: fast.encode_array(j), 3))
        rows.append(
            [
                label,
                f"{sum(map(len, joinable)):,}",
                f"{sum(map(len, expected)):,}",
                f"{by_lists * 1e3:.2f}",
                f"{by_buffer * 1e3:.2f}",
                f"{alone * 1e3:.2f}",
                f"{(by_lists - alone) * 1e3:.2f} / {(by_buffer - alone) * 1e3:.2f}",
            ]
        )
    print_rows(head, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 repeats and no time budget")
    parser.add_argument(
        "--tokens", type=int, default=TOKENS_TARGET, help="size of the tokenization conversation (0: skip)"
    )
    parser.add_argument("--decode", action="store_true", help="the decode table alone")
    parser.add_argument("--short-text", action="store_true", help="the short-text table alone")
    parser.add_argument("--joined", action="store_true", help="the joined-batch table alone")
    args = parser.parse_args()
    repeats = 3 if args.quick else REPEATS
    budget_s = 0.0 if args.quick else BUDGET_S
    if args.decode or args.short_text or args.joined:
        if args.decode:
            decode_table(repeats)
        if args.short_text:
            short_text_table(repeats)
        if args.joined:
            joined_table(repeats)
        return
    rows: list[Row] = []
    # V4.1 next to V4 on the same conversations (same messages, V4.1's own rules)
    for family, module in (("dsv4", dsv4), ("dsv41", dsv41), ("dsv32", dsv32)):
        for shape in SHAPES:
            previous: Row | None = None
            for size in SIZES:
                row = Row(
                    family, module, shape, size, build_conversation(size, shape), repeats, budget_s, previous
                )
                for name, _, fn in COLUMNS:
                    row.values[name] = fn(row)
                rows.append(row)
                previous = row
    print_table(rows, COLUMNS)
    print()
    prepare_table(repeats)
    if args.tokens:
        print()
        tokenization_table(args.tokens, repeats)
    print()
    decode_table(repeats)
    print()
    short_text_table(repeats)


if __name__ == "__main__":
    main()
