"""Write a random-weight Hugging Face checkpoint with the default model's shape.

Machines that cannot carry the default model's GGUF file (a GPU machine with no
package registry, say) can still measure speed on a model of the same size: the
dimensions below are SmolLM2-135M-Instruct's (30 Llama layers, hidden 576, 9 query
heads over 3 KV heads, 49,152-token vocabulary, tied embeddings).  Weights are
random, so the text is nonsense; speed and memory are the real model's.

    python benchmarks/random_checkpoint.py /tmp/smollm2-random
    python benchmarks/compile_modes.py --model /tmp/smollm2-random --skip-tokenizer-init
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

SMOLLM2_135M: dict[str, Any] = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
"""SmolLM2-135M-Instruct's dimensions (its config.json)."""


def write_checkpoint(path: Path, seed: int = 0, dtype: str = "float32", **overrides: Any) -> Path:
    """Save a random LlamaForCausalLM of `SMOLLM2_135M` (plus ``overrides``) to ``path``,
    its tensors (and config ``dtype``) in ``dtype``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**{**SMOLLM2_135M, **overrides})
    cfg.architectures = ["LlamaForCausalLM"]
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:  # keep activations in range over 30 layers
                p.normal_(0.0, 0.02)
    model.to(getattr(torch, dtype)).save_pretrained(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args()
    print(write_checkpoint(args.path, seed=args.seed, dtype=args.dtype))


if __name__ == "__main__":
    main()
