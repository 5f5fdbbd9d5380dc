"""The default model (SmolLM2-135M GGUF): -O2 (VLLM_COMPILE + Inductor) and
DYNAMO_TRACE_ONCE produce -O0's greedy tokens.

Dequantized float32 (``quantization="none"``): exact token equality needs a path
whose numbers Inductor's fusions barely move.  On the low-bit path the kernels'
bfloat16 inputs turn float32 rounding differences into different near-tie picks
(measured: one prompt of three started with another token at -O2)."""

from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "1, 1, 2, 3, 5, 8,"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
COMMON = dict(dtype="float32", quantization="none", num_gpu_blocks_override=64, max_model_len=256)


def tokens(llm: LLM) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def eager_tokens() -> list[list[int]]:
    return tokens(LLM(optimization_level=0, **COMMON))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(optimization_level=2),
        # Slow (~9 s): DYNAMO_TRACE_ONCE giving eager's greedy tokens is covered fast on a
        # tiny Llama by test_compile_modes.py::test_mode_matches_eager, and Dynamo tracing
        # of the default model by the O2-inductor case.
        pytest.param(
            dict(compilation_config={"mode": "DYNAMO_TRACE_ONCE", "backend": "eager"}),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["O2-inductor", "trace-once-eager"],
)
def test_default_model_matches_eager(eager_tokens: list[list[int]], kwargs: dict) -> None:
    llm = LLM(**COMMON, **kwargs)
    assert llm.llm_engine.vllm_config.compilation_config.mode.value >= 2
    assert tokens(llm) == eager_tokens
