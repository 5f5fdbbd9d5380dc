"""Tiny random Hugging Face checkpoints for tests (float32, seconds to build on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

TINY_CONFIG: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
"""Dimensions of the tiny models: GQA (2 query heads per KV head), two layers."""


def save_random_hf_model(
    path: Path,
    config_name: str = "LlamaConfig",
    architecture: str = "LlamaForCausalLM",
    seed: int = 0,
    **overrides: Any,
) -> tuple[torch.nn.Module, Any]:
    """Save a random ``architecture`` with `TINY_CONFIG` (plus ``overrides``) to ``path``.

    Returns the HF model (eval mode) and its config.  Norm weights default to 1 and
    biases to 0; they are randomised so that a test comparing logits sees them.
    """
    torch.manual_seed(seed)
    cfg = getattr(transformers, config_name)(
        **{**TINY_CONFIG, **overrides}, architectures=[architecture]
    )
    hf = getattr(transformers, architecture)(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + ("norm" in name))
    hf.save_pretrained(path)
    return hf, cfg
