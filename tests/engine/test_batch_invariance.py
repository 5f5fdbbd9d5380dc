"""Batch invariance (``VLLM_BATCH_INVARIANT=1``): a request's greedy tokens and
their log-probabilities are bit for bit the same whether it runs alone, in a
batch of other requests of mixed lengths, with its prompt cut into chunks, or
preempted on a small KV cache and recomputed.

The model is a tiny random Llama whose decoder matrices are Q4_1 (minivllm's
low-bit kernels, as on the default model), run as the engine runs by default
(compiled forward).  Without the flag a batch's prefill of more than 64 rows
expands the weights to bfloat16 while a short prompt alone runs the int4 kernel,
decode steps run the fused decode graph while a recomputed request runs the
prefill path, and attention pads decode rows to the batch's longest context: the
log-probabilities then differ in their last bits (and on the default model the
greedy tokens too: `minivllm.envs.batch_invariant`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType
from gguf_helpers import write_tiny_gguf

from minivllm import LLM, SamplingParams
from minivllm.kernels import lowbit_cpu

# Mixed lengths, 3 to 66 tokens: batched, the prefill step has more than 64 rows.
PROMPTS = [[(7 * i + 3 * j) % 120 + 1 for j in range(3 + 9 * i)] for i in range(8)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
COMMON: dict[str, Any] = dict(
    skip_tokenizer_init=True, enable_prefix_caching=False, block_size=8, max_model_len=96
)


@pytest.fixture(scope="module", params=[0.0, lowbit_cpu.FAST_RESIDUAL_CUT], ids=["", "cut"])
def model(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Path]:
    """The tiny model, under the flag; also with the low-bit kernels' opt-in residual
    cut, whose threshold turns last-bit differences into whole int8 terms and so
    needs the flag's bit-exact paths to keep a request's tokens."""
    path = tmp_path_factory.mktemp("inv") / "tiny-q4_1.gguf"
    write_tiny_gguf(str(path), tie=True, num_layers=2, layer_type=GGMLQuantizationType.Q4_1)
    before = lowbit_cpu.residual_cut()
    lowbit_cpu.residual_cut(request.param)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("VLLM_BATCH_INVARIANT", "1")
            yield path
    finally:
        lowbit_cpu.residual_cut(before)


def generate(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS, use_tqdm=False)
    results = []
    for out in outs:
        c = out.outputs[0]
        chosen = [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs, strict=True)]
        results.append((list(c.token_ids), chosen))
    return results


@pytest.fixture(scope="module")
def roomy(model: Path) -> LLM:
    return LLM(model=str(model), num_gpu_blocks_override=128, **COMMON)


@pytest.fixture(scope="module")
def alone(roomy: LLM) -> list[tuple[list[int], list[float]]]:
    return [generate(roomy, [p])[0] for p in PROMPTS]


def test_batched_matches_alone(roomy: LLM, alone: list[Any]) -> None:
    assert generate(roomy, PROMPTS) == alone
    cut = lowbit_cpu.residual_cut()
    if cut > 0:  # the cut leaves out second terms here: the values are not the uncut ones
        lowbit_cpu.residual_cut(0.0)
        try:
            assert generate(roomy, PROMPTS[-1:]) != alone[-1:]
        finally:
            lowbit_cpu.residual_cut(cut)
    # And in another order, so each request has other neighbours.
    assert generate(roomy, PROMPTS[::-1]) == alone[::-1]


def test_chunked_and_preempted_match_alone(model: Path, alone: list[Any]) -> None:
    # 12 usable blocks of 8 = 96 tokens for ~8 x 46 tokens of context, prompts
    # cut into 16-token chunks.
    llm = LLM(model=str(model), num_gpu_blocks_override=13, max_num_batched_tokens=16, **COMMON)
    assert generate(llm, PROMPTS) == alone
    assert llm.llm_engine.get_stats().num_preemptions > 0
