"""Helpers of the connector tests: an engine on the tiny model, prompts, files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
BLOCK_SIZE = 8


def make_llm(model: str, kv_transfer_config: dict[str, Any] | None = None, **kwargs: Any) -> LLM:
    args: dict[str, Any] = dict(
        model=model,
        dtype="float32",
        skip_tokenizer_init=True,
        optimization_level=0,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=128,
        max_model_len=256,
    )
    args.update(kwargs)
    return LLM(kv_transfer_config=kv_transfer_config, **args)


def prompts(num: int, length: int, shared: int = 0, seed: int = 0) -> list[dict[str, list[int]]]:
    """``num`` token-id prompts of ``length`` tokens, the first ``shared`` the same."""
    import random

    rng = random.Random(seed)
    prefix = [rng.randrange(3, 120) for _ in range(shared)]
    return [
        {"prompt_token_ids": prefix + [rng.randrange(3, 120) for _ in range(length - shared)]}
        for _ in range(num)
    ]


def generate(llm: LLM, items: list[dict[str, list[int]]]) -> list[list[int]]:
    outs = llm.generate(items, GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def files_in(root: Path) -> list[Path]:
    return sorted(root.rglob("*.kvblock"))
