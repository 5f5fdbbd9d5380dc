"""Tiny random checkpoints and engine settings shared by the parallel tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_helpers import save_random_hf_model

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPTS: list[Any] = [
    {"prompt_token_ids": [1, 5, 9, 17, 33, 2, 64]},
    {"prompt_token_ids": [3, 3, 100, 7]},
    {"prompt_token_ids": list(range(10, 40))},
]
ENGINE = dict(
    dtype="float32",
    enforce_eager=True,
    skip_tokenizer_init=True,
    max_model_len=128,
    num_gpu_blocks_override=64,
    max_num_seqs=8,
)
"""Small, quick engines: eager, no tokenizer, a fixed KV cache."""

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
}


def save_tiny(path: Path, family: str, **overrides: Any) -> Path:
    config_name, arch, extra = FAMILIES[family]
    save_random_hf_model(path, config_name, arch, **{**extra, **overrides})
    return path


def greedy_tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def reference_tokens(path: Path) -> list[list[int]]:
    """Greedy tokens of the one-process engine."""
    llm = LLM(model=str(path), **ENGINE)
    return greedy_tokens(llm)
