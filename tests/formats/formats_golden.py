"""Loading the golden DeepSeek reference cases from ``../shared/fixtures``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "dsv4-reference"


def load_cases(name: str) -> list[Any]:
    """One ``pytest.param`` per JSONL line, with the case id as the test id."""
    path = FIXTURES / name
    with path.open(encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    return [pytest.param(case, id=case["id"]) for case in cases]


def is_quirk(case: dict[str, Any]) -> bool:
    return any(tag.startswith("quirk:") for tag in case.get("tags", ()))
