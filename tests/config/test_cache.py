"""CacheConfig: vLLM's fields, validation, swap-space check and hash factors."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.config import cache as cache_module
from minivllm.config.cache import CacheConfig, GiB_bytes
from minivllm.config.parallel import ParallelConfig


def test_defaults() -> None:
    c = CacheConfig()
    assert c.block_size is None  # filled in by the platform
    assert c.gpu_memory_utilization == 0.9
    assert c.swap_space == 4 and c.swap_space_bytes == 4 * GiB_bytes
    assert c.cache_dtype == "auto"
    assert c.enable_prefix_caching is True
    assert c.prefix_caching_hash_algo == "sha256"
    assert c.cpu_offload_gb == 0
    assert c.num_gpu_blocks is None and c.num_cpu_blocks is None


def test_non_init_fields_are_not_constructor_arguments() -> None:
    with pytest.raises(ValueError):
        CacheConfig(num_gpu_blocks=10)  # type: ignore[call-arg]


@pytest.mark.parametrize("value", [0, -0.1, 1.01, 2])
def test_gpu_memory_utilization_out_of_range(value: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=value)


def test_gpu_memory_utilization_one_is_allowed() -> None:
    assert CacheConfig(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0


@pytest.mark.parametrize("size", [1, 8, 16, 32, 64, 128, 256])
def test_valid_block_sizes(size: int) -> None:
    assert CacheConfig(block_size=size).block_size == size


@pytest.mark.parametrize("size", [0, 7, 24, 512])
def test_invalid_block_sizes(size: int) -> None:
    with pytest.raises(ValueError, match="block_size must be one of"):
        CacheConfig(block_size=size)


def test_negative_cpu_offload_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        CacheConfig(cpu_offload_gb=-1)


def test_positive_cpu_offload_is_unsupported() -> None:
    with pytest.raises(ValueError, match="not supported by minivllm.*cpu_offload_gb"):
        CacheConfig(cpu_offload_gb=2)


@pytest.mark.parametrize("dtype", ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"])
def test_supported_cache_dtypes(dtype: str) -> None:
    assert CacheConfig(cache_dtype=dtype).cache_dtype == dtype  # type: ignore[arg-type]


def test_prefix_cache_retention_interval() -> None:
    assert CacheConfig().prefix_cache_retention_interval == 0  # vLLM's default
    # None (keep every block) is what minivllm's sliding-window groups do.
    assert CacheConfig(prefix_cache_retention_interval=None).prefix_cache_retention_interval is None
    with pytest.raises(ValueError, match="prefix_cache_retention_interval=512.*every full"):
        CacheConfig(prefix_cache_retention_interval=512)
    with pytest.raises(ValueError, match="must be >= 0 or None"):
        CacheConfig(prefix_cache_retention_interval=-1)


def test_unknown_cache_dtype() -> None:
    with pytest.raises(ValueError):
        CacheConfig(cache_dtype="int4")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["fp8_inc", "fp8_ds_mla", "nvfp4"])
def test_vllm_only_cache_dtypes_are_refused(dtype: str) -> None:
    with pytest.raises(ValueError, match="not supported by minivllm"):
        CacheConfig(cache_dtype=dtype)  # type: ignore[arg-type]


def test_prefix_caching_hash_algos() -> None:
    assert CacheConfig(prefix_caching_hash_algo="sha256_cbor").prefix_caching_hash_algo == (
        "sha256_cbor"
    )
    with pytest.raises(ValueError):
        CacheConfig(prefix_caching_hash_algo="md5")  # type: ignore[arg-type]


def test_sliding_window_with_prefix_caching_is_allowed() -> None:
    c = CacheConfig(sliding_window=4096, enable_prefix_caching=True)
    assert c.enable_prefix_caching


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mamba_cache_dtype": "float32"},
        {"mamba_ssm_cache_dtype": "float16"},
        {"mamba_cache_mode": "all"},
        {"mamba_block_size": 256},
        {"use_replayssm": True},
    ],
)
def test_unsupported_cache_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="not supported by minivllm"):
        CacheConfig(**kwargs)


def test_check_supported_sees_later_assignments() -> None:
    c = CacheConfig()
    c.check_supported()
    c.mamba_block_size = 256
    with pytest.raises(ValueError, match="mamba_block_size"):
        c.check_supported()


@pytest.mark.parametrize("field", ["num_gpu_blocks_override", "kv_cache_memory_bytes"])
def test_sizes_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CacheConfig(**{field: 0})


# -- swap space against host memory -------------------------------------------
@pytest.fixture
def host_memory(monkeypatch):
    def set_total(gib: float) -> None:
        monkeypatch.setattr(cache_module, "get_cpu_memory", lambda: int(gib * GiB_bytes))

    return set_total


def test_small_swap_space_is_silent(host_memory, caplog) -> None:
    host_memory(100)
    with caplog.at_level(logging.WARNING, logger="minivllm"):
        CacheConfig(swap_space=39).verify_with_parallel_config(ParallelConfig())
    assert "swap space" not in caplog.text


def test_swap_space_above_40_percent_warns(host_memory, caplog) -> None:
    host_memory(100)
    with caplog.at_level(logging.WARNING, logger="minivllm"):
        CacheConfig(swap_space=41).verify_with_parallel_config(ParallelConfig())
    assert "Possibly too large swap space" in caplog.text
    assert "41.00 GiB out of the 100.00 GiB" in caplog.text


def test_swap_space_above_70_percent_raises(host_memory) -> None:
    host_memory(100)
    with pytest.raises(ValueError, match="Too large swap space"):
        CacheConfig(swap_space=71).verify_with_parallel_config(ParallelConfig())


def test_swap_space_counts_every_tensor_parallel_rank(host_memory) -> None:
    host_memory(100)
    cache = CacheConfig(swap_space=20)
    cache.verify_with_parallel_config(ParallelConfig())  # 20% of memory
    with pytest.raises(ValueError, match="80.00 GiB out of the 100.00 GiB"):
        cache.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=4))


@settings(max_examples=60, deadline=None)
@given(swap=st.floats(0, 200), total=st.floats(1, 200), tp=st.sampled_from([1, 2, 4]))
def test_swap_space_rule_property(swap: float, total: float, tp: int) -> None:
    cache = CacheConfig(swap_space=swap)
    cache_module_get = cache_module.get_cpu_memory
    cache_module.get_cpu_memory = lambda: int(total * GiB_bytes)
    try:
        usage = cache.swap_space_bytes * tp
        if usage > 0.7 * int(total * GiB_bytes):
            with pytest.raises(ValueError):
                cache.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=tp))
        else:
            cache.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=tp))
    finally:
        cache_module.get_cpu_memory = cache_module_get


def test_real_host_memory_is_read_with_psutil() -> None:
    import psutil

    assert cache_module.get_cpu_memory() == psutil.virtual_memory().total


# -- hashing --------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 32},
        {"gpu_memory_utilization": 0.5},
        {"swap_space": 1},
        {"enable_prefix_caching": False},
        {"prefix_caching_hash_algo": "sha256_cbor"},
        {"num_gpu_blocks_override": 100},
        {"kv_cache_memory_bytes": 1 << 30},
        {"cpu_kvcache_space_bytes": 1 << 30},
        {"sliding_window": 128},
        {"calculate_kv_scales": True},
    ],
)
def test_runtime_settings_do_not_change_the_hash(kwargs: dict) -> None:
    assert CacheConfig(**kwargs).compute_hash() == CacheConfig().compute_hash()


@pytest.mark.parametrize("dtype", ["bfloat16", "fp8", "fp8_e5m2"])
def test_cache_dtype_changes_the_hash(dtype: str) -> None:
    assert CacheConfig(cache_dtype=dtype).compute_hash() != CacheConfig().compute_hash()  # type: ignore[arg-type]


def test_hash_ignores_profiling_results() -> None:
    c = CacheConfig()
    before = c.compute_hash()
    c.num_gpu_blocks = 1234
    assert c.compute_hash() == before


def test_metrics_info_is_all_strings() -> None:
    info = CacheConfig(block_size=16).metrics_info()
    assert info["block_size"] == "16"
    assert info["swap_space_bytes"] == str(4 * GiB_bytes)
    assert all(isinstance(v, str) for v in info.values())
    assert "num_gpu_blocks" in info


def test_resolve_kv_cache_dtype() -> None:
    assert CacheConfig().resolve_kv_cache_dtype(torch.bfloat16) == torch.bfloat16
    assert CacheConfig(cache_dtype="fp8").resolve_kv_cache_dtype(torch.float32) == (
        torch.float8_e4m3fn
    )
    assert CacheConfig(cache_dtype="fp8_e5m2").resolve_kv_cache_dtype(torch.float16) == (
        torch.float8_e5m2
    )
