"""CompilationConfig methods: sizes, compile ranges, custom ops, splitting-op queries, backend."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.config.compilation import CompilationConfig, Range
from minivllm.config.compilation.modes import _log_once_cached
from minivllm.platforms import CpuPlatform, override_platform

ATTN = "minivllm::unified_attention_with_output"
KV_UPDATE = "minivllm::unified_kv_cache_update"


@pytest.fixture(autouse=True)
def _cpu_and_fresh_logs() -> Iterator[None]:
    _log_once_cached.cache_clear()
    with override_platform(CpuPlatform()):
        yield
    _log_once_cached.cache_clear()


# -- post_init_cudagraph_sizes --------------------------------------------------------
def test_post_init_cudagraph_sizes_expands_compile_sizes() -> None:
    cfg = CompilationConfig(
        compile_sizes=[16, "cudagraph_capture_sizes", 16, 3],
        cudagraph_capture_sizes=[8, 1, 4, 2],
        max_cudagraph_capture_size=8,
    )
    cfg.post_init_cudagraph_sizes()
    assert cfg.compile_sizes == [1, 2, 3, 4, 8, 16]
    assert cfg.cudagraph_capture_sizes == [1, 2, 4, 8]


def test_post_init_cudagraph_sizes_without_compile_sizes() -> None:
    cfg = CompilationConfig(cudagraph_capture_sizes=[], max_cudagraph_capture_size=0)
    cfg.post_init_cudagraph_sizes()
    assert cfg.compile_sizes == []
    assert cfg.cudagraph_capture_sizes == []


def test_post_init_cudagraph_sizes_checks_the_max() -> None:
    cfg = CompilationConfig(cudagraph_capture_sizes=[1, 2, 4], max_cudagraph_capture_size=8)
    with pytest.raises(AssertionError, match="largest capture size"):
        cfg.post_init_cudagraph_sizes()


# -- compile ranges ----------------------------------------------------------------------
def test_compile_ranges_from_endpoints() -> None:
    cfg = CompilationConfig(compile_ranges_endpoints=[8192, 256, 256, 1024])
    assert cfg.get_compile_ranges() == [Range(1, 256), Range(257, 1024), Range(1025, 8192)]
    assert CompilationConfig().get_compile_ranges() == []
    assert CompilationConfig(compile_ranges_endpoints=[]).get_compile_ranges() == []
    assert CompilationConfig(compile_ranges_endpoints=[1]).get_compile_ranges() == [Range(1, 1)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 100_000), min_size=1, max_size=12))
def test_compile_ranges_tile_one_to_the_largest_endpoint(endpoints: list[int]) -> None:
    ranges = CompilationConfig(compile_ranges_endpoints=endpoints).get_compile_ranges()
    assert ranges[0].start == 1
    assert ranges[-1].end == max(endpoints)
    for left, right in zip(ranges, ranges[1:], strict=False):
        assert right.start == left.end + 1
    assert [r.end for r in ranges] == sorted(set(endpoints))


def test_range() -> None:
    r = Range(4, 8)
    assert 4 in r and 8 in r and 9 not in r and 3 not in r
    assert not r.is_single_size() and Range(4, 4).is_single_size()
    assert str(r) == "[4, 8]"
    assert {Range(1, 2), Range(1, 2)} == {Range(1, 2)}
    with pytest.raises(ValueError, match="above its end"):
        Range(5, 4)


# -- custom ops ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "ops, op, enabled",
    [
        (["all"], "rms_norm", True),
        (["all", "-rms_norm"], "rms_norm", False),
        (["all", "-rms_norm"], "silu_and_mul", True),
        (["none"], "rms_norm", False),
        (["none", "+rms_norm"], "rms_norm", True),
        (["none", "+rms_norm"], "quant_fp8", False),
    ],
)
def test_is_custom_op_enabled(ops: list[str], op: str, enabled: bool) -> None:
    assert CompilationConfig(custom_ops=ops).is_custom_op_enabled(op) is enabled


@pytest.mark.parametrize("ops", [[], ["+rms_norm"]])
def test_is_custom_op_enabled_needs_a_base_mode(ops: list[str]) -> None:
    with pytest.raises(ValueError, match="exactly one base mode"):
        CompilationConfig(custom_ops=ops).is_custom_op_enabled("rms_norm")


def test_custom_op_log_check(caplog: pytest.LogCaptureFixture) -> None:
    cfg = CompilationConfig(custom_ops=["none", "+rms_norm", "+gelu", "-typo_op"])
    cfg.enabled_custom_ops = Counter({"rms_norm": 3})
    cfg.disabled_custom_ops = Counter({"silu_and_mul": 1})
    with caplog.at_level(logging.DEBUG, logger="minivllm"):
        cfg.custom_op_log_check(op_registry={"rms_norm", "silu_and_mul", "gelu"})
    assert "enabled custom ops" in caplog.text
    assert "Op 'gelu' not present in model, enabling with '+gelu' has no effect" in caplog.text
    assert "Op 'typo_op' doesn't exist" in caplog.text
    assert "disabling with '-typo_op'" in caplog.text
    assert "Op 'rms_norm'" not in caplog.text


def test_custom_op_log_check_without_ops(caplog: pytest.LogCaptureFixture) -> None:
    cfg = CompilationConfig(custom_ops=["none", "+gelu"])
    with caplog.at_level(logging.DEBUG, logger="minivllm"):
        cfg.custom_op_log_check(op_registry=set())
    assert "No custom ops found in model" in caplog.text
    assert "has no effect" not in caplog.text


# -- splitting-op queries ----------------------------------------------------------------
def test_splitting_ops_contain_attention() -> None:
    assert not CompilationConfig().splitting_ops_contain_attention()
    assert not CompilationConfig(splitting_ops=[]).splitting_ops_contain_attention()
    assert CompilationConfig(splitting_ops=[ATTN]).splitting_ops_contain_attention()
    # vLLM's name of the attention op means minivllm's (config/splitting_ops.py).
    copied = CompilationConfig(splitting_ops=["vllm::unified_attention_with_output"])
    assert copied.splitting_ops == [ATTN] and copied.splitting_ops_contain_attention()


def test_splitting_ops_contain_kv_cache_update() -> None:
    # Unset splitting ops without partition or attention fusion: the default will add them.
    assert CompilationConfig().splitting_ops_contain_kv_cache_update()
    assert not CompilationConfig(
        use_inductor_graph_partition=True
    ).splitting_ops_contain_kv_cache_update()
    assert not CompilationConfig(
        pass_config={"fuse_attn_quant": True}
    ).splitting_ops_contain_kv_cache_update()
    assert CompilationConfig(
        splitting_ops=[ATTN, KV_UPDATE]
    ).splitting_ops_contain_kv_cache_update()
    assert not CompilationConfig(splitting_ops=[ATTN]).splitting_ops_contain_kv_cache_update()


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"mode": 3, "splitting_ops": [ATTN]}, True),
        ({"mode": 3, "splitting_ops": []}, False),
        ({"mode": 3}, False),  # splitting ops not settled yet
        ({"mode": 1, "splitting_ops": [ATTN]}, False),
        ({"mode": 3, "splitting_ops": [ATTN], "use_inductor_graph_partition": True}, True),
        (
            {
                "mode": 3,
                "splitting_ops": [ATTN],
                "use_inductor_graph_partition": True,
                "backend": "eager",
            },
            False,
        ),
        ({"mode": 1, "splitting_ops": [ATTN], "use_inductor_graph_partition": True}, True),
        ({"mode": 0, "splitting_ops": [ATTN], "use_inductor_graph_partition": True}, False),
    ],
)
def test_is_attention_compiled_piecewise(kwargs: dict[str, Any], expected: bool) -> None:
    assert CompilationConfig(**kwargs).is_attention_compiled_piecewise() is expected
