"""Golden parity with DeepSeek's reference encoders (``shared/fixtures/dsv4-reference``).

Every ``expected`` prompt renders byte for byte (cases tagged ``quirk:*`` may be
refused instead); every ``error`` case raises FormatError naming where the input
is wrong -- never a bare Python error. The same for completion parsing.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import pytest

from deepseek_frontend.errors import FormatError
from deepseek_frontend.formats import dsv4, dsv32

from .formats_golden import is_quirk, load_cases

# A rejected request names a message field (messages[3].content, context[0].role,
# messages[1].tool_calls[0].function.arguments) or the request-level argument at fault.
WHERE = re.compile(r"^((messages|context)\[\d+\](\.[A-Za-z_]+|\[\d+\])*|thinking_mode|reasoning_effort): ")


def _check_encode(module: ModuleType, case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(FormatError) as info:
            module.encode_messages(case["messages"], **case["kwargs"])
        assert WHERE.match(str(info.value)), str(info.value)
        return
    try:
        prompt = module.encode_messages(case["messages"], **case["kwargs"])
    except FormatError as exc:
        if not is_quirk(case):
            raise
        assert WHERE.match(str(exc)), str(exc)
        return
    assert prompt == case["expected"]


def _check_parse(module: ModuleType, case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(FormatError, match=r"^completion: "):
            module.parse_message_from_completion_text(case["text"], case["thinking_mode"])
        return
    assert module.parse_message_from_completion_text(case["text"], case["thinking_mode"]) == case["expected"]


@pytest.mark.parametrize("case", load_cases("dsv4_encode.jsonl"))
def test_v4_renders_like_the_reference_encoder(case: dict[str, Any]) -> None:
    _check_encode(dsv4, case)


@pytest.mark.parametrize("case", load_cases("dsv32_encode.jsonl"))
def test_v32_renders_like_the_reference_encoder(case: dict[str, Any]) -> None:
    _check_encode(dsv32, case)


@pytest.mark.parametrize("case", load_cases("dsv4_parse.jsonl"))
def test_v4_parses_completions_like_the_reference(case: dict[str, Any]) -> None:
    _check_parse(dsv4, case)


@pytest.mark.parametrize("case", load_cases("dsv32_parse.jsonl"))
def test_v32_parses_completions_like_the_reference(case: dict[str, Any]) -> None:
    _check_parse(dsv32, case)


def test_the_fixture_files_hold_the_documented_case_counts() -> None:
    # Guards against a truncated checkout silently shrinking the parity suite.
    counts = {name: len(load_cases(name)) for name in ("dsv4_encode.jsonl", "dsv32_encode.jsonl")}
    counts |= {name: len(load_cases(name)) for name in ("dsv4_parse.jsonl", "dsv32_parse.jsonl")}
    assert counts == {
        "dsv4_encode.jsonl": 400,
        "dsv32_encode.jsonl": 150,
        "dsv4_parse.jsonl": 200,
        "dsv32_parse.jsonl": 80,
    }
