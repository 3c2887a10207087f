"""The golden DeepSeek reference cases (``tests/fixtures/dsv4-reference``) as pytest parameters."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.golden import load_jsonl


def load_cases(name: str) -> list[Any]:
    """One ``pytest.param`` per JSONL line, with the case id as the test id."""
    return [pytest.param(case, id=case["id"]) for case in load_jsonl(name)]


def is_quirk(case: dict[str, Any]) -> bool:
    return any(tag.startswith("quirk:") for tag in case.get("tags", ()))
