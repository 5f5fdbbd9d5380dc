"""Preemption end to end: a KV cache too small for the batch loses nothing.

Eight requests that together need about 3x the blocks the cache has run in one
batch.  The scheduler must preempt (free the newest running request's blocks,
recompute it later) and every request must still finish with exactly the tokens
of an unconstrained run.  Half of the requests sample randomly with a seed: a
request rebuilt after preemption continues its own random stream (the model
runner replays its generator), so its tokens must not change either.
"""

from __future__ import annotations

from typing import Any

import pytest

from minivllm import LLM, SamplingParams
from minivllm.outputs import RequestOutput
from minivllm.scheduler.request import Request
from minivllm.scheduler.scheduler import Scheduler
from minivllm.worker.model_runner import ModelRunner

NUM_NEW_TOKENS = 16
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n    ",
    "Q: What is 17 times 3?\nA:",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "The three primary colours are",
    "My favourite recipe for bread starts with",
    "1, 1, 2, 3, 5, 8,",
]
# Greedy first, seeded random last: the newest requests are the ones preempted, so the
# seeded ones lose their blocks after they have sampled tokens.
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True) for _ in range(4)
] + [
    SamplingParams(temperature=0.8, seed=1000 + i, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    for i in range(4)
]
# Dequantized float32: the low-bit path's numbers depend on how many rows a step has
# (a recomputed prompt runs through the prefill kernels), so a preempted request
# could pick a different near-tie token; what this file checks is the bookkeeping.
COMMON: dict[str, Any] = dict(
    dtype="float32", quantization="none", optimization_level=0, block_size=8
)
SMALL_CACHE_BLOCKS = 17
"""16 usable blocks (one is the null block) = 128 tokens for ~8 x 28 tokens of context."""


@pytest.fixture(scope="module")
def big_llm() -> LLM:
    return LLM(num_gpu_blocks_override=256, enable_prefix_caching=False, **COMMON)


@pytest.fixture(scope="module")
def reference(big_llm: LLM) -> list[list[int]]:
    outputs = big_llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_small_kv_cache_preempts_and_outputs_are_unchanged(
    reference: list[list[int]], enable_prefix_caching: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    replayed: list[int] = []
    original = ModelRunner._replay_generator

    def counting_replay(self: ModelRunner, state: Any) -> None:
        if state.generator is not None and state.output_token_ids:
            replayed.append(len(state.output_token_ids))
        original(self, state)

    monkeypatch.setattr(ModelRunner, "_replay_generator", counting_replay)
    llm = LLM(
        num_gpu_blocks_override=SMALL_CACHE_BLOCKS,
        enable_prefix_caching=enable_prefix_caching,
        **COMMON,
    )
    engine = llm.llm_engine
    manager = engine.scheduler.kv_cache_manager
    idle_free = manager.num_free_blocks
    tokenizer = llm.get_tokenizer()
    needed = sum(len(tokenizer.encode(p)) + NUM_NEW_TOKENS for p in PROMPTS)
    assert manager.max_num_tokens < needed * 2 // 3

    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)

    assert engine.get_stats().num_preemptions > 0
    # A seeded request was rebuilt after it had sampled, so its generator was replayed.
    assert replayed, "no seeded request was preempted after sampling"
    assert all(o.finished for o in outputs)
    assert [o.outputs[0].finish_reason for o in outputs] == ["length"] * len(PROMPTS)
    assert [list(o.outputs[0].token_ids) for o in outputs] == reference
    # Every block came back.
    assert manager.num_free_blocks == idle_free
    assert not engine.has_unfinished_requests()


LONG_PROMPTS = [
    "Once upon a time, in a small village at the edge of a dark forest, there lived a young",
    "Here is a short poem about the sea, the waves and the wind that blows over the water:\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The three primary colours are red, yellow and blue; when you mix them you get",
]


def _prompt_logprob_ids(out: RequestOutput) -> list[Any]:
    assert out.prompt_logprobs is not None
    return [None if e is None else sorted(e) for e in out.prompt_logprobs]


def test_preempted_mid_prefill_keeps_prompt_logprobs(
    big_llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request preempted half-way through a chunked prefill recomputes its prompt
    logprobs from the start; the output holds each position once, as without preemption."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=1)
    expected = big_llm.generate(LONG_PROMPTS, params, use_tqdm=False)

    mid_prefill: list[str] = []
    original = Scheduler._preempt

    def recording_preempt(self: Scheduler, request: Request) -> None:
        if request.num_computed_tokens < request.num_prompt_tokens:
            mid_prefill.append(request.request_id)
        original(self, request)

    monkeypatch.setattr(Scheduler, "_preempt", recording_preempt)
    # Admitting prompts without reserving their whole prefill makes mid-prefill
    # preemptions happen in a cache of 8 usable blocks.
    llm = LLM(
        num_gpu_blocks_override=9,
        enable_prefix_caching=False,
        enable_chunked_prefill=True,
        max_num_batched_tokens=8,
        max_num_seqs=4,
        scheduler_reserve_full_isl=False,
        **COMMON,
    )
    outputs = llm.generate(LONG_PROMPTS, params, use_tqdm=False)
    assert mid_prefill, "no request was preempted during its prefill"
    for got, want in zip(outputs, expected, strict=True):
        assert list(got.outputs[0].token_ids) == list(want.outputs[0].token_ids)
        assert _prompt_logprob_ids(got) == _prompt_logprob_ids(want)
        assert got.prompt_logprobs is not None and want.prompt_logprobs is not None
        for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:], strict=True):
            assert a is not None and b is not None
            for token_id in b:
                assert a[token_id].logprob == pytest.approx(b[token_id].logprob, abs=1e-3)
