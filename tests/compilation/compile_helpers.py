"""Helpers of the compilation tests: a tiny random Llama checkpoint and an engine factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
NUM_LAYERS = TINY["num_hidden_layers"]
PROMPTS = [[1, 5, 9, 17, 33, 2, 7], [3, 4], [100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 11], [42]]


def save_tiny_llama(path: Path, num_layers: int = NUM_LAYERS, seed: int = 0) -> Path:
    """Save a random Llama (float32) to ``path``; norms randomised so they matter."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        **{**TINY, "num_hidden_layers": num_layers}, architectures=["LlamaForCausalLM"]
    )
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.1 + ("norm" in name))
    hf.save_pretrained(path)
    return path


def make_llm(model: Path, **kwargs: Any) -> Any:
    """An engine on ``model`` without a tokenizer (prompts are token ids)."""
    from minivllm import LLM

    opts: dict[str, Any] = dict(
        dtype="float32",
        skip_tokenizer_init=True,
        num_gpu_blocks_override=64,
        block_size=16,
        max_model_len=256,
    )
    opts.update(kwargs)
    return LLM(model=str(model), **opts)


def greedy_tokens(llm: Any, prompts: list[list[int]] = PROMPTS, n: int = 12) -> list[list[int]]:
    """Greedy continuations of ``prompts`` run as one batch."""
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]
