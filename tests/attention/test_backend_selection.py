"""`AttentionConfig.backend` chooses the attention backend, or is refused with the reason."""

from __future__ import annotations

import pytest

from minivllm.attention.backends import get_attn_backend
from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend
from minivllm.attention.layer import Attention
from minivllm.config.attention import AttentionConfig
from minivllm.config.vllm import VllmConfig, set_current_vllm_config
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform

CUDA = CudaPlatform(device_capability=(9, 0))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("CPU_SDPA", "CPU_SDPA"),
        ("cpu_attn", "CPU_SDPA"),  # vLLM's CPU backend
        ("TORCH_SDPA", "CPU_SDPA"),
        ("TRITON_ATTN", "TRITON_PAGED"),  # vLLM's Triton paged-attention backend
        ("triton_paged", "TRITON_PAGED"),
    ],
)
def test_backend_names_minivllms_and_vllms(name: str, expected: str) -> None:
    assert AttentionConfig(backend=name).backend == expected


@pytest.mark.parametrize("name", ["FLASH_ATTN", "FLASHINFER", "FLEX_ATTENTION", "nonsense"])
def test_backends_minivllm_lacks_are_refused_with_the_ones_it_has(name: str) -> None:
    with pytest.raises(ValueError) as exc:
        AttentionConfig(backend=name)
    message = str(exc.value)
    assert f"{name!r} is not available in minivllm" in message
    assert "CPU_SDPA" in message and "TRITON_PAGED" in message and "TRITON_ATTN" in message


def test_a_backend_of_another_platform_is_refused_at_resolution() -> None:
    with override_platform(CpuPlatform()), pytest.raises(ValueError) as exc:
        VllmConfig(attention_config=AttentionConfig(backend="TRITON_ATTN"))
    assert "TRITON_PAGED does not run on CpuPlatform" in str(exc.value)
    assert "on this platform: CPU_SDPA" in str(exc.value)
    with override_platform(CUDA):
        cfg = VllmConfig(attention_config=AttentionConfig(backend="TRITON_ATTN"))
    assert cfg.attention_config.backend == "TRITON_PAGED"


def make_layer() -> Attention:
    return Attention(4, 16, 0.25, 2, prefix="layers.0.attn")


def test_the_configured_backend_is_the_one_the_layers_run() -> None:
    with override_platform(CUDA):
        # Unset: the platform's choice (Triton on CUDA) ...
        default = VllmConfig()
        with set_current_vllm_config(default):
            assert type(make_layer().impl).__name__ == "TritonPagedBackend"
        # ... set: the configured one, even where it is not the default.
        sdpa = VllmConfig(attention_config=AttentionConfig(backend="TORCH_SDPA"))
        with set_current_vllm_config(sdpa):
            assert isinstance(make_layer().impl, CpuSdpaBackend)
    with override_platform(CpuPlatform()):
        assert isinstance(get_attn_backend("CPU_ATTN"), CpuSdpaBackend)
        with pytest.raises(ValueError, match="available here: CPU_SDPA"):
            get_attn_backend("TRITON_ATTN")


def test_resolution_records_the_backend_the_layers_run() -> None:
    """The platform's default is decided in one place: resolution writes it into the
    config, and get_attn_backend (with or without a config) agrees."""
    with override_platform(CUDA):
        cfg = VllmConfig()
        assert cfg.attention_config.backend == "TRITON_PAGED"
        assert type(get_attn_backend()).__name__ == "TritonPagedBackend"
    with override_platform(CpuPlatform()):
        assert VllmConfig().attention_config.backend == "CPU_SDPA"
        assert isinstance(get_attn_backend(), CpuSdpaBackend)


def test_cuda_without_triton_defaults_to_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("minivllm.platforms.cuda.triton_available", lambda: False)
    with override_platform(CUDA):
        cfg = VllmConfig()
        assert cfg.attention_config.backend == "CPU_SDPA"
        assert isinstance(get_attn_backend(), CpuSdpaBackend)  # no config: same choice
        with set_current_vllm_config(cfg):
            assert isinstance(make_layer().impl, CpuSdpaBackend)
        with pytest.raises(ValueError, match="needs the triton package"):
            VllmConfig(attention_config=AttentionConfig(backend="TRITON_PAGED"))
