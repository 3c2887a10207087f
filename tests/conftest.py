"""Fixtures shared by every test package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deepseek_frontend.tokenization import PromptTokenizer

REPO_ROOT = Path(__file__).resolve().parents[1]
#: read-only material beside the checkout (present in every checkout and in CI)
SHARED_DIR = REPO_ROOT.parent / "shared"
FIXTURES_DIR = SHARED_DIR / "fixtures" / "dsv4-reference"


def load_jsonl(name: str) -> list[dict]:
    """Cases of one golden fixture file, in file order."""
    with (FIXTURES_DIR / name).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


@pytest.fixture(scope="session")
def prompt_tokenizer() -> PromptTokenizer:
    """The bundled DeepSeek-V4 tokenizer, loaded once per test session."""
    return PromptTokenizer.load()
