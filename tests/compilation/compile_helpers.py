"""Helpers of the compilation tests: a tiny random Llama checkpoint and an engine factory."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from model_helpers import TINY_CONFIG, save_random_hf_model

NUM_LAYERS = TINY_CONFIG["num_hidden_layers"]
PROMPTS = [[1, 5, 9, 17, 33, 2, 7], [3, 4], [100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 11], [42]]


def save_tiny_llama(path: Path, num_layers: int = NUM_LAYERS, seed: int = 0) -> Path:
    """Save a random untied Llama (float32) to ``path``; norms randomised so they matter."""
    save_random_hf_model(path, seed=seed, num_hidden_layers=num_layers, tie_word_embeddings=False)
    return path


def make_llm(model: Path, decode_graph: bool = False, **kwargs: Any) -> Any:
    """An engine on ``model`` without a tokenizer (prompts are token ids).

    The CPU decode graph (a second trace and compile at start-up, with its own
    counter increments) is off unless ``decode_graph``: these tests count what the
    model forward's compilation does; tests/compilation/test_decode_graph.py tests
    the graph."""
    import os

    from minivllm import LLM

    opts: dict[str, Any] = dict(
        dtype="float32",
        skip_tokenizer_init=True,
        num_gpu_blocks_override=64,
        block_size=16,
        max_model_len=256,
    )
    opts.update(kwargs)
    saved = os.environ.get("MINIVLLM_CPU_DECODE_GRAPH")
    os.environ["MINIVLLM_CPU_DECODE_GRAPH"] = "1" if decode_graph else "0"
    try:
        return LLM(model=str(model), **opts)
    finally:
        if saved is None:
            del os.environ["MINIVLLM_CPU_DECODE_GRAPH"]
        else:
            os.environ["MINIVLLM_CPU_DECODE_GRAPH"] = saved


def greedy_tokens(llm: Any, prompts: list[list[int]] = PROMPTS, n: int = 12) -> list[list[int]]:
    """Greedy continuations of ``prompts`` run as one batch."""
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def start(model: Path, **kwargs: Any) -> tuple[Any, dict[str, int], float]:
    """`make_llm` plus what the start did (compilation counter delta) and its seconds."""
    from minivllm.compilation.counter import compilation_counter

    before = compilation_counter.clone()
    t0 = time.perf_counter()
    llm = make_llm(model, **kwargs)
    return llm, compilation_counter.delta(before), time.perf_counter() - t0
