"""Prefix caching end to end, counted in tokens the model actually ran.

Two prompts share a 256-token prefix (16 full blocks of 16).  After the first
one ran, the second must compute only its own suffix: a hook on the model's
forward counts the rows of every forward pass, so the check is on work done,
not on a counter the scheduler keeps about itself.  Outputs must equal those of
an engine without prefix caching, with either hash algorithm; the block hashes
the engine publishes differ between the algorithms and equal the hashes a fresh
process (with another ``PYTHONHASHSEED``) computes for the same tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from minivllm import LLM, SamplingParams

BLOCK_SIZE = 16
PREFIX_LEN = 256
MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
# Dequantized float32: a cache hit must give the uncached run's very tokens and
# logprobs, which holds where a step's numbers do not depend on its row count (the
# low-bit path's kernels change with it).
COMMON: dict[str, Any] = dict(
    dtype="float32",
    quantization="none",
    optimization_level=0,
    num_gpu_blocks_override=128,
    block_size=BLOCK_SIZE,
)
ALGOS = ["sha256", "sha256_cbor"]


@contextmanager
def count_model_tokens(llm: LLM) -> Iterator[list[int]]:
    """Yields a list that collects the number of tokens of each forward pass of the model."""
    model: torch.nn.Module = llm.llm_engine.executor.worker.model_runner.model
    counts: list[int] = []

    def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        counts.append(int(args[0].shape[0]))

    handle = model.register_forward_pre_hook(hook)
    try:
        yield counts
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def plain_llm() -> LLM:
    return LLM(enable_prefix_caching=False, **COMMON)


@pytest.fixture(scope="module")
def prompts(plain_llm: LLM) -> tuple[list[int], list[int]]:
    """Two token-id prompts: the same 256 tokens, then two different questions."""
    tokenizer = plain_llm.get_tokenizer()
    text = " ".join(
        f"Fact {i}: the river number {i} flows into lake {i * 7 % 13}." for i in range(60)
    )
    prefix = tokenizer.encode(text)[:PREFIX_LEN]
    assert len(prefix) == PREFIX_LEN
    first = prefix + tokenizer.encode(" Question: where does river 3 flow?\nAnswer:")
    second = prefix + tokenizer.encode(" Question: which lake gets river 11?\nAnswer: lake")
    return first, second


@pytest.fixture(scope="module")
def uncached_outputs(plain_llm: LLM, prompts: tuple[list[int], list[int]]) -> list[list[int]]:
    with count_model_tokens(plain_llm) as counts:
        outputs = plain_llm.generate(
            [{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False
        )
    # Without the cache every prompt token and every fed-back output token runs.
    assert sum(counts) == sum(len(p) + MAX_TOKENS - 1 for p in prompts)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize("algo", ALGOS)
def test_shared_prefix_computes_only_the_new_tokens(
    algo: str, prompts: tuple[list[int], list[int]], uncached_outputs: list[list[int]]
) -> None:
    first, second = prompts
    llm = LLM(enable_prefix_caching=True, prefix_caching_hash_algo=algo, **COMMON)
    engine = llm.llm_engine
    assert engine.scheduler.kv_cache_manager.enable_caching

    with count_model_tokens(llm) as counts:
        out_first = llm.generate({"prompt_token_ids": first}, GREEDY, use_tqdm=False)[0]
    assert out_first.num_cached_tokens == 0
    assert sum(counts) == len(first) + MAX_TOKENS - 1

    hits_before = engine.get_stats().prefix_cache_hits
    with count_model_tokens(llm) as counts:
        out_second = llm.generate({"prompt_token_ids": second}, GREEDY, use_tqdm=False)[0]
    num_new = len(second) - PREFIX_LEN
    # The prefill pass ran the suffix only; each later pass one fed-back token.
    assert counts[0] == num_new
    assert sum(counts) == num_new + MAX_TOKENS - 1
    assert out_second.num_cached_tokens == PREFIX_LEN
    assert engine.get_stats().prefix_cache_hits - hits_before == PREFIX_LEN

    assert [list(out_first.outputs[0].token_ids), list(out_second.outputs[0].token_ids)] == (
        uncached_outputs
    )


_HASH_SCRIPT = """
import json, sys
from minivllm.kv_cache.hashing import get_hash_fn, make_block_hasher
tokens, block_size = json.loads(sys.stdin.read())
out = {}
for algo in ("sha256", "sha256_cbor"):
    class R:
        all_token_ids = tokens
        block_hashes = []
    out[algo] = [h.hex() for h in make_block_hasher(block_size, get_hash_fn(algo))(R)]
print(json.dumps(out))
"""


def _hashes_in_fresh_process(tokens: list[int]) -> dict[str, list[bytes]]:
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", _HASH_SCRIPT],
        input=json.dumps([tokens, BLOCK_SIZE]),
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=60,
    )
    raw = json.loads(result.stdout)
    return {algo: [bytes.fromhex(h) for h in hashes] for algo, hashes in raw.items()}


def test_engine_block_hashes_differ_by_algo_and_are_stable_across_processes(
    prompts: tuple[list[int], list[int]],
) -> None:
    first, _ = prompts
    # Only the first 2 blocks are needed; a short prompt keeps this cheap.
    tokens = first[: 2 * BLOCK_SIZE + 3]
    published: dict[str, set[bytes]] = {}
    for algo in ALGOS:
        llm = LLM(
            enable_prefix_caching=True,
            prefix_caching_hash_algo=algo,
            **{**COMMON, "num_gpu_blocks_override": 8},
        )
        params = SamplingParams(temperature=0.0, max_tokens=1)
        llm.generate({"prompt_token_ids": tokens}, params, use_tqdm=False)
        pool = llm.llm_engine.scheduler.kv_cache_manager.block_pool
        published[algo] = set(pool.cached_block_hash_to_block)
    assert published["sha256"].isdisjoint(published["sha256_cbor"])

    expected = _hashes_in_fresh_process(tokens)
    for algo in ALGOS:
        assert len(expected[algo]) == 2
        assert published[algo] == set(expected[algo]), algo
