"""The teacher-forced accuracy machinery (tests/accuracy_helpers.py, which
``benchmarks/accuracy.py`` runs on the shipped models) against an independent
reference: HF transformers' float32 model loaded from the same GGUF file.

The model is a tiny random Llama whose decoder matrices are Q4_1, run as the engine
runs the default model: low-bit kernels, -O2, decode steps in the CPU decode graph,
prompts cut into 16-token prefill chunks.  HF computes on the dequantized weights,
so the two differ only by the kernels' rounding, far less than the gap between
neighbouring positions' log-probabilities: a scorer that
read the wrong row, position or request, or the logits after the request's
repetition penalty, would fail these bounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from accuracy_helpers import (
    Scores,
    compare,
    decode_scores,
    hf_model_from_gguf,
    prefill_scores,
    reference_scores,
)
from compile_helpers import make_llm

NUM_TEXTS, LENGTH, PROMPT_LEN, CHUNK = 4, 40, 4, 16
LOGPROB_ATOL = 1e-3
"""Largest |minivllm - HF| log-probability of a text token (measured: 2e-5; the
same one position off: 0.8)."""


def texts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, 128, (LENGTH,), generator=gen).tolist() for _ in range(NUM_TEXTS)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gguf import GGMLQuantizationType
    from gguf_helpers import write_tiny_gguf

    path = tmp_path_factory.mktemp("tf") / "tiny-q4_1.gguf"
    write_tiny_gguf(str(path), tie=True, num_layers=2, layer_type=GGMLQuantizationType.Q4_1)
    return path


@pytest.fixture(scope="module")
def reference(model: Path) -> Scores:
    return reference_scores(hf_model_from_gguf(str(model)), texts())


@pytest.fixture(scope="module")
def llm(model: Path) -> Any:
    # Every prompt of the decode run (4 x 4 tokens) fits one 16-token step.
    return make_llm(
        model,
        decode_graph=True,
        optimization_level=2,
        block_size=8,
        max_model_len=64,
        max_num_batched_tokens=CHUNK,
        enable_prefix_caching=False,
    )


def assert_matches(got: Scores, ref: Scores, where: torch.Tensor, expected: int) -> None:
    mask = where & ref.scored
    assert int(mask.sum()) == expected
    diff = (got.logprob[mask] - ref.logprob[mask]).abs().max().item()
    assert diff < LOGPROB_ATOL, diff
    # The same scores one position off (what a misaligned scorer would report) are
    # far outside that bound: the check above can tell positions apart.
    shifted = (got.logprob[:, 2:] - ref.logprob[:, 1:-1])[mask[:, 2:]].abs().max().item()
    assert shifted > 100 * LOGPROB_ATOL, shifted
    result = compare(got, ref, where)
    assert result.top1_agreement >= 0.98, result
    assert abs(result.ratio - 1) < 1e-3, result


def test_decode_path_teacher_forced_through_the_graph(llm: Any, reference: Scores) -> None:
    run = decode_scores(llm, texts(), PROMPT_LEN)
    assert llm.llm_engine.vllm_config.model_config.quantization == "gguf"
    # Every decode step (4 rows each) ran in the CPU decode graph.
    assert run.num_decode_steps == LENGTH - PROMPT_LEN - 1
    assert run.num_graph_steps == run.num_decode_steps
    assert_matches(run.scores, reference, run.decode_only, NUM_TEXTS * (LENGTH - PROMPT_LEN - 1))
    # The row of the last prefill chunk is scored too, but not counted as decode.
    assert run.scores.scored[:, PROMPT_LEN].all() and not run.decode_only[:, PROMPT_LEN].any()


def test_prefill_path_in_chunks(llm: Any, reference: Scores) -> None:
    assert llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens == CHUNK
    scores = prefill_scores(llm, texts())
    assert_matches(scores, reference, scores.scored, NUM_TEXTS * (LENGTH - 1))
