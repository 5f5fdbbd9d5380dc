"""Scheduling and cache settings end to end: chunked prefill, priority, fp8 KV, bfloat16.

Reference outputs come from one unconstrained float32 engine; every other
engine in this module changes one setting and is compared with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.outputs import RequestOutput
from minivllm.scheduler.request import Request
from minivllm.scheduler.scheduler import Scheduler

MAX_TOKENS = 8
PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village at the edge of a dark forest, there lived a",
    "Q: What is 17 times 3?\nA:",
    "The three primary colours are",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True)
WITH_PROMPT_LOGPROBS = SamplingParams(
    temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, prompt_logprobs=2
)
# Greedy, seeded-random and prompt-logprob rows: each has its own chunk-sensitive path.
PARAMS = [GREEDY, SEEDED, WITH_PROMPT_LOGPROBS, GREEDY, SEEDED, GREEDY]
COMMON: dict[str, Any] = dict(optimization_level=0, num_gpu_blocks_override=128, block_size=16)


def _tokens(outputs: list[RequestOutput]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


@contextmanager
def forward_sizes(llm: LLM) -> Iterator[list[int]]:
    """Collects the number of tokens of each forward pass of the model."""
    model: torch.nn.Module = llm.llm_engine.executor.worker.model_runner.model
    sizes: list[int] = []
    handle = model.register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[0]))
    try:
        yield sizes
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def reference() -> list[RequestOutput]:
    llm = LLM(dtype="float32", enable_prefix_caching=False, **COMMON)
    return llm.generate(PROMPTS, PARAMS, use_tqdm=False)


def test_chunked_prefill_equals_unchunked(reference: list[RequestOutput]) -> None:
    llm = LLM(
        dtype="float32",
        enable_chunked_prefill=True,
        max_num_batched_tokens=8,
        max_num_seqs=8,
        enable_prefix_caching=False,
        **COMMON,
    )
    with forward_sizes(llm) as sizes:
        outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    # Really chunked: no pass exceeds the budget, and prompts (up to 19 tokens) were split.
    assert max(sizes) <= 8
    assert len(sizes) > MAX_TOKENS + sum(len(o.prompt_token_ids or []) for o in outputs) // 8 - 1
    assert _tokens(outputs) == _tokens(reference)
    # Prompt logprobs computed chunk by chunk equal the one-pass ones.
    chunked, whole = outputs[2].prompt_logprobs, reference[2].prompt_logprobs
    assert chunked is not None and whole is not None and len(chunked) == len(whole)
    assert chunked[0] is None and whole[0] is None
    for a, b in zip(chunked[1:], whole[1:], strict=True):
        assert a is not None and b is not None and a.keys() == b.keys()
        for token_id in a:
            assert a[token_id].logprob == pytest.approx(b[token_id].logprob, abs=1e-3)


def test_priority_policy_runs_most_urgent_first(
    reference: list[RequestOutput], monkeypatch: pytest.MonkeyPatch
) -> None:
    # One sequence at a time, so the finishing order is the scheduling order.
    llm = LLM(dtype="float32", scheduling_policy="priority", max_num_seqs=1, **COMMON)
    engine = llm.llm_engine
    finish_order: list[str] = []
    original_step = engine.step

    def recording_step() -> list[RequestOutput]:
        outputs = original_step()
        finish_order.extend(o.request_id for o in outputs if o.finished)
        return outputs

    engine.step = recording_step  # type: ignore[method-assign]
    priorities = [3, 0, 5, 1, -2, 4]
    outputs = llm.generate(PROMPTS, PARAMS, priority=priorities, use_tqdm=False)
    by_id = {o.request_id: i for i, o in enumerate(outputs)}
    order = [by_id[rid] for rid in finish_order]
    assert order == sorted(range(len(PROMPTS)), key=lambda i: priorities[i])
    # Outputs come back in prompt order and are those of the reference.
    assert _tokens(outputs) == _tokens(reference)

    # With too few blocks, the least urgent running request is the one preempted.
    victims: list[tuple[int, int]] = []
    original_preempt = Scheduler._preempt

    def recording_preempt(self: Scheduler, request: Request) -> None:
        others = [r.priority for r in self.running if r is not request]
        victims.append((request.priority, max(others, default=request.priority)))
        original_preempt(self, request)

    monkeypatch.setattr(Scheduler, "_preempt", recording_preempt)
    small = LLM(
        dtype="float32",
        scheduling_policy="priority",
        **{**COMMON, "num_gpu_blocks_override": 4},
    )
    outputs = small.generate(PROMPTS, PARAMS, priority=priorities, use_tqdm=False)
    assert victims and all(mine >= other for mine, other in victims)
    assert _tokens(outputs) == _tokens(reference)

    fcfs = LLM(dtype="float32", **COMMON)
    with pytest.raises(ValueError, match="priority"):
        fcfs.generate(PROMPTS[:2], GREEDY, priority=[0, 1], use_tqdm=False)
    assert not fcfs.llm_engine.has_unfinished_requests()


TEACHER = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)


def _teacher_logprobs(llm: LLM, reference: list[RequestOutput]) -> list[float]:
    """Logprob of every token of each reference prompt + output, fed back as a prompt."""
    seqs = [(o.prompt_token_ids or []) + list(o.outputs[0].token_ids) for o in reference]
    outputs = llm.generate([{"prompt_token_ids": s} for s in seqs], TEACHER, use_tqdm=False)
    values = []
    for seq, out in zip(seqs, outputs, strict=True):
        assert out.prompt_logprobs is not None
        values += [out.prompt_logprobs[i][seq[i]].logprob for i in range(1, len(seq))]
    return values


@pytest.fixture(scope="module")
def reference_logprobs(reference: list[RequestOutput]) -> list[float]:
    llm = LLM(dtype="float32", enable_prefix_caching=False, **COMMON)
    return _teacher_logprobs(llm, reference)


def _assert_close(llm: LLM, reference: list[RequestOutput], expected: list[float], tol: float):
    """Generation runs, and teacher-forced logprobs stay within ``tol`` nats on average."""
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == MAX_TOKENS for o in outputs)
    assert all(o.outputs[0].text.strip() for o in outputs)
    # Greedy next-token choices can flip where the top two are close, so the check is on
    # the numbers: over ~150 positions the mean drift is small and no position jumps.
    got = _teacher_logprobs(llm, reference)
    diffs = [abs(a - b) for a, b in zip(got, expected, strict=True)]
    assert sum(diffs) / len(diffs) < tol
    assert max(diffs) < 10 * tol
    assert any(d > 0 for d in diffs)  # the setting changed the numerics at all


@pytest.mark.parametrize(
    ("kv_cache_dtype", "calculate_kv_scales", "storage", "tol"),
    [
        # Measured mean drift per token here: ~0.07 nats for e4m3 (either scale), ~0.12
        # for e5m2 (one mantissa bit fewer); the tolerances leave about 2x room.
        ("fp8", False, torch.float8_e4m3fn, 0.15),
        ("fp8_e4m3", True, torch.float8_e4m3fn, 0.15),
        ("fp8_e5m2", False, torch.float8_e5m2, 0.25),
    ],
)
def test_fp8_kv_cache_stays_close(
    reference: list[RequestOutput],
    reference_logprobs: list[float],
    kv_cache_dtype: str,
    calculate_kv_scales: bool,
    storage: torch.dtype,
    tol: float,
) -> None:
    llm = LLM(
        dtype="float32",
        kv_cache_dtype=kv_cache_dtype,
        calculate_kv_scales=calculate_kv_scales,
        enable_prefix_caching=False,
        **COMMON,
    )
    runner = llm.llm_engine.executor.worker.model_runner
    assert runner.kv_caches and all(c.dtype == storage for c in runner.kv_caches)
    _assert_close(llm, reference, reference_logprobs, tol=tol)
    layer = next(iter(runner.attn_layers.values()))
    if calculate_kv_scales:
        assert layer.kv_scales_computed and float(layer.k_scale) != 1.0
    else:
        assert float(layer.k_scale) == 1.0


def test_bfloat16_runs_and_stays_close(
    reference: list[RequestOutput], reference_logprobs: list[float]
) -> None:
    llm = LLM(dtype="bfloat16", enable_prefix_caching=False, **COMMON)
    runner = llm.llm_engine.executor.worker.model_runner
    assert runner.dtype == torch.bfloat16
    assert next(runner.model.parameters()).dtype == torch.bfloat16
    # bfloat16 drifts ~0.03 nats per token here (measured).
    _assert_close(llm, reference, reference_logprobs, tol=0.1)
