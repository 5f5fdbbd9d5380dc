"""Platforms: identity, device capability, graph support and their config rules."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from minivllm.platforms import (
    CpuPlatform,
    CudaPlatform,
    current_platform,
    override_platform,
    parse_platform,
    resolve_current_platform,
)


def _cfg(block_size: int | None = None, dtype: str = "float16", device_type: str = "cpu"):
    """The parts of a VllmConfig that platform rules read."""
    return SimpleNamespace(
        cache_config=SimpleNamespace(block_size=block_size),
        model_config=SimpleNamespace(dtype=dtype, disable_cascade_attn=False),
        device_config=SimpleNamespace(device_type=device_type),
    )


def test_cpu_platform_has_no_static_graphs() -> None:
    cpu = CpuPlatform()
    assert cpu.is_cpu() and not cpu.is_cuda()
    assert not cpu.support_static_graph_mode()
    assert cpu.support_hybrid_kv_cache()  # sliding-window KV groups run on CPU
    assert cpu.get_device_capability() is None
    assert not cpu.is_device_capability_family(100)
    assert cpu.get_compile_backend() == "inductor"
    assert cpu.default_max_cudagraph_capture_size() == 512


@pytest.mark.parametrize(
    ("capability", "family", "ceiling"),
    [((9, 0), 90, 512), ((10, 0), 100, 1024), ((10, 3), 100, 1024), ((12, 0), 120, 512)],
)
def test_cuda_capability_family_and_capture_ceiling(
    capability: tuple[int, int], family: int, ceiling: int
) -> None:
    cuda = CudaPlatform(device_capability=capability)
    assert cuda.is_cuda() and cuda.support_static_graph_mode()
    assert cuda.get_device_capability() == capability
    assert cuda.is_device_capability_family(family)
    assert cuda.is_device_capability_family(100) == (capability[0] == 10)
    assert cuda.is_device_capability(capability)
    assert cuda.has_device_capability((8, 0))
    assert cuda.default_max_cudagraph_capture_size() == ceiling


@pytest.mark.parametrize("platform", [CpuPlatform(), CudaPlatform(device_capability=(9, 0))])
def test_unset_block_size_gets_the_platform_default(platform) -> None:
    cfg = _cfg(device_type=platform.device_type)
    platform.check_and_update_config(cfg)
    assert cfg.cache_config.block_size == platform.get_default_block_size() == 16


def test_user_block_size_is_kept() -> None:
    cfg = _cfg(block_size=32)
    CpuPlatform().check_and_update_config(cfg)
    assert cfg.cache_config.block_size == 32


def test_cuda_rejects_blocks_above_32() -> None:
    with pytest.raises(ValueError, match="at most 32"):
        CudaPlatform(device_capability=(9, 0)).check_and_update_config(
            _cfg(block_size=64, device_type="cuda")
        )


def test_cuda_bfloat16_needs_ampere() -> None:
    with pytest.raises(ValueError, match="float16"):
        CudaPlatform(device_capability=(7, 5)).check_and_update_config(
            _cfg(dtype="torch.bfloat16", device_type="cuda")
        )
    CudaPlatform(device_capability=(8, 0)).check_and_update_config(
        _cfg(dtype="torch.bfloat16", device_type="cuda")
    )


def test_cpu_disables_cascade_attention_and_rejects_other_devices() -> None:
    cfg = _cfg()
    CpuPlatform().check_and_update_config(cfg)
    assert cfg.model_config.disable_cascade_attn is True
    with pytest.raises(ValueError, match="--device cpu"):
        CpuPlatform().check_and_update_config(_cfg(device_type="cuda"))


def test_async_scheduling_support_by_executor() -> None:
    cpu = CpuPlatform()
    assert cpu.supports_async_scheduling("uni")
    assert cpu.supports_async_scheduling(None)
    assert not cpu.supports_async_scheduling("external_launcher")


def test_override_platform_is_scoped() -> None:
    before = resolve_current_platform()
    with override_platform(CudaPlatform(device_capability=(10, 0))) as p:
        assert resolve_current_platform() is p
        assert current_platform.is_device_capability_family(100)
        with override_platform(CpuPlatform()):
            assert current_platform.is_cpu()
        assert current_platform.is_cuda()
    assert resolve_current_platform() is before


def test_parse_platform() -> None:
    assert parse_platform("cpu").is_cpu()
    assert parse_platform("cuda:10.0").get_device_capability() == (10, 0)
    with pytest.raises(ValueError, match="cuda:MAJOR.MINOR"):
        parse_platform("tpu")


@pytest.mark.parametrize(
    ("avx512_bf16", "amx_tile", "expected"),
    [(True, False, True), (False, True, True), (True, True, True), (False, False, False)],
)
def test_cpu_has_native_bf16_asks_torch(
    monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx_tile: bool, expected: bool
) -> None:
    import torch

    from minivllm.platforms import cpu

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx_tile)
    cpu.cpu_has_native_bf16.cache_clear()
    try:
        assert cpu.cpu_has_native_bf16() is expected
    finally:
        cpu.cpu_has_native_bf16.cache_clear()


def test_cpuinfo_flags_fallback() -> None:
    from minivllm.platforms.cpu import cpuinfo_has_native_bf16

    head = "processor\t: 0\nmodel name\t: x\nflags\t\t: fpu sse2 avx2 avx512f"
    assert not cpuinfo_has_native_bf16(head + " avx512bw\n")  # AVX-512 without bf16
    assert cpuinfo_has_native_bf16(head + " avx512_bf16\n")
    assert cpuinfo_has_native_bf16(head + " amx_tile amx_bf16\n")
    assert not cpuinfo_has_native_bf16("processor\t: 0\n")


def test_cpuinfo_fast_int8_needs_vnni_or_amx() -> None:
    from minivllm.platforms.cpu import cpuinfo_has_fast_int8

    head = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma"
    assert not cpuinfo_has_fast_int8(head + "\n")  # AVX2 only
    assert not cpuinfo_has_fast_int8(head + " avx512f avx512bw\n")
    assert cpuinfo_has_fast_int8(head + " avx512f avx512_vnni\n")
    assert cpuinfo_has_fast_int8(head + " amx_tile amx_int8\n")
