"""`DeviceConfig`: which device the model runs on."""

from __future__ import annotations

import re
from dataclasses import field
from typing import TYPE_CHECKING

from minivllm.config.utils import config, hash_factors

if TYPE_CHECKING:
    import torch

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda)(:\d+)?$")


@config
class DeviceConfig:
    """Configuration for the device to use for model execution."""

    device: str = "auto"
    """"auto" (the current platform's device), "cpu", "cuda" or "cuda:N"."""

    device_type: str = field(default="", init=False)
    """The resolved device type, "cpu" or "cuda"."""

    def __post_init__(self) -> None:
        from minivllm.platforms import current_platform

        match = _DEVICE_RE.match(self.device.strip().lower())
        if match is None or (match.group(1) != "cuda" and match.group(2)):
            raise ValueError(
                f"invalid device {self.device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'"
            )
        kind = match.group(1)
        if kind == "auto":
            self.device_type = current_platform.device_type
        elif kind == "cuda" and current_platform.is_cpu():
            raise ValueError(
                f"device={self.device!r} but no CUDA GPU is available; use device='cpu' or 'auto'"
            )
        else:
            self.device_type = kind

    @property
    def torch_device(self) -> torch.device:
        """The device as a torch.device ("cuda:N" keeps its index)."""
        import torch

        spec = self.device.strip().lower()
        return torch.device(spec if spec.startswith(self.device_type) else self.device_type)

    def check_supported(self) -> None:
        """Every accepted device is supported."""

    def compute_hash(self) -> str:
        """No factors, as in vLLM: the platform enters the compile cache key elsewhere."""
        return hash_factors([])
