"""The CPU decode graph (`minivllm.worker.decode_graph`): decode steps run as one
compiled graph with attention inlined, and give the piecewise forward's tokens.

Each engine is built once; the test switches the graph off and on in the same engine
(``decode_graph.ready``), so both paths run the same weights and KV cache layout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from compile_helpers import make_llm

from minivllm import SamplingParams
from minivllm.attention.metadata import AttentionMetadata
from minivllm.worker.decode_graph import DECODE_GRAPH_MAX_SEQS

# Prompts of 1..40 tokens with block_size 8: contexts span 1 to 7 blocks, so the
# graph's block-table width (a dynamic dimension) changes while requests decode.
PROMPTS = [
    [1, 5, 9, 17, 33, 2, 7],
    [3],
    [100, 90, 80, 70, 60, 50, 40, 30, 20, 10, 11],
    [(7 * i) % 120 + 1 for i in range(40)],
]


def decode_graph(llm: Any) -> Any:
    return llm.llm_engine.executor.worker.model_runner.forward_runner.decode_graph


def run(llm: Any, graph_on: bool, prompts: list[list[int]], n: int = 20) -> list[Any]:
    decode_graph(llm).ready = graph_on
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, logprobs=2)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def assert_same(graph: list[Any], piecewise: list[Any], atol: float = 1e-4) -> None:
    """Same tokens, and each top log-probability within ``atol``.  A token that only
    one path lists must be a near-tie at the cut of the top-k: the other path's
    weakest listed token is within ``atol`` of it (seen on Gemma 3: ranks 2 and 3
    0.002 apart, swapped by the paths' float32 rounding)."""
    for g, p in zip(graph, piecewise, strict=True):
        assert list(g.token_ids) == list(p.token_ids)
        for lg, lp in zip(g.logprobs, p.logprobs, strict=True):
            for one, other in ((lp, lg), (lg, lp)):
                weakest = min(e.logprob for e in other.values())
                for tok, entry in one.items():
                    if tok in other:
                        assert other[tok].logprob == pytest.approx(entry.logprob, abs=atol)
                    else:
                        assert abs(entry.logprob - weakest) <= atol, (tok, entry, other)


@pytest.fixture(scope="module")
def llama(tiny_llama: Path) -> Any:
    return make_llm(tiny_llama, decode_graph=True, optimization_level=2, block_size=8)


def test_decode_steps_run_in_the_graph_and_match_piecewise(llama: Any) -> None:
    graph = decode_graph(llama)
    assert graph is not None and graph.ready
    # Where minivllm's C++ kernels build, the graph's attention is their op.
    from minivllm.kernels import lowbit_cpu

    assert graph.native_attention == lowbit_cpu.available()
    piecewise = run(llama, False, PROMPTS)
    steps = graph.num_steps
    on = run(llama, True, PROMPTS)
    # 19 decode steps of the batch (the first token comes from the prefill step).
    assert graph.num_steps - steps >= 19
    assert_same(on, piecewise)
    # One request alone (the batch-1 step) and a batch of two.
    assert_same(run(llama, True, PROMPTS[3:]), run(llama, False, PROMPTS[3:]))
    assert_same(run(llama, True, PROMPTS[:2]), run(llama, False, PROMPTS[:2]))


def test_only_plain_decode_steps_take_the_graph(llama: Any) -> None:
    graph = decode_graph(llama)
    graph.ready = True

    def step_metadata(query_lens: list[int]) -> AttentionMetadata:
        import torch

        n = len(query_lens)
        return AttentionMetadata(
            num_actual_tokens=sum(query_lens),
            max_query_len=max(query_lens),
            max_seq_len=16,
            query_start_loc=torch.zeros(n + 1, dtype=torch.int32),
            seq_lens=torch.full((n,), 16, dtype=torch.int32),
            block_tables=torch.zeros(n, 2, dtype=torch.int32),
            slot_mapping=torch.zeros(sum(query_lens), dtype=torch.long),
        )

    assert graph.accepts(3, step_metadata([1, 1, 1]))
    assert not graph.accepts(4, step_metadata([1, 3]))  # a prefill chunk in the step
    assert not graph.accepts(1, None)  # a dummy run
    big = min(DECODE_GRAPH_MAX_SEQS, graph.max_seqs) + 1
    assert not graph.accepts(big, step_metadata([1] * big))


def test_sliding_window_model_matches_piecewise(tmp_path: Path) -> None:
    """Gemma 3 (every other layer a 6-token sliding window, two KV cache groups)."""
    from model_helpers import save_random_hf_model

    save_random_hf_model(
        tmp_path,
        config_name="Gemma3TextConfig",
        architecture="Gemma3ForCausalLM",
        head_dim=16,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    )
    llm = make_llm(
        tmp_path, decode_graph=True, optimization_level=2, block_size=8, max_model_len=128
    )
    graph = decode_graph(llm)
    assert graph is not None and graph.num_groups == 2
    steps = graph.num_steps
    assert_same(run(llm, True, PROMPTS), run(llm, False, PROMPTS))
    assert graph.num_steps > steps


def test_off_switch_and_eager_mode(tiny_llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    eager = make_llm(tiny_llama, decode_graph=True, optimization_level=0)
    assert decode_graph(eager) is None
    monkeypatch.setenv("MINIVLLM_CPU_DECODE_GRAPH", "0")
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.worker.decode_graph import decode_graph_wanted

    cfg = EngineArgs(model=str(tiny_llama), skip_tokenizer_init=True).create_engine_config()
    assert decode_graph_wanted(cfg, {"x": object()}) == "MINIVLLM_CPU_DECODE_GRAPH=0"


def test_not_with_parallelism(tiny_llama: Path) -> None:
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.worker.decode_graph import decode_graph_wanted

    layers = {"x": object()}
    for kwargs in (dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)):
        cfg = EngineArgs(
            model=str(tiny_llama), skip_tokenizer_init=True, **kwargs
        ).create_engine_config()
        assert decode_graph_wanted(cfg, layers).startswith("tensor/pipeline")
    # An fp8 KV cache is refused here too: this is the one place that decides.
    cfg = EngineArgs(
        model=str(tiny_llama), skip_tokenizer_init=True, kv_cache_dtype="fp8"
    ).create_engine_config()
    assert decode_graph_wanted(cfg, layers).startswith("fp8 KV cache")


def test_low_bit_gguf_matches_piecewise(tmp_path: Path) -> None:
    """GGUF weights computed on low-bit (every matrix Q8_0: int8 kernels), 18
    requests, so decode steps also take the 16-64-row int8 path (int8 x int8 where
    the CPU has VNNI/AMX)."""
    from gguf_helpers import write_tiny_gguf

    from minivllm.platforms.cpu import cpu_has_fast_int8_matmul

    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(str(path), tie=False, num_layers=2, all_q8_0=True)
    llm = make_llm(path, decode_graph=True, optimization_level=2, block_size=8, max_model_len=128)
    assert llm.llm_engine.vllm_config.model_config.quantization == "gguf"
    graph = decode_graph(llm)
    prompts = [[(5 * i + 3 * j) % 120 + 1 for j in range(3 + 2 * i)] for i in range(18)]
    steps = graph.num_steps
    # Without VNNI/AMX the 16-64-row int8 linears take bfloat16 activations (torch's
    # weight-only kernel), so the graph's float32 rounding differences grow to ~1e-4.
    atol = 1e-4 if cpu_has_fast_int8_matmul() else 1e-3
    assert_same(run(llm, True, prompts, n=12), run(llm, False, prompts, n=12), atol)
    assert graph.num_steps - steps >= 11


def test_q4_gguf_layers_fuse_and_match_piecewise(tmp_path: Path) -> None:
    """Q4_1 decoder layers (minivllm's int4 kernels): in the decode graph all layers
    are one ``minivllm_cpu::decoder_stack`` call a step, with the piecewise
    forward's tokens."""
    import torch
    from gguf import GGMLQuantizationType
    from gguf_helpers import write_tiny_gguf

    from minivllm.kernels import lowbit_cpu

    assert lowbit_cpu.available(), "minivllm's C++ kernels did not build here"
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(str(path), tie=True, num_layers=2, layer_type=GGMLQuantizationType.Q4_1)
    llm = make_llm(path, decode_graph=True, optimization_level=2, block_size=8, max_model_len=128)
    graph = decode_graph(llm)
    piecewise = run(llm, False, PROMPTS)
    steps = graph.num_steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fused = run(llm, True, PROMPTS)
    assert graph.num_steps - steps >= 19
    calls = {e.key: e.count for e in prof.key_averages()}
    # One stack call a step, no separate GEMM or attention op: the layers ran fused.
    assert calls.get("minivllm_cpu::decoder_stack_bound", 0) >= 19
    assert "minivllm_cpu::decode_attention" not in calls
    assert_same(fused, piecewise)
