"""Fixtures shared by every test package."""

from __future__ import annotations

import pytest

from deepseek_frontend.tokenization import PromptTokenizer


@pytest.fixture(scope="session")
def prompt_tokenizer() -> PromptTokenizer:
    """The bundled DeepSeek-V4 tokenizer, loaded once per test session."""
    return PromptTokenizer.load()
