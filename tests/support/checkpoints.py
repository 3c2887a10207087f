"""Checkpoint directories for tests: what a model cache holds, without any weights."""

from __future__ import annotations

import json
from pathlib import Path

from deepseek_frontend.tokenization import bundled_tokenizer_path, v41_stand_in_tokenizer_json


def v41_checkpoint(directory: Path, *, tokenizer: bool = True) -> Path:
    """``directory`` (created) as a DeepSeek-V4.1 checkpoint: its ``config.json`` and, with
    ``tokenizer``, the V4.1 stand-in as its ``tokenizer.json`` -- what real workers need."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps({"model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"]}),
        encoding="utf-8",
    )
    if tokenizer:
        text = v41_stand_in_tokenizer_json(bundled_tokenizer_path().read_text(encoding="utf-8"))
        (directory / "tokenizer.json").write_text(text, encoding="utf-8")
    return directory
