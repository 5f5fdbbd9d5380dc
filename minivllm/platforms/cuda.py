"""The CUDA platform.

A `CudaPlatform` may be built with an explicit ``device_capability`` so that a
configuration can be resolved as a given GPU would resolve it, without the GPU
(``minivllm config --platform cuda:9.0``, and the tests).
"""

from __future__ import annotations

from minivllm.platforms.interface import DeviceCapability, Platform, PlatformEnum


class CudaPlatform(Platform):
    """Runs models on an NVIDIA GPU."""

    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"

    def __init__(self, device_capability: tuple[int, int] | None = None) -> None:
        self._capability = DeviceCapability(*device_capability) if device_capability else None

    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        if self._capability is not None:
            return self._capability
        import torch

        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability(device_id)
        return DeviceCapability(major, minor)

    def support_static_graph_mode(self) -> bool:
        return True

    def support_hybrid_kv_cache(self) -> bool:
        return True
