"""CUDA graph capture sizes and compile ranges (`_set_cudagraph_sizes`, `_set_compile_ranges`).

Reference numbers are those of docs notes/optimization-levels.md (vLLM under SM90/SM100).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.config.compilation.cudagraph_sizes import (
    default_capture_sizes,
    uniform_decode_sizes,
)
from minivllm.config.model import ModelConfig
from minivllm.config.vllm import VllmConfig
from minivllm.platforms import CudaPlatform, override_platform

SM90 = CudaPlatform(device_capability=(9, 0))
SM100 = CudaPlatform(device_capability=(10, 0))
DEFAULT_GRID_512 = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


@pytest.fixture(scope="module")
def model() -> ModelConfig:
    return ModelConfig()


def sizes_of(
    model: ModelConfig, platform: Any = SM90, sched: dict | None = None, **kwargs: Any
) -> VllmConfig:
    with override_platform(platform):
        return VllmConfig(
            model_config=copy.deepcopy(model),
            scheduler_config={"max_num_batched_tokens": 8192, **(sched or {})},
            **kwargs,
        )


def test_reference_256_seqs(model) -> None:
    compilation_config = sizes_of(model, sched={"max_num_seqs": 256}).compilation_config
    assert compilation_config.cudagraph_capture_sizes == DEFAULT_GRID_512
    assert len(compilation_config.cudagraph_capture_sizes) == 51
    assert compilation_config.max_cudagraph_capture_size == 512


def test_reference_20_seqs(model) -> None:
    compilation_config = sizes_of(model, sched={"max_num_seqs": 20}).compilation_config
    # Ceiling 2 * 20 = 40; the decode width 20 is captured off the 8-stride.
    assert compilation_config.cudagraph_capture_sizes == [1, 2, 4, 8, 16, 20, 24, 32, 40]
    assert compilation_config.max_cudagraph_capture_size == 40


def test_interactivity_captures_every_size_to_32(model) -> None:
    cfg = sizes_of(model, sched={"max_num_seqs": 256}, performance_mode="interactivity")
    sizes = cfg.compilation_config.cudagraph_capture_sizes
    assert sizes[:32] == list(range(1, 33))
    assert sizes[32:] == [s for s in DEFAULT_GRID_512 if s > 32]


def test_throughput_uses_the_balanced_grid(model) -> None:
    cfg = sizes_of(model, sched={"max_num_seqs": 256}, performance_mode="throughput")
    assert cfg.compilation_config.cudagraph_capture_sizes == DEFAULT_GRID_512


def test_data_center_blackwell_goes_to_1024(model) -> None:
    compilation_config = sizes_of(model, SM100, sched={"max_num_seqs": 512}).compilation_config
    assert compilation_config.max_cudagraph_capture_size == 1024
    assert compilation_config.cudagraph_capture_sizes[-3:] == [992, 1008, 1024]
    # The same batch width on Hopper stops at the 512 ceiling.
    assert (
        sizes_of(model, sched={"max_num_seqs": 512}).compilation_config.max_cudagraph_capture_size
        == 512
    )


def test_token_budget_caps_and_is_captured(model) -> None:
    compilation_config = sizes_of(
        model, sched={"max_num_seqs": 64, "max_num_batched_tokens": 100}
    ).compilation_config
    assert compilation_config.cudagraph_capture_sizes == [1, 2, 4, *range(8, 97, 8), 100]
    assert (
        64 in compilation_config.cudagraph_capture_sizes
        and compilation_config.max_cudagraph_capture_size == 100
    )


def test_user_sizes_are_deduplicated_sorted_and_cut(model) -> None:
    cfg = sizes_of(
        model,
        sched={"max_num_batched_tokens": 300},
        compilation_config={"cudagraph_capture_sizes": [64, 8, 8, 1024, 300, 2]},
    )
    compilation_config = cfg.compilation_config
    assert compilation_config.cudagraph_capture_sizes == [2, 8, 64, 300]
    assert compilation_config.max_cudagraph_capture_size == 300


def test_user_max_size_builds_the_grid_without_decode_sizes(model) -> None:
    compilation_config = sizes_of(
        model, sched={"max_num_seqs": 20}, compilation_config={"max_cudagraph_capture_size": 100}
    ).compilation_config
    # An explicit ceiling is kept exactly: no off-stride decode width (20) is added.
    assert compilation_config.cudagraph_capture_sizes == [1, 2, 4, *range(8, 97, 8)]
    # 100 is not on the grid, so the maximum is truncated to the largest size.
    assert compilation_config.max_cudagraph_capture_size == 96


def test_inconsistent_user_max_and_sizes_raise(model) -> None:
    with pytest.raises(ValueError, match="max_cudagraph_capture_size"):
        sizes_of(
            model,
            compilation_config={
                "cudagraph_capture_sizes": [1, 2, 4],
                "max_cudagraph_capture_size": 8,
            },
        )
    consistent = sizes_of(
        model,
        compilation_config={"cudagraph_capture_sizes": [1, 2, 4], "max_cudagraph_capture_size": 4},
    )
    assert consistent.compilation_config.cudagraph_capture_sizes == [1, 2, 4]


def test_compile_sizes_from_capture_sizes(model) -> None:
    compilation_config = sizes_of(
        model,
        sched={"max_num_seqs": 20},
        compilation_config={"compile_sizes": ["cudagraph_capture_sizes", 7]},
    ).compilation_config
    assert compilation_config.compile_sizes == sorted(
        {*compilation_config.cudagraph_capture_sizes, 7}
    )


def test_uniform_decode_sizes_with_draft_tokens() -> None:
    # 3 query tokens per request: whole requests only, within the ceiling.
    sizes = uniform_decode_sizes(256, 3, 512, 512)
    assert all(s % 3 == 0 and s <= 512 for s in sizes)
    assert sizes[:5] == [3, 6, 12, 24, 48]
    assert uniform_decode_sizes(20, 1, 40, 512) == [20]
    assert uniform_decode_sizes(600, 1, 512, 512) == []


@settings(max_examples=200, deadline=None)
@given(
    max_capture=st.integers(1, 1024),
    max_tokens=st.integers(1, 4096),
    mode=st.sampled_from(["balanced", "interactivity", "throughput"]),
)
def test_default_grid_properties(max_capture: int, max_tokens: int, mode: str) -> None:
    cap = min(max_capture, max_tokens)
    sizes = default_capture_sizes(cap, max_tokens, mode)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1
    assert sizes[-1] <= cap
    if max_tokens <= cap:
        assert max_tokens in sizes
    if mode == "interactivity":
        assert set(range(1, min(cap, 32) + 1)) <= set(sizes)


# -- compile ranges ----------------------------------------------------------------


def test_compile_ranges_end_at_the_token_budget(model) -> None:
    compilation_config = sizes_of(model).compilation_config
    assert compilation_config.compile_ranges_endpoints == [8192]
    assert [(r.start, r.end) for r in compilation_config.get_compile_ranges()] == [(1, 8192)]


def test_user_compile_range_endpoints_inside_the_budget_are_kept(model) -> None:
    compilation_config = sizes_of(
        model, compilation_config={"compile_ranges_endpoints": [1, 512, 100_000, 512]}
    ).compilation_config
    assert compilation_config.compile_ranges_endpoints == [512, 8192]
