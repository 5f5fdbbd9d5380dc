"""Splitting ops, CUDA graph mode resolution and spec-decode size rounding."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.config.compilation import (
    AttentionCGSupport,
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
)
from minivllm.config.compilation.modes import _log_once_cached
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform

ATTN = "minivllm::unified_attention_with_output"
KV_UPDATE = "minivllm::unified_kv_cache_update"
NONE, PIECEWISE, FULL = CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL
FDO, FAP = CUDAGraphMode.FULL_DECODE_ONLY, CUDAGraphMode.FULL_AND_PIECEWISE
ALWAYS, UNIFORM_BATCH = AttentionCGSupport.ALWAYS, AttentionCGSupport.UNIFORM_BATCH
SINGLE_TOKEN, NEVER = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE, AttentionCGSupport.NEVER


@pytest.fixture(autouse=True)
def _fresh_log_once() -> Iterator[None]:
    _log_once_cached.cache_clear()
    yield
    _log_once_cached.cache_clear()


def test_attention_support_order() -> None:
    assert [m.value for m in (NEVER, SINGLE_TOKEN, UNIFORM_BATCH, ALWAYS)] == [0, 1, 2, 3]


# -- set_splitting_ops_for_v1 ---------------------------------------------------------------
@pytest.mark.parametrize("mode", [0, 1, 2])
def test_other_modes_split_nothing(mode: int) -> None:
    cfg = CompilationConfig(mode=mode, cudagraph_mode="FULL")
    cfg.set_splitting_ops_for_v1(all2all_backend="allgather_reducescatter")
    assert cfg.splitting_ops == []
    kept = CompilationConfig(mode=mode, splitting_ops=[ATTN])
    kept.set_splitting_ops_for_v1(all2all_backend="x")
    assert kept.splitting_ops == [ATTN]


def test_default_splitting_ops_are_attention_and_kv_update() -> None:
    cfg = CompilationConfig(mode=3, cudagraph_mode="FULL_AND_PIECEWISE")
    assert cfg.splitting_ops_contain_kv_cache_update()  # promised before it happens
    cfg.set_splitting_ops_for_v1(all2all_backend="x")
    assert cfg.splitting_ops == [ATTN, KV_UPDATE]
    assert cfg.splitting_ops_contain_attention()
    assert cfg.splitting_ops_contain_kv_cache_update()
    assert cfg.is_attention_compiled_piecewise()
    assert cfg.cudagraph_mode is FAP
    # The class-level op list is copied, not shared.
    cfg.splitting_ops.append("x::y")
    assert CompilationConfig._attention_ops == (ATTN,)


def test_inductor_partition_keeps_kv_update_in_graph() -> None:
    cfg = CompilationConfig(mode=3, use_inductor_graph_partition=True)
    cfg.set_splitting_ops_for_v1(all2all_backend="x")
    assert cfg.splitting_ops == [ATTN]


def test_rocm_kvcache_fusions_are_dropped_by_the_fx_split(caplog: pytest.LogCaptureFixture) -> None:
    cfg = CompilationConfig(mode=3)
    # Set after init, as VllmConfig's level defaults would on ROCm.
    cfg.pass_config.fuse_rope_kvcache = True
    cfg.pass_config.fuse_qk_norm_rope_kvcache = True
    with caplog.at_level(logging.WARNING, logger="minivllm"):
        cfg.set_splitting_ops_for_v1(all2all_backend="x")
    assert cfg.pass_config.fuse_rope_kvcache is False
    assert cfg.pass_config.fuse_qk_norm_rope_kvcache is False
    assert "fuse_rope_kvcache is turned off" in caplog.text


@pytest.mark.parametrize(
    "requested, resolved", [(PIECEWISE, NONE), (FAP, FULL), (FULL, FULL), (FDO, FDO), (NONE, NONE)]
)
def test_empty_splitting_ops_drop_piecewise(
    requested: CUDAGraphMode, resolved: CUDAGraphMode
) -> None:
    cfg = CompilationConfig(mode=3, splitting_ops=[], cudagraph_mode=requested)
    cfg.set_splitting_ops_for_v1(all2all_backend="x")
    assert cfg.cudagraph_mode is resolved
    assert cfg.splitting_ops == []


def test_user_splitting_ops_are_kept() -> None:
    cfg = CompilationConfig(mode=3, splitting_ops=["x::custom"], cudagraph_mode="PIECEWISE")
    cfg.set_splitting_ops_for_v1(all2all_backend="x")
    assert cfg.splitting_ops == ["x::custom"]
    assert cfg.cudagraph_mode is PIECEWISE


@pytest.mark.parametrize(
    "backend, dp, expected",
    [
        ("deepep_high_throughput", 2, NONE),
        ("deepep_high_throughput", 1, FAP),
        ("deepep_low_latency", 2, FAP),
    ],
)
def test_deepep_high_throughput_turns_graphs_off(backend: str, dp: int, expected: Any) -> None:
    cfg = CompilationConfig(mode=3, cudagraph_mode="FULL_AND_PIECEWISE")
    cfg.set_splitting_ops_for_v1(all2all_backend=backend, data_parallel_size=dp)
    assert cfg.cudagraph_mode is expected


# -- attention + quant fusion ----------------------------------------------------------------
def test_attn_fusion_forces_full_graphs() -> None:
    cfg = CompilationConfig(
        mode=3, cudagraph_mode="FULL_AND_PIECEWISE", pass_config={"fuse_attn_quant": True}
    )
    cfg.set_splitting_ops_for_v1(all2all_backend="x")
    assert cfg.splitting_ops == []
    assert cfg.cudagraph_mode is FULL
    assert not cfg.splitting_ops_contain_kv_cache_update()


def test_attn_fusion_with_inductor_partition_keeps_default_split() -> None:
    cfg = CompilationConfig(
        mode=3,
        cudagraph_mode="FULL_AND_PIECEWISE",
        use_inductor_graph_partition=True,
        pass_config={"fuse_attn_quant": True},
    )
    cfg.set_splitting_ops_for_v1(all2all_backend="x")
    assert cfg.splitting_ops == [ATTN]
    assert cfg.cudagraph_mode is FAP


def test_attn_fusion_rejects_attention_splitting_ops() -> None:
    cfg = CompilationConfig(mode=3, splitting_ops=[ATTN], pass_config={"fuse_attn_quant": True})
    with pytest.raises(ValueError, match="fuse_attn_quant"):
        cfg.set_splitting_ops_for_v1(all2all_backend="x")


# -- resolve_cudagraph_mode_and_sizes -------------------------------------------------------
def _resolved(
    requested: CUDAGraphMode | None,
    support: AttentionCGSupport,
    *,
    split_attention: bool = True,
    mode: int = 3,
    **kwargs: Any,
) -> CUDAGraphMode:
    cfg = CompilationConfig(
        mode=mode, cudagraph_mode=requested, splitting_ops=[ATTN] if split_attention else []
    )
    result = cfg.resolve_cudagraph_mode_and_sizes(support, "TEST_ATTN", **kwargs)
    assert cfg.cudagraph_mode is result
    return result


@pytest.mark.parametrize("support", list(AttentionCGSupport))
def test_none_and_unset_resolve_to_none(support: AttentionCGSupport) -> None:
    assert _resolved(None, support) is NONE
    assert _resolved(NONE, support) is NONE


@pytest.mark.parametrize("mode", list(CUDAGraphMode))
def test_always_support_keeps_every_mode(mode: CUDAGraphMode) -> None:
    assert _resolved(mode, ALWAYS) is mode


@pytest.mark.parametrize("split_attention, expected", [(True, FAP), (False, FDO)])
def test_full_mixed_batches_need_always(split_attention: bool, expected: CUDAGraphMode) -> None:
    assert _resolved(FULL, UNIFORM_BATCH, split_attention=split_attention) is expected
    assert _resolved(FULL, SINGLE_TOKEN, split_attention=split_attention) is expected


def test_full_with_never_support_is_an_error() -> None:
    with pytest.raises(ValueError, match="cudagraph_mode=PIECEWISE"):
        _resolved(FULL, NEVER)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"split_attention": True, "mode": 3}, PIECEWISE),
        ({"split_attention": False, "mode": 3}, NONE),
        ({"split_attention": True, "mode": 1}, NONE),
    ],
)
def test_full_decode_with_never_support(kwargs: dict[str, Any], expected: CUDAGraphMode) -> None:
    requested = FAP if kwargs["split_attention"] else FDO
    assert _resolved(requested, NEVER, **kwargs) is expected


def test_full_decode_with_never_support_and_inductor_partition() -> None:
    cfg = CompilationConfig(
        mode=3, cudagraph_mode="FULL_DECODE_ONLY", use_inductor_graph_partition=True
    )
    assert cfg.resolve_cudagraph_mode_and_sizes(NEVER, "TEST_ATTN") is PIECEWISE


@pytest.mark.parametrize(
    "support, split_attention, expected",
    [
        (SINGLE_TOKEN, True, PIECEWISE),
        (SINGLE_TOKEN, False, NONE),
        (UNIFORM_BATCH, True, FAP),
        (UNIFORM_BATCH, False, FDO),
    ],
)
def test_spec_decode_needs_uniform_batch_support(
    support: AttentionCGSupport, split_attention: bool, expected: CUDAGraphMode
) -> None:
    requested = FAP if split_attention else FDO
    got = _resolved(
        requested, support, split_attention=split_attention, uniform_decode_query_len=3,
        use_v2_model_runner=True,
    )  # fmt: skip
    assert got is expected


@pytest.mark.parametrize("requested, expected", [(FAP, FDO), (PIECEWISE, NONE), (FULL, FULL)])
def test_no_piecewise_capture_available(requested: CUDAGraphMode, expected: CUDAGraphMode) -> None:
    assert _resolved(requested, ALWAYS, piecewise_capture_available=False) is expected


def test_v1_runner_rounds_sizes_for_spec_decode() -> None:
    cfg = CompilationConfig(
        mode=3,
        cudagraph_mode="FULL_AND_PIECEWISE",
        splitting_ops=[ATTN],
        cudagraph_capture_sizes=[1, 2, 4, 8, 16],
        max_cudagraph_capture_size=16,
    )
    cfg.resolve_cudagraph_mode_and_sizes(ALWAYS, "TEST_ATTN", uniform_decode_query_len=3)
    # 1, 2 -> 3; 4 -> 6; 8 -> 9; 16 -> 18 is past the max and dropped.
    assert cfg.cudagraph_capture_sizes == [3, 6, 9]
    assert cfg.max_cudagraph_capture_size == 9
    v2 = CompilationConfig(
        mode=3, cudagraph_mode="FULL", cudagraph_capture_sizes=[1, 2], max_cudagraph_capture_size=2
    )
    v2.resolve_cudagraph_mode_and_sizes(
        ALWAYS, "A", uniform_decode_query_len=3, use_v2_model_runner=True
    )
    assert v2.cudagraph_capture_sizes == [1, 2]


def _mamba(num_blocks: int) -> SimpleNamespace:
    return SimpleNamespace(has_mamba_layers=True, num_blocks=num_blocks)


def test_mamba_full_graphs_need_a_block_per_sequence() -> None:
    with pytest.raises(ValueError) as exc:
        _resolved(FAP, ALWAYS, kv_cache_config=_mamba(32), max_num_reqs=64)
    # vLLM's wording (its resolve_cudagraph_mode_and_sizes), with both numbers and the fix.
    message = str(exc.value)
    assert "max_num_seqs (64) exceeds available Mamba cache blocks (32)" in message
    assert "lower max_num_seqs to at most 32" in message.lower()
    assert "gpu_memory_utilization" in message
    # Enough blocks, profiling, piecewise only, or no Mamba layers: fine.
    assert _resolved(FAP, ALWAYS, kv_cache_config=_mamba(64), max_num_reqs=64) is FAP
    assert (
        _resolved(FAP, ALWAYS, kv_cache_config=_mamba(1), max_num_reqs=64, is_profiling=True) is FAP
    )
    assert _resolved(PIECEWISE, ALWAYS, kv_cache_config=_mamba(1), max_num_reqs=64) is PIECEWISE
    plain = SimpleNamespace(has_mamba_layers=False, num_blocks=1)
    assert _resolved(FAP, ALWAYS, kv_cache_config=plain, max_num_reqs=64) is FAP


@settings(max_examples=150, deadline=None)
@given(
    requested=st.sampled_from(list(CUDAGraphMode)),
    support=st.sampled_from(list(AttentionCGSupport)),
    split_attention=st.booleans(),
    query_len=st.integers(1, 4),
    piecewise_ok=st.booleans(),
)
def test_resolution_never_exceeds_support(
    requested: CUDAGraphMode,
    support: AttentionCGSupport,
    split_attention: bool,
    query_len: int,
    piecewise_ok: bool,
) -> None:
    try:
        got = _resolved(
            requested, support, split_attention=split_attention,
            uniform_decode_query_len=query_len, use_v2_model_runner=True,
            piecewise_capture_available=piecewise_ok,
        )  # fmt: skip
    except ValueError:
        assert support is NEVER
        return
    if got.mixed_mode() is FULL:
        assert support is ALWAYS
    if got.has_full_cudagraphs():
        assert support is not NEVER
        if query_len > 1:
            assert support.value >= UNIFORM_BATCH.value
    if not piecewise_ok:
        assert not got.requires_piecewise_compilation()
    # A downgrade never adds graphs that were not asked for.
    assert got.max_cudagraph_mode().value <= requested.max_cudagraph_mode().value


# -- adjust_cudagraph_sizes_for_spec_decode ---------------------------------------------------
def _sized(sizes: list[int], max_size: int) -> CompilationConfig:
    return CompilationConfig(cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=max_size)


def test_adjust_rounds_up_and_drops_sizes_past_the_max() -> None:
    cfg = _sized([1, 2, 4, 8, 16, 32], 32)
    cfg.adjust_cudagraph_sizes_for_spec_decode(4)
    assert cfg.cudagraph_capture_sizes == [4, 8, 16, 32]
    cfg = _sized([1, 5, 10], 10)
    cfg.adjust_cudagraph_sizes_for_spec_decode(4)
    assert cfg.cudagraph_capture_sizes == [4, 8]
    assert cfg.max_cudagraph_capture_size == 8


def test_adjust_is_a_no_op_for_one_token() -> None:
    cfg = _sized([1, 3], 3)
    cfg.adjust_cudagraph_sizes_for_spec_decode(1)
    assert cfg.cudagraph_capture_sizes == [1, 3]
    empty = _sized([], 0)
    empty.adjust_cudagraph_sizes_for_spec_decode(4)
    assert empty.cudagraph_capture_sizes == []


def test_adjust_falls_back_to_one_request() -> None:
    cfg = _sized([5], 5)
    cfg.adjust_cudagraph_sizes_for_spec_decode(4)  # 5 rounds to 8 > 5, but 4 fits
    assert cfg.cudagraph_capture_sizes == [4]
    assert cfg.max_cudagraph_capture_size == 4


def test_adjust_errors_when_nothing_fits() -> None:
    cfg = _sized([2, 3], 3)
    with pytest.raises(ValueError, match="num_speculative_tokens \\(3\\)"):
        cfg.adjust_cudagraph_sizes_for_spec_decode(4)


@settings(max_examples=100, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 600), min_size=1, max_size=20, unique=True),
    q=st.integers(2, 8),
)
def test_adjust_property(sizes: list[int], q: int) -> None:
    max_size = max(sizes)
    cfg = _sized(sorted(sizes), max_size)
    if q > max_size:
        with pytest.raises(ValueError):
            cfg.adjust_cudagraph_sizes_for_spec_decode(q)
        return
    cfg.adjust_cudagraph_sizes_for_spec_decode(q)
    out = cfg.cudagraph_capture_sizes
    assert out == sorted(set(out))
    assert all(s % q == 0 and s <= max_size for s in out)
    assert cfg.max_cudagraph_capture_size == out[-1]


def test_resolution_is_platform_independent() -> None:
    for platform in (CpuPlatform(), CudaPlatform(device_capability=(9, 0))):
        with override_platform(platform):
            assert _resolved(FAP, UNIFORM_BATCH) is FAP
            assert (
                CompilationConfig(mode=CompilationMode.VLLM_COMPILE).mode
                is CompilationMode.VLLM_COMPILE
            )
