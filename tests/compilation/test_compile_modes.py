"""Every compilation mode produces the eager model's greedy tokens; trace-once modes trace once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from compile_helpers import NUM_LAYERS, greedy_tokens, make_llm

from minivllm.args.engine_args import EngineArgs
from minivllm.attention.forward_context import set_forward_context
from minivllm.attention.layer import get_attention_layers
from minivllm.compilation.counter import compilation_counter
from minivllm.compilation.wrapper import build_model_forward
from minivllm.config.vllm import set_current_vllm_config
from minivllm.model_executor.loader import load_model


def runner_of(llm: Any) -> Any:
    return llm.llm_engine.executor.worker.model_runner


@pytest.fixture(scope="module")
def eager_tokens(tiny_llama: Path) -> list[list[int]]:
    return greedy_tokens(make_llm(tiny_llama, compilation_config={"mode": 0}))


@pytest.mark.parametrize(
    ("mode", "backend"),
    [
        ("STOCK_TORCH_COMPILE", "eager"),
        ("DYNAMO_TRACE_ONCE", "aot_eager"),
        ("VLLM_COMPILE", "eager"),
    ],
)
def test_mode_matches_eager(
    tiny_llama: Path, eager_tokens: list[list[int]], mode: str, backend: str
) -> None:
    llm = make_llm(tiny_llama, compilation_config={"mode": mode, "backend": backend})
    forward = runner_of(llm).forward_runner.model_forward
    assert forward.is_compiled and forward.num_traces == 1  # traced at start-up
    assert llm.llm_engine.vllm_config.compilation_config.compilation_time > 0
    assert greedy_tokens(llm) == eager_tokens
    if mode != "STOCK_TORCH_COMPILE":
        # Prefill (21 tokens), decode (4), and the start-up run (8): one trace for all.
        assert forward.num_traces == 1


def test_mode_none_is_plain_model(tiny_llama: Path) -> None:
    llm = make_llm(tiny_llama, compilation_config={"mode": 0})
    runner = runner_of(llm)
    assert runner.forward_runner.model_forward._fn is runner.model
    assert runner.forward_runner.model_forward.num_traces == 0


def _bare_forward(model_dir: Path, mode: int) -> tuple[Any, Any, dict[str, Any]]:
    cfg = EngineArgs(
        model=str(model_dir),
        dtype="float32",
        skip_tokenizer_init=True,
        compilation_config={"mode": mode, "backend": "eager"},
    ).create_engine_config()
    with set_current_vllm_config(cfg):
        model = load_model(str(model_dir), cfg.model_config.hf_config, torch.float32)
    return model, build_model_forward(model, cfg), get_attention_layers(model)


@pytest.mark.parametrize(("mode", "expected_traces"), [(1, 2), (2, 1), (3, 1)])
@torch.inference_mode()
def test_second_batch_size_recompiles_only_in_stock_mode(
    tiny_llama: Path, mode: int, expected_traces: int
) -> None:
    model, forward, layers = _bare_forward(tiny_llama, mode)
    before = compilation_counter.clone()
    # Size 1 breaks Dynamo's 0/1 specialisation: stock torch.compile re-traces for it,
    # the trace-once modes run the symbolic graph they already have.
    for n in (8, 3, 1, 13):
        ids = torch.randint(0, 128, (n,))
        pos = torch.arange(n)
        with set_forward_context(None, layers):
            torch.testing.assert_close(forward(ids, pos), model(ids, pos))
    assert forward.num_traces == expected_traces
    assert compilation_counter.delta(before)["num_dynamo_traces"] == expected_traces
    if mode == 3:
        assert compilation_counter.delta(before)["num_piecewise_graphs_seen"] == NUM_LAYERS + 1
