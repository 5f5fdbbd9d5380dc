"""The acceptance matrix (slow: each engine spawns its ranks): greedy tokens under
tensor/pipeline parallelism equal one process's, for the default model in float32
(TP=3, PP=2, TP=3 x PP=2; dequantized without a flag, against one process with
``quantization="none"``) and tiny Llama / Qwen2 / Qwen3 models (TP=2, TP=4, KV
heads fewer than ranks), on the "mp" and "ray" executors.  The default run covers
TP x PP on "mp" in test_parallel_engine.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from dist_helpers import ENGINE, greedy_tokens, reference_tokens, save_tiny

from minivllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

# Eight prompts of different lengths, some ending early: with PP=2 the engine splits
# them over two batches in flight.
DEFAULT_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "1, 1, 2, 3, 5, 8,",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "Q: What is 12 times 12?\nA:",
    "The three primary colors are",
    "import numpy as np\nimport torch\n\nclass Model(torch.nn.Module):\n    def __init__(self):",
    "Hello",
]
DEFAULT_GREEDY = [
    SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True)
    for m in (24, 24, 24, 5, 24, 1, 12, 24)
]
DEFAULT_ENGINE = dict(dtype="float32", optimization_level=0, num_gpu_blocks_override=128)


def _default_tokens(**parallel: object) -> list[list[int]]:
    llm = LLM(**DEFAULT_ENGINE, **parallel)
    try:
        # Dequantized: under TP/PP without a flag (the low-bit path runs on one
        # process), in the reference because it is asked for.
        assert llm.llm_engine.vllm_config.model_config.quantization is None
        outs = llm.generate(DEFAULT_PROMPTS, DEFAULT_GREEDY, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.llm_engine.shutdown()


@pytest.fixture(scope="module")
def default_reference() -> list[list[int]]:
    return _default_tokens(quantization="none")


@pytest.mark.parametrize(
    "parallel",
    [
        {"tensor_parallel_size": 3},
        {"pipeline_parallel_size": 2},
        {"tensor_parallel_size": 3, "pipeline_parallel_size": 2},
        {"tensor_parallel_size": 3, "distributed_executor_backend": "ray"},
    ],
    ids=["tp3", "pp2", "tp3xpp2", "tp3-ray"],
)
def test_default_model_matches_one_process(default_reference, parallel) -> None:  # noqa: ANN001
    assert _default_tokens(**parallel) == default_reference


def test_default_model_refuses_tp2() -> None:
    """9 query heads and 3 KV heads do not split over 2 ranks (vLLM refuses it too)."""
    with pytest.raises(ValueError, match="9 attention heads cannot be split"):
        LLM(tensor_parallel_size=2, **DEFAULT_ENGINE)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize(
    ("tp", "kv_heads", "backend"),
    [(2, 2, "mp"), (4, 2, "mp"), (4, 1, "mp"), (2, 1, "ray"), (4, 2, "ray")],
)
def test_tiny_models_match_one_process(
    tmp_path: Path, family: str, tp: int, kv_heads: int, backend: str
) -> None:
    path = save_tiny(tmp_path, family, num_key_value_heads=kv_heads)
    expected = reference_tokens(path)
    llm = LLM(
        model=str(path), tensor_parallel_size=tp, distributed_executor_backend=backend, **ENGINE
    )
    try:
        assert greedy_tokens(llm) == expected
    finally:
        llm.llm_engine.shutdown()


def test_ray_uses_the_callers_ray_init(tmp_path: Path) -> None:
    """A Ray instance the caller started is used and left running."""
    import ray

    path = save_tiny(tmp_path, "qwen3", num_key_value_heads=2)
    expected = reference_tokens(path)
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        llm = LLM(
            model=str(path),
            tensor_parallel_size=2,
            pipeline_parallel_size=2,
            distributed_executor_backend="ray",
            **ENGINE,
        )
        assert greedy_tokens(llm) == expected
        llm.llm_engine.shutdown()
        assert ray.is_initialized()
    finally:
        ray.shutdown()


def test_tp3_compiled_matches_eager(tmp_path: Path) -> None:
    """The collectives are custom ops, so the compiled (VLLM_COMPILE) forward of a
    tensor-parallel rank runs and gives the eager tokens."""
    path = save_tiny(tmp_path, "llama", num_attention_heads=6, num_key_value_heads=3,
                     hidden_size=96)  # fmt: skip
    expected = reference_tokens(path)
    compiled = {**ENGINE, "enforce_eager": False}
    llm = LLM(model=str(path), tensor_parallel_size=3, pipeline_parallel_size=2, **compiled)
    try:
        assert greedy_tokens(llm) == expected
    finally:
        llm.llm_engine.shutdown()
