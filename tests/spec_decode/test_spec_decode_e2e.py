"""Speculative decoding end to end on tiny random models: greedy outputs must equal the
outputs without speculation (alone, batched with requests that do not speculate, with
chunked prefill, after preemption, with prefix-cache hits), and a seeded random request
must give the same tokens wherever it runs.

The n-gram proposer runs with a 1..3-token window so that drafts are frequent; the
draft-model proposer uses a second random model (different weights, same vocabulary),
so most of its drafts are rejected and the rollback path runs all the time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from model_helpers import save_random_hf_model

from minivllm import LLM, SamplingParams
from minivllm.outputs import RequestOutput

MAX_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
PROMPTS: list[dict[str, Any]] = [
    {"prompt_token_ids": [5, 6, 7, 8, 9] * 4 + [5, 6]},
    {"prompt_token_ids": [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 11, 12, 13]},
    {"prompt_token_ids": [30 + (i * 7) % 50 for i in range(40)]},
    {"prompt_token_ids": [3, 4, 3, 4, 3]},
]
COMMON = dict(dtype="float32", optimization_level=0, skip_tokenizer_init=True, block_size=8)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    target = tmp_path_factory.mktemp("target")
    draft = tmp_path_factory.mktemp("draft")
    save_random_hf_model(target, seed=0)
    save_random_hf_model(draft, seed=1, num_hidden_layers=1)
    return str(target), str(draft)


def spec_config(method: str, models: tuple[str, str]) -> dict[str, Any]:
    if method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 3,
        }
    return {"method": "draft_model", "model": models[1], "num_speculative_tokens": 3}


def make_llm(models: tuple[str, str], method: str | None, **kwargs: Any) -> LLM:
    extra: dict[str, Any] = dict(COMMON, num_gpu_blocks_override=128)
    extra.update(kwargs)
    if method is not None:
        extra["speculative_config"] = spec_config(method, models)
    return LLM(model=models[0], **extra)


def token_ids(outputs: list[RequestOutput]) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.fixture(scope="module")
def baseline(models: tuple[str, str]) -> list[list[int]]:
    llm = make_llm(models, None)
    return token_ids(llm.generate(PROMPTS, GREEDY, use_tqdm=False))


@pytest.fixture(scope="module", params=["ngram", "draft_model"])
def method(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def spec_llm(models: tuple[str, str], method: str) -> LLM:
    return make_llm(
        models,
        method,
        observability_config={"per_request_spec_decode_metrics": "summary"},
        disable_log_stats=False,
    )


def test_greedy_alone_and_batched_equal_no_speculation(
    spec_llm: LLM, baseline: list[list[int]]
) -> None:
    for prompt, expected in zip(PROMPTS, baseline, strict=True):
        (out,) = spec_llm.generate(prompt, GREEDY, use_tqdm=False)
        assert list(out.outputs[0].token_ids) == expected
    # Batched with requests that never speculate: max_tokens=1 leaves no room for a
    # draft, so those rows run as plain decodes next to verification rows.
    short = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    params = [GREEDY, short] * len(PROMPTS)
    prompts = [p for p in PROMPTS for _ in range(2)]
    outputs = spec_llm.generate(prompts, params, use_tqdm=False)
    assert token_ids(outputs[::2]) == baseline
    assert token_ids(outputs[1::2]) == [b[:1] for b in baseline]
    assert all(o.outputs[0].spec_decode_metrics["num_drafts"] == 0 for o in outputs[1::2])
    drafted = [o.outputs[0].spec_decode_metrics["num_draft_tokens"] for o in outputs[::2]]
    assert sum(drafted) > 0, "no request speculated: the test would prove nothing"
    stats = spec_llm.llm_engine.get_stats()
    assert stats.kv_cache_usage == 0.0, "rolled-back blocks leaked"


def test_chunked_prefill_preemption_and_prefix_hits(
    models: tuple[str, str], method: str, baseline: list[list[int]]
) -> None:
    # A 16-token budget splits the prompts into chunks that share steps with
    # verification steps; 14 blocks of 8 tokens cannot hold the batch, so the
    # scheduler preempts; the second run hits the prefix cache.
    llm = make_llm(
        models,
        method,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        num_gpu_blocks_override=14,
    )
    assert token_ids(llm.generate(PROMPTS, GREEDY, use_tqdm=False)) == baseline
    engine = llm.llm_engine
    assert engine.scheduler.num_preemptions > 0
    spec = engine.get_stats().spec_decoding_stats
    assert spec is not None and spec.num_draft_tokens > 0
    second = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert token_ids(second) == baseline
    assert sum(o.num_cached_tokens or 0 for o in second) >= 16
    assert engine.get_stats().kv_cache_usage == 0.0


def test_seeded_random_requests_are_reproducible(models: tuple[str, str], method: str) -> None:
    llm = make_llm(models, method, num_gpu_blocks_override=14, max_num_seqs=4)
    params = [
        SamplingParams(temperature=0.9, seed=100 + i, max_tokens=MAX_TOKENS, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    batched = token_ids(llm.generate(PROMPTS, params, use_tqdm=False))
    assert llm.llm_engine.scheduler.num_preemptions > 0
    alone = [
        token_ids(llm.generate(p, sp, use_tqdm=False))[0]
        for p, sp in zip(PROMPTS, params, strict=True)
    ]
    assert alone == batched
    # A different seed samples differently (the seed is really used).
    other = SamplingParams(temperature=0.9, seed=7, max_tokens=MAX_TOKENS, ignore_eos=True)
    assert token_ids(llm.generate(PROMPTS[0], other, use_tqdm=False))[0] != batched[0]


def test_metrics_report_drafts_and_acceptance(spec_llm: LLM) -> None:
    spec_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    metrics = {m.name: m for m in spec_llm.get_metrics()}
    drafts = metrics["vllm:spec_decode_num_drafts"].value  # type: ignore[attr-defined]
    draft_tokens = metrics["vllm:spec_decode_num_draft_tokens"].value  # type: ignore[attr-defined]
    accepted = metrics["vllm:spec_decode_num_accepted_tokens"].value  # type: ignore[attr-defined]
    per_pos = metrics["vllm:spec_decode_num_accepted_tokens_per_pos"].values  # type: ignore[attr-defined]
    assert 0 < drafts <= draft_tokens <= 3 * drafts
    assert 0 <= accepted <= draft_tokens and sum(per_pos) == accepted and len(per_pos) == 3
    assert per_pos == sorted(per_pos, reverse=True), "a later position accepted more often"
    stats = spec_llm.llm_engine.get_stats().spec_decoding_stats
    assert stats is not None and (stats.num_drafts, stats.num_accepted_tokens) == (drafts, accepted)
    # Every engine metric is there, as objects with vLLM's names.
    assert metrics["vllm:generation_tokens"].value > 0  # type: ignore[attr-defined]
    assert metrics["vllm:time_to_first_token_seconds"].count > 0  # type: ignore[attr-defined]
    assert "vllm:num_requests_running" in metrics and "vllm:kv_cache_usage_perc" in metrics


def test_get_metrics_needs_stats(models: tuple[str, str], tmp_path: Path) -> None:
    llm = make_llm(models, None)
    with pytest.raises(ValueError, match="disable_log_stats=False"):
        llm.get_metrics()


def test_structured_outputs_with_speculation_are_refused_with_the_reason(spec_llm: LLM) -> None:
    from minivllm.sampling_params import StructuredOutputsParams

    constrained = SamplingParams(
        max_tokens=4, structured_outputs=StructuredOutputsParams(choice=["yes", "no"])
    )
    with pytest.raises(ValueError, match="structured outputs .* speculative decoding"):
        spec_llm.generate(PROMPTS[0], constrained, use_tqdm=False)
    assert spec_llm.llm_engine.get_stats().kv_cache_usage == 0.0
