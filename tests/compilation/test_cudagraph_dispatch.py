"""The CUDA graph dispatcher (plain Python, tested on CPU) and batch padding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minivllm.args.engine_args import EngineArgs
from minivllm.attention.layer import bind_kv_caches
from minivllm.attention.paged_kv import allocate_kv_caches, build_attention_metadata
from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.worker.cudagraph import BatchDescriptor, CudagraphDispatcher
from minivllm.worker.forward_runner import ForwardRunner, pad_step_inputs

SIZES = [1, 2, 4, 8, 16]
F, P, N = CUDAGraphMode.FULL, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE


@pytest.mark.parametrize(
    ("mode", "decode", "mixed"),
    [
        (CUDAGraphMode.FULL_AND_PIECEWISE, F, P),
        (CUDAGraphMode.FULL_DECODE_ONLY, F, N),
        (CUDAGraphMode.PIECEWISE, P, P),
        (CUDAGraphMode.FULL, F, F),
        (CUDAGraphMode.NONE, N, N),
    ],
)
def test_mode_per_batch_kind(mode: CUDAGraphMode, decode: CUDAGraphMode, mixed: CUDAGraphMode):
    d = CudagraphDispatcher(mode, SIZES)
    assert d.dispatch(BatchDescriptor(3, uniform_decode=True)) == (decode, 4 if decode else 3)
    assert d.dispatch(BatchDescriptor(3, uniform_decode=False)) == (mixed, 4 if mixed else 3)
    # Above the largest capture size everything runs eagerly, unpadded.
    assert d.dispatch(BatchDescriptor(17, uniform_decode=True)) == (N, 17)


@given(st.integers(1, 40), st.booleans())
def test_padding_is_the_smallest_capture_size_that_fits(n: int, uniform: bool) -> None:
    d = CudagraphDispatcher(CUDAGraphMode.FULL_AND_PIECEWISE, [16, 1, 8, 2, 4, 24])
    mode, padded = d.dispatch(BatchDescriptor(n, uniform))
    if n > 24:
        assert (mode, padded) == (N, n)
    else:
        assert padded >= n and padded in d.capture_sizes
        assert all(s < n or s >= padded for s in d.capture_sizes)


def test_capture_plan_descends_and_covers_every_graph() -> None:
    plan = CudagraphDispatcher(CUDAGraphMode.FULL_AND_PIECEWISE, [4, 1, 2]).capture_plan()
    assert plan == [(P, 4, False), (F, 4, True), (P, 2, False), (F, 2, True), (P, 1, False),
                    (F, 1, True)]  # fmt: skip
    # Piecewise graphs do not depend on the batch's composition: one per size.
    assert CudagraphDispatcher(P, [2, 1]).capture_plan() == [(P, 2, False), (P, 1, False)]
    assert CudagraphDispatcher(N, [2, 1]).capture_plan() == []


def test_cpu_platform_resolves_cudagraph_mode_to_none() -> None:
    cfg = EngineArgs(optimization_level=2).create_engine_config()
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.NONE


def test_pad_step_inputs_marks_padding_slots() -> None:
    attn_metadata = build_attention_metadata([2, 1], [2, 5], [[0], [1, 2]], block_size=4)
    ids, pos, padded_metadata = pad_step_inputs(
        torch.tensor([5, 6, 7]), torch.tensor([0, 1, 4]), attn_metadata, 8
    )
    assert ids.tolist() == [5, 6, 7, 0, 0, 0, 0, 0] and pos.shape == (8,)
    assert padded_metadata.slot_mapping.tolist() == [0, 1, 8, -1, -1, -1, -1, -1]
    assert padded_metadata.num_actual_tokens == 3


def test_pad_step_inputs_pads_every_kv_cache_group() -> None:
    """Sliding-window models carry one metadata per KV cache group: each gets the padding."""
    attn_metadata = build_attention_metadata([2, 1], [2, 5], [[0], [1, 2]], block_size=4)
    other = build_attention_metadata([2, 1], [2, 5], [[3], [4, 5]], block_size=4)
    attn_metadata.group_metadata = (attn_metadata, other)
    _, _, padded_metadata = pad_step_inputs(
        torch.tensor([5, 6, 7]), torch.tensor([0, 1, 4]), attn_metadata, 5
    )
    assert (
        padded_metadata.group_metadata is not None
        and padded_metadata.group_metadata[0] is padded_metadata
    )
    assert padded_metadata.slot_mapping.tolist() == [0, 1, 8, -1, -1]
    assert padded_metadata.group_metadata[1].slot_mapping.tolist() == [12, 13, 20, -1, -1]


@torch.inference_mode()
def test_padded_run_equals_unpadded_and_writes_no_padding(tiny_llama: Path) -> None:
    """A dispatcher that pads (fake capture: nothing is captured on CPU) changes nothing."""
    from minivllm.attention.forward_context import set_forward_context
    from minivllm.attention.layer import get_attention_layers
    from minivllm.config.vllm import set_current_vllm_config
    from minivllm.model_executor.loader import load_model

    cfg = EngineArgs(
        model=str(tiny_llama), dtype="float32", skip_tokenizer_init=True, optimization_level=0
    ).create_engine_config()
    with set_current_vllm_config(cfg):
        model = load_model(str(tiny_llama), cfg.model_config.hf_config, torch.float32)
    layers = get_attention_layers(model)
    first = next(iter(layers.values()))
    dispatcher = CudagraphDispatcher(CUDAGraphMode.PIECEWISE, [16])
    runner = ForwardRunner(model, cfg, layers, torch.device("cpu"), dispatcher=dispatcher)
    attn_metadata = build_attention_metadata([5, 2], [5, 2], [[0, 1], [2]], block_size=4)
    ids = torch.tensor([1, 2, 3, 4, 5, 6, 7])
    pos = torch.tensor([0, 1, 2, 3, 4, 0, 1])

    def fresh_cache() -> list[torch.Tensor]:
        caches = allocate_kv_caches(len(layers), 8, 4, first.num_kv_heads, first.head_size,
                                    torch.float32)  # fmt: skip
        bind_kv_caches(layers, caches)
        return caches

    plain_cache = fresh_cache()
    with set_forward_context(attn_metadata, layers):
        expected = model(ids, pos)
    padded_cache = fresh_cache()
    got = runner.run(ids, pos, attn_metadata)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)
    for a, b in zip(plain_cache, padded_cache, strict=True):
        torch.testing.assert_close(a, b)  # padding rows wrote nothing
