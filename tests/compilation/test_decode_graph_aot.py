"""The CPU decode graph's Dynamo trace is saved with the compile cache: a second start
loads it (and the model forward's) instead of tracing, and decodes the same greedy
tokens as the first start and as the eager engine (-O0)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from compile_helpers import make_llm, start

from minivllm import SamplingParams, envs
from minivllm.compilation.aot import AOT_FILE, SOURCES_FILE

PROMPTS = [[1, 5, 9, 17, 33, 2, 7], [3], [100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 11]]


def decode_graph(llm: Any) -> Any:
    return llm.llm_engine.executor.worker.model_runner.forward_runner.decode_graph


def greedy(llm: Any) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def graph_start(model: Path, **kwargs: Any) -> tuple[Any, dict[str, int], list[list[int]]]:
    """An -O2 start with the decode graph on; its counter delta and greedy tokens,
    decode steps checked to have run in the graph."""
    llm, counts, _ = start(
        model, decode_graph=True, optimization_level=2, block_size=8, max_model_len=128, **kwargs
    )
    graph = decode_graph(llm)
    assert graph is not None and graph.ready
    steps = graph.num_steps
    tokens = greedy(llm)
    assert graph.num_steps - steps >= 11
    return llm, counts, tokens


# The float case (Inductor pieces, no C++ stack) is slow-only: the int4 case covers
# saving and loading the same way, on the path the default model takes.
@pytest.mark.parametrize("kind", ["q4_1", pytest.param("float", marks=pytest.mark.slow)])
def test_second_start_loads_the_decode_graph_trace(
    kind: str, tiny_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if kind == "q4_1":
        # int4 layers: the graph is minivllm's fused C++ decoder stack.
        from gguf import GGMLQuantizationType
        from gguf_helpers import write_tiny_gguf

        model = tmp_path / "tiny.gguf"
        write_tiny_gguf(str(model), tie=True, num_layers=2, layer_type=GGMLQuantizationType.Q4_1)
    else:
        model = tiny_llama  # float layers: Inductor compiles the graph's pieces
    # A fresh cache root for the compile cache; minivllm's C++ kernels (built once per
    # session under the session's root) are shared, not built again.
    root = tmp_path / "root"
    root.mkdir()
    kernels = envs.cache_root() / "kernels"
    kernels.mkdir(parents=True, exist_ok=True)
    (root / "kernels").symlink_to(kernels, target_is_directory=True)
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(root))
    eager = greedy(make_llm(model, compilation_config={"mode": 0}, max_model_len=128))

    cold, cold_counts, cold_tokens = graph_start(model)
    graph_dir = Path(decode_graph(cold).backend.aot_directory())
    assert (graph_dir / AOT_FILE).is_file()
    # The model forward and the decode graph: two traces, both saved.
    assert cold_counts["num_dynamo_traces"] == 2 and cold_counts["num_aot_saves"] == 2
    del cold

    _, warm_counts, warm_tokens = graph_start(model)
    assert warm_counts.get("num_dynamo_traces", 0) == 0
    assert warm_counts["num_aot_loads"] == 2 and warm_counts.get("num_aot_saves", 0) == 0
    assert warm_tokens == cold_tokens == eager
    del _

    # Another KV cache size (not in the config hash): the same saved trace and pieces
    # serve it (the caches' block count is symbolic in the graph).
    resized, resized_counts, resized_tokens = graph_start(model, num_gpu_blocks_override=40)
    runner = resized.llm_engine.executor.worker.model_runner
    assert runner.kv_caches[0].shape[1] == 40
    assert resized_counts.get("num_dynamo_traces", 0) == 0
    assert resized_counts.get("num_backend_compilations", 0) == 0
    assert resized_tokens == eager
    del resized, runner

    # A trace saved before this file decided its dynamic dimensions (its sources file
    # does not name it) is traced again, not trusted.
    sources_file = graph_dir / SOURCES_FILE
    sources = json.loads(sources_file.read_text())
    assert "minivllm.worker.decode_graph" in sources
    del sources["minivllm.worker.decode_graph"]
    sources_file.write_text(json.dumps(sources))
    _, again_counts, again_tokens = graph_start(model)
    assert again_counts["num_dynamo_traces"] == 1 and again_counts["num_aot_saves"] == 1
    assert "minivllm.worker.decode_graph" in json.loads(sources_file.read_text())
    assert again_tokens == eager
