"""Tiny random Hugging Face checkpoints and GGUF files for tests (seconds to build on a CPU)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
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


def write_gguf(
    path: Path,
    arch: str = "qwen3",
    *,
    with_output: bool = False,
    dtype: type = np.float16,
    vocab: int = 40,
) -> Path:
    """A tiny GGUF file with llama.cpp's metadata keys and a few tensors."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_key_length(32)
    writer.add_rope_freq_base(1_000_000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(vocab)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 64), dtype=dtype))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((128, 64), dtype=dtype))
    if with_output:
        writer.add_tensor("output.weight", np.zeros((vocab, 64), dtype=dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
