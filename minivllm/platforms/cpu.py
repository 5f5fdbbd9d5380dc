"""The CPU platform: eager or torch.compile, never static graphs."""

from __future__ import annotations

from minivllm.platforms.interface import Platform, PlatformEnum


class CpuPlatform(Platform):
    """Runs models on the host CPU."""

    _enum = PlatformEnum.CPU
    device_name = "cpu"
    device_type = "cpu"
    dispatch_key = "CPU"
