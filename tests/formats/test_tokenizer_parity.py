"""Segments tokenize to the ids the reference prompt string gets.

The reference tokenizes its whole prompt with special tokens recognised. Our
segments must give the same ids through ``PromptTokenizer.encode_segments`` --
which is only true if every special token the reference prompt contains (the
DSML and think tags inside the tools prose included) is a special segment, and
no plain run is split. Cases whose request text itself spells a special token are
left out: there the two differ on purpose (that text stays plain).
"""

from __future__ import annotations

from typing import Any

import pytest

from deepseek_frontend.formats import dsv4
from deepseek_frontend.tokenization import PromptTokenizer

from .formats_golden import is_quirk, load_cases


def _takes_part(case: dict[str, Any]) -> bool:
    if "expected" not in case or is_quirk(case) or "args:lone-surrogate" in case["tags"]:
        # Lone surrogates cannot be tokenized at all (reported to tokenization/).
        return False
    segments = dsv4.render_prompt_segments(case["messages"], **case["kwargs"])
    # DeepSeek's added tokens are spelled with "｜" (or are the think tags).
    return not any("｜" in s.text or "think>" in s.text for s in segments if not s.special)


CASES = [p for p in load_cases("dsv4_encode.jsonl") if _takes_part(p.values[0])]


def test_most_golden_cases_take_part() -> None:
    assert len(CASES) > 250


@pytest.mark.parametrize("case", CASES)
def test_segment_ids_equal_the_whole_prompt_ids(
    case: dict[str, Any], prompt_tokenizer: PromptTokenizer
) -> None:
    segments = dsv4.render_prompt_segments(case["messages"], **case["kwargs"])
    assert prompt_tokenizer.encode_segments(segments) == prompt_tokenizer.encode_raw(case["expected"])
