"""PassConfig: defaults, platform downgrades, flashinfer sizes, logging and hashing."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest
from pydantic import TypeAdapter, ValidationError

from minivllm.config.compilation.modes import _log_once_cached
from minivllm.config.compilation.pass_config import PassConfig
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform

MiB = 1024 * 1024

ALL_SWITCHES = [
    "fuse_norm_quant",
    "fuse_act_quant",
    "fuse_attn_quant",
    "fuse_allreduce_rms",
    "enable_qk_norm_rope_fusion",
    "fuse_rope_kvcache_cat_mla",
    "fuse_act_padding",
    "fuse_mla_dual_rms_norm",
    "fuse_rope_kvcache",
    "fuse_qk_norm_rope_kvcache",
]
# Turned off unless the platform is ROCm (neither CPU nor CUDA is).
ROCM_ONLY = {
    "fuse_act_padding",
    "fuse_mla_dual_rms_norm",
    "fuse_rope_kvcache",
    "fuse_qk_norm_rope_kvcache",
}
CUDA_ALIKE_OK = {"enable_qk_norm_rope_fusion", "fuse_rope_kvcache_cat_mla"}
ANY_PLATFORM = {"fuse_norm_quant", "fuse_act_quant", "fuse_attn_quant", "fuse_allreduce_rms"}


@pytest.fixture(autouse=True)
def _fresh_log_once() -> Iterator[None]:
    _log_once_cached.cache_clear()
    yield
    _log_once_cached.cache_clear()


def test_defaults() -> None:
    pass_config = PassConfig()
    for name in ALL_SWITCHES:
        assert getattr(pass_config, name) is None, name
    assert pass_config.eliminate_noops is True
    assert pass_config.rope_kvcache_fusion_max_token_num == 256
    assert pass_config.fi_allreduce_fusion_max_size_mb is None
    assert {f.name for f in dataclasses.fields(PassConfig)} == {
        *ALL_SWITCHES,
        "eliminate_noops",
        "rope_kvcache_fusion_max_token_num",
        "fi_allreduce_fusion_max_size_mb",
    }


def test_cpu_turns_off_platform_fusions(caplog: pytest.LogCaptureFixture) -> None:
    with override_platform(CpuPlatform()), caplog.at_level(logging.WARNING):
        pass_config = PassConfig(**dict.fromkeys(ALL_SWITCHES, True))
    for name in ROCM_ONLY | CUDA_ALIKE_OK:
        assert getattr(pass_config, name) is False, name
        assert name in caplog.text
    for name in ANY_PLATFORM:
        assert getattr(pass_config, name) is True, name


def test_cuda_keeps_cuda_fusions_and_drops_rocm_ones(caplog: pytest.LogCaptureFixture) -> None:
    with (
        override_platform(CudaPlatform(device_capability=(9, 0))),
        caplog.at_level(logging.WARNING),
    ):
        pass_config = PassConfig(**dict.fromkeys(ALL_SWITCHES, True))
    for name in ROCM_ONLY:
        assert getattr(pass_config, name) is False, name
        assert name in caplog.text
    for name in CUDA_ALIKE_OK | ANY_PLATFORM:
        assert getattr(pass_config, name) is True, name
        assert f"so {name} is turned off" not in caplog.text


def test_unset_and_false_switches_are_left_alone() -> None:
    with override_platform(CpuPlatform()):
        assert PassConfig().fuse_rope_kvcache is None
        assert PassConfig(fuse_rope_kvcache=False).fuse_rope_kvcache is False


def test_warns_when_fusing_without_noop_elimination(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        PassConfig(eliminate_noops=False, fuse_norm_quant=True)
    assert "eliminate_noops" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        PassConfig(eliminate_noops=False)
    assert "eliminate_noops" not in caplog.text


@pytest.mark.parametrize(
    "capability, world_size, expected_mb",
    [
        ((9, 0), 2, 64),
        ((9, 0), 4, 2),
        ((9, 0), 8, 1),
        ((10, 0), 2, 64),
        ((10, 0), 4, 32),
        ((10, 0), 8, 1),
        ((9, 0), 16, None),  # supported world size without a default
        ((8, 0), 2, None),  # capability without defaults
        ((9, 0), 3, None),  # unsupported world size
    ],
)
def test_flashinfer_max_size_defaults(
    capability: tuple[int, int], world_size: int, expected_mb: int | None
) -> None:
    with override_platform(CudaPlatform(device_capability=capability)):
        size = PassConfig().flashinfer_max_size(world_size)
    assert size == (None if expected_mb is None else expected_mb * MiB)


def test_flashinfer_max_size_explicit_and_cpu() -> None:
    with override_platform(CpuPlatform()):
        assert PassConfig().flashinfer_max_size(2) is None  # no defaults off CUDA
        pass_config = PassConfig(fi_allreduce_fusion_max_size_mb=0.5)
        assert pass_config.flashinfer_max_size(4) == MiB // 2
        assert pass_config.flashinfer_max_size(3) is None  # unsupported world size wins


def test_log_enabled_passes(caplog: pytest.LogCaptureFixture) -> None:
    with override_platform(CudaPlatform(device_capability=(9, 0))):
        pass_config = PassConfig(
            fuse_norm_quant=True, enable_qk_norm_rope_fusion=True, fuse_act_quant=False
        )
    with caplog.at_level(logging.INFO, logger="minivllm"):
        names = pass_config.log_enabled_passes()
    assert names == ["norm_quant", "qk_norm_rope_fusion"]
    assert "Enabled custom fusions: norm_quant, qk_norm_rope_fusion" in caplog.text
    assert PassConfig().log_enabled_passes() == []


def test_compute_hash_covers_every_field() -> None:
    base = PassConfig()
    assert base.compute_hash() == PassConfig().compute_hash()
    changes = {
        "fuse_norm_quant": True,
        "fuse_act_quant": False,
        "eliminate_noops": False,
        "rope_kvcache_fusion_max_token_num": 128,
        "fi_allreduce_fusion_max_size_mb": 8.0,
        "fuse_allreduce_rms": True,
    }
    for name, value in changes.items():
        assert PassConfig(**{name: value}).compute_hash() != base.compute_hash(), name


def test_unknown_field_is_rejected() -> None:
    with pytest.raises(ValidationError, match="enable_fusion"):
        PassConfig(enable_fusion=True)  # type: ignore[call-arg]


def test_type_adapter_round_trip() -> None:
    adapter = TypeAdapter(PassConfig)
    pass_config = adapter.validate_python(
        {"fuse_norm_quant": True, "rope_kvcache_fusion_max_token_num": 64}
    )
    assert (
        pass_config.fuse_norm_quant is True and pass_config.rope_kvcache_fusion_max_token_num == 64
    )
    again = adapter.validate_python(adapter.dump_python(pass_config))
    assert again.compute_hash() == pass_config.compute_hash()
