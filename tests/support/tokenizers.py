"""The tokenizers tests render and decode with, each loaded once per test session.

:func:`bundled_tokenizer` is the bundled DeepSeek-V4 tokenizer (what ``serve`` uses without a
checkpoint); the ``prompt_tokenizer`` fixture (registered by ``tests/conftest.py``) hands it to
tests. :func:`v41_tokenizer` is the DeepSeek-V4.1 stand-in (the V4 tokenizer with V4.1's special
tokens). Both are shared, caches included: a test that needs cold caches loads its own with
``PromptTokenizer.load()``.
"""

from __future__ import annotations

from functools import lru_cache

import pytest

from deepseek_frontend.tokenization import PromptTokenizer, load_v41_stand_in

__all__ = ["bundled_tokenizer", "prompt_tokenizer", "v41_tokenizer"]


@lru_cache(maxsize=1)
def bundled_tokenizer() -> PromptTokenizer:
    """The bundled DeepSeek-V4 tokenizer, loaded once."""
    return PromptTokenizer.load()


@lru_cache(maxsize=1)
def v41_tokenizer() -> PromptTokenizer:
    """The DeepSeek-V4.1 stand-in tokenizer, loaded once."""
    return load_v41_stand_in()


@pytest.fixture(scope="session")
def prompt_tokenizer() -> PromptTokenizer:
    """The bundled DeepSeek-V4 tokenizer (:func:`bundled_tokenizer`)."""
    return bundled_tokenizer()
