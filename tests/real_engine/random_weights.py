"""Seeded random weights for the tiny Llama of :mod:`tests.real_engine.make_tiny_model`.

``--load-format dummy`` fills every weight with values so small that the model's next-token distribution
is almost uniform and ignores the prompt: two prompts that end alike get the same greedy continuation. A
test that compares a disaggregated decode with an aggregated one needs the opposite -- outputs that change
when any part of the prompt's KV cache changes -- so it serves a checkpoint written here: normal weights
with a standard deviation large enough for attention to matter, the same for a given seed in every process.

Runs in the vLLM virtualenv (torch and safetensors come with vLLM).
"""

from __future__ import annotations

import json
from pathlib import Path

#: projection weights' standard deviation: large enough that the earliest prompt tokens change the greedy
#: continuation of a 300-token prompt (the test checks that it does)
PROJECTION_STD = 0.2


def write_random_llama_weights(model_dir: Path, seed: int = 0) -> Path:
    """Write ``model.safetensors`` for the ``config.json`` in ``model_dir`` (tied embeddings, no lm_head)."""
    import torch
    from safetensors.torch import save_file

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["head_dim"]
    generator = torch.Generator().manual_seed(seed)

    def normal(*shape: int, std: float = PROJECTION_STD) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * std).to(torch.bfloat16)

    def ones(size: int) -> torch.Tensor:
        return torch.ones(size, dtype=torch.bfloat16)

    tensors = {
        "model.embed_tokens.weight": normal(config["vocab_size"], hidden, std=1.0),
        "model.norm.weight": ones(hidden),
    }
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        tensors |= {
            prefix + "self_attn.q_proj.weight": normal(heads * head_dim, hidden),
            prefix + "self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden),
            prefix + "self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden),
            prefix + "self_attn.o_proj.weight": normal(hidden, heads * head_dim),
            prefix + "mlp.gate_proj.weight": normal(inter, hidden),
            prefix + "mlp.up_proj.weight": normal(inter, hidden),
            prefix + "mlp.down_proj.weight": normal(hidden, inter),
            prefix + "input_layernorm.weight": ones(hidden),
            prefix + "post_attention_layernorm.weight": ones(hidden),
        }
    path = model_dir / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path
