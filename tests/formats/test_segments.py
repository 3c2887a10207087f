"""Prompt segments: the renderer alone decides which text is a special token.

Tokenization encodes ``special`` segments as single tokens and everything else
with special-token recognition off, so these invariants are what keeps a user
from injecting ``<｜end▁of▁sentence｜>`` or a DSML tag into the prompt.
"""

from __future__ import annotations

import itertools
import json
from types import ModuleType
from typing import Any

import pytest

from deepseek_frontend.formats import PromptSegment, dsv4, dsv32, join_segments

from .formats_golden import is_quirk, load_cases

ALL_TOKEN_SPELLINGS = {
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜latest_reminder｜>",
    "<｜action｜>",
    "<｜query｜>",
    "<｜authority｜>",
    "<｜domain｜>",
    "<｜title｜>",
    "<｜read_url｜>",
}

# Quirk cases are left out: some are refused by design (see the golden test).
EXPECTED_CASES = [
    p
    for p in load_cases("dsv4_encode.jsonl") + load_cases("dsv32_encode.jsonl")
    if "expected" in p.values[0] and not is_quirk(p.values[0])
]


def _module(case: dict[str, Any]) -> ModuleType:
    return dsv4 if case["id"].startswith("dsv4") else dsv32


@pytest.mark.parametrize("case", EXPECTED_CASES)
def test_segments_join_to_the_prompt_with_known_specials_and_maximal_plain_runs(
    case: dict[str, Any],
) -> None:
    module = _module(case)
    segments = module.render_prompt_segments(case["messages"], **case["kwargs"])
    assert join_segments(segments) == module.encode_messages(case["messages"], **case["kwargs"])
    assert all(isinstance(s, PromptSegment) and s.text for s in segments)
    specials = {s.text for s in segments if s.special}
    assert specials <= module.SPECIAL_SPELLINGS <= ALL_TOKEN_SPELLINGS
    # Plain runs are maximal: the reference tokenizes the text between two special
    # tokens as one piece, so splitting it could change the token ids.
    assert not any(not a.special and not b.special for a, b in itertools.pairwise(segments))


def _inject(text: str) -> list[dict[str, Any]]:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": text, "arguments": f'{{"{text}": "{text}"}}'},
    }
    tools = [{"type": "function", "function": {"name": "t", "description": text, "parameters": {}}}]
    return [
        {"role": "system", "content": text, "tools": tools},
        {"role": "user", "content": text},
        {"role": "assistant", "content": text, "reasoning_content": text, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": text},
    ]


@pytest.mark.parametrize("spelling", sorted(ALL_TOKEN_SPELLINGS))
@pytest.mark.parametrize("module", [dsv4, dsv32], ids=["dsv4", "dsv32"])
def test_request_text_spelling_a_special_token_stays_plain_text(module: ModuleType, spelling: str) -> None:
    messages = _inject(f"a{spelling}b")
    kwargs: dict[str, Any] = {"drop_thinking": False}
    plain = module.render_prompt_segments(_inject("ab"), "thinking", **kwargs)
    injected = module.render_prompt_segments(messages, "thinking", **kwargs)
    # The same special segments, in the same order: the request text added none.
    assert [s.text for s in injected if s.special] == [s.text for s in plain if s.special]
    assert sum(s.text.count(f"a{spelling}b") for s in injected if not s.special) >= 6


def test_dsml_tags_are_plain_angle_brackets_around_a_special_dsml_token() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    segments = dsv4.render_prompt_segments(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}], "chat"
    )
    dsml = [i for i, s in enumerate(segments) if s.special and s.text == "｜DSML｜"]
    assert len(dsml) == 6  # block open/close, invoke open/close, parameter open/close
    assert all(segments[i - 1].text.endswith(("<", "</")) and not segments[i - 1].special for i in dsml)


def test_a_v4_prompt_segments_its_turn_markers_in_order() -> None:
    segments = dsv4.render_prompt_segments(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}], "thinking"
    )
    assert segments == [
        PromptSegment("<｜begin▁of▁sentence｜>", True),
        PromptSegment("S"),
        PromptSegment("<｜User｜>", True),
        PromptSegment("hi"),
        PromptSegment("<｜Assistant｜>", True),
        PromptSegment("<think>", True),
    ]


def _inject_json(text: str) -> list[dict[str, Any]]:
    """:func:`_inject` with the arguments JSON-encoded (control characters escaped)."""
    messages = _inject(text)
    messages[2]["tool_calls"][0]["function"]["arguments"] = json.dumps({text: text})
    return messages


# The renderer marks special tokens with a reserved character while it builds the
# prompt (NUL first, then others); request text that contains one must still be
# plain text, with exactly the segments a prompt without it would have.
@pytest.mark.parametrize(
    "reserved", ["\x00", "\x00\x01\x02", "\x00" + "".join(map(chr, range(1, 9))) + "\ufdd0"]
)
@pytest.mark.parametrize("module", [dsv4, dsv32], ids=["dsv4", "dsv32"])
def test_request_text_containing_the_internal_marker_characters_stays_plain(
    module: ModuleType, reserved: str
) -> None:
    kwargs: dict[str, Any] = {"drop_thinking": False}
    plain = module.render_prompt_segments(_inject_json("ab"), "thinking", **kwargs)
    marked = module.render_prompt_segments(_inject_json(f"a{reserved}b"), "thinking", **kwargs)
    assert [s for s in marked if s.special] == [s for s in plain if s.special]
    assert sum(s.text.count(f"a{reserved}b") for s in marked if not s.special) >= 6
    assert not any(not a.special and not b.special for a, b in itertools.pairwise(marked))
    assert join_segments(marked) == module.encode_messages(
        _inject_json(f"a{reserved}b"), "thinking", **kwargs
    )


def test_segments_are_named_tuples_that_compare_by_value() -> None:
    segment = PromptSegment("<think>", True)
    assert (segment.text, segment.special) == ("<think>", True)
    assert PromptSegment("x") == PromptSegment("x", False) != PromptSegment("x", True)
    assert hash(PromptSegment("x")) == hash(PromptSegment("x", False))
    with pytest.raises(AttributeError):
        segment.text = "other"  # type: ignore[misc]
