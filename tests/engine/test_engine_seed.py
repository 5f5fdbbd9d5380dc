"""``--seed`` (ModelConfig.seed) makes unseeded random sampling reproducible per engine."""

from __future__ import annotations

from minivllm import LLM, SamplingParams

PROMPTS = ["Tell me a story about a cat", "List some fruits:"]
RANDOM = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True)


def _run(seed: int) -> list[list[int]]:
    llm = LLM(seed=seed, optimization_level=0, num_gpu_blocks_override=64)
    return [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, RANDOM, use_tqdm=False)]


def test_engine_seed_reproducible_and_distinct() -> None:
    first, again, other = _run(7), _run(7), _run(8)
    assert first == again
    assert first != other
