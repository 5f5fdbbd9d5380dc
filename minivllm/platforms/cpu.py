"""The CPU platform: eager or torch.compile, never static graphs."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from minivllm.platforms.interface import Platform, PlatformEnum

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether the CPU computes bfloat16 in hardware (AVX512-BF16 or AMX-BF16).

    Measured on a 2-core Sapphire Rapids (AMX): bfloat16 GEMMs run 2-4x faster
    than float32 at 1-128 rows, and the GGUF low-bit kernels take bfloat16
    activations.  Without these instructions torch emulates bfloat16 (slower than
    float32), so float32 stays the default there.
    """
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return any(f in flags for f in _NATIVE_BF16_FLAGS)
    return False


class CpuPlatform(Platform):
    """Runs models on the host CPU.

    There is no static graph mode here, so `VllmConfig` resolves every
    ``cudagraph_mode`` to NONE on this platform; torch.compile (VLLM_COMPILE with
    Inductor) still works.
    """

    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"

    def check_and_update_config(self, vllm_config: VllmConfig) -> None:
        super().check_and_update_config(vllm_config)
        device_type = vllm_config.device_config.device_type
        if device_type not in ("", "cpu"):  # "" until DeviceConfig resolves "auto"
            raise ValueError(
                f"device {device_type!r} was requested but the current platform is the CPU; "
                "use --device cpu (or auto), or run on a machine with that device."
            )
        model_config = vllm_config.model_config
        # Cascade attention is a GPU kernel optimisation; the CPU attention backend
        # has no cascade path, so never plan for one.
        if model_config is not None and not model_config.disable_cascade_attn:
            model_config.disable_cascade_attn = True
