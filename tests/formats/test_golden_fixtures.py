"""Golden parity with DeepSeek's reference encoders (``tests/fixtures/dsv4-reference``).

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


FAMILIES: dict[str, ModuleType] = {"dsv4": dsv4, "dsv32": dsv32}
"""Fixture file prefix -> the family module its cases are rendered and parsed with."""


def _cases(kind: str) -> list[Any]:
    """Every family's golden ``{prefix}_{kind}.jsonl`` cases as ``(module, case)`` params."""
    return [
        pytest.param(module, *p.values, id=p.id)
        for prefix, module in FAMILIES.items()
        for p in load_cases(f"{prefix}_{kind}.jsonl")
    ]


@pytest.mark.parametrize(("module", "case"), _cases("encode"))
def test_each_family_renders_like_its_reference_encoder(module: ModuleType, case: dict[str, Any]) -> None:
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


@pytest.mark.parametrize(("module", "case"), _cases("parse"))
def test_each_family_parses_completions_like_its_reference(module: ModuleType, case: dict[str, Any]) -> None:
    if "error" in case:
        with pytest.raises(FormatError, match=r"^completion: "):
            module.parse_message_from_completion_text(case["text"], case["thinking_mode"])
        return
    assert module.parse_message_from_completion_text(case["text"], case["thinking_mode"]) == case["expected"]


def test_the_fixture_files_hold_the_documented_case_counts() -> None:
    # Guards against a truncated checkout silently shrinking the parity suite.
    counts = {
        f"{prefix}_{kind}.jsonl": len(load_cases(f"{prefix}_{kind}.jsonl"))
        for prefix in FAMILIES
        for kind in ("encode", "parse")
    }
    assert counts == {
        "dsv4_encode.jsonl": 400,
        "dsv32_encode.jsonl": 150,
        "dsv4_parse.jsonl": 200,
        "dsv32_parse.jsonl": 80,
    }
