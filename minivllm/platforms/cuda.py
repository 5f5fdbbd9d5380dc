"""The CUDA platform.

A `CudaPlatform` may be built with an explicit ``device_capability`` so that a
configuration can be resolved as a given GPU would resolve it, without the GPU
(``minivllm config --platform cuda:9.0``, and the tests).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from minivllm.platforms.interface import (
    AttentionBackendChoice,
    DeviceCapability,
    Platform,
    PlatformEnum,
)

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

MAX_CUDA_BLOCK_SIZE = 32
"""The paged-attention kernels on CUDA support KV cache blocks of at most this many tokens."""

DATA_CENTER_BLACKWELL_MAX_CAPTURE_SIZE = 1024
"""Default largest CUDA graph capture size on SM 10.x (B200/GB200/B300): these parts
have the memory and SM count to profit from graphs of twice the usual width."""


def triton_available() -> bool:
    """Whether the triton package is installed (found, not imported: that is slow)."""
    return importlib.util.find_spec("triton") is not None


class CudaPlatform(Platform):
    """Runs models on an NVIDIA GPU."""

    _enum = PlatformEnum.CUDA
    device_name = "cuda"
    device_type = "cuda"
    dispatch_key = "CUDA"
    attention_backends = ("TRITON_PAGED", "CPU_SDPA")

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

    def default_max_cudagraph_capture_size(self) -> int:
        # Data-center Blackwell (the SM 10.x family) gets the wider default ceiling.
        if self.is_device_capability_family(100):
            return DATA_CENTER_BLACKWELL_MAX_CAPTURE_SIZE
        return super().default_max_cudagraph_capture_size()

    def choose_attention_backend(self, device_type: str | None = None) -> AttentionBackendChoice:
        """TRITON_PAGED (CUDA-graph safe) on a CUDA device when triton is installed, else
        CPU_SDPA."""
        if device_type not in (None, "", self.device_type):
            return AttentionBackendChoice(
                "CPU_SDPA", f"the device is {device_type}; TRITON_PAGED needs a CUDA device"
            )
        if not triton_available():
            return AttentionBackendChoice(
                "CPU_SDPA", f"triton is not installed, so {self!r} cannot run TRITON_PAGED"
            )
        return AttentionBackendChoice(
            "TRITON_PAGED", f"the default of {self!r} when triton is installed"
        )

    def check_attention_backend(self, backend: str, device_type: str | None = None) -> None:
        """TRITON_PAGED also needs a CUDA device and the triton package."""
        super().check_attention_backend(backend, device_type)
        if backend != "TRITON_PAGED":
            return
        if device_type not in (None, "", self.device_type):
            raise ValueError(
                f"attention backend TRITON_PAGED runs on CUDA devices only, but the device is "
                f"{device_type}; use -ac.backend=CPU_SDPA (or leave it unset), or --device cuda."
            )
        if not triton_available():
            raise ValueError(
                "attention backend TRITON_PAGED needs the triton package, which is not "
                "installed; pip install triton, or use -ac.backend=CPU_SDPA (or leave it unset)."
            )

    def default_ir_op_priority(self, vllm_config: VllmConfig) -> list[str]:
        """Under Inductor the plain torch RMSNorm wins: Inductor fuses it with its
        neighbours, which an opaque CUDA kernel would prevent.  Without Inductor there
        is nothing to fuse into, so vLLM prefers its CUDA kernel ("vllm_c"), and that
        preference turns ``pass_config.fuse_norm_quant`` on at -O1 and above, as in
        vLLM.  minivllm has no "vllm_c" kernels: RMSNorm runs its next choice."""
        compilation = vllm_config.compilation_config
        # Mode 0 is CompilationMode.NONE (the platforms sit below the config package).
        uses_inductor = compilation.backend == "inductor" and compilation.mode != 0
        return ["native"] if uses_inductor else ["vllm_c", "native"]

    def check_and_update_config(self, vllm_config: VllmConfig) -> None:
        super().check_and_update_config(vllm_config)
        block_size = vllm_config.cache_config.block_size
        if block_size is not None and block_size > MAX_CUDA_BLOCK_SIZE:
            raise ValueError(
                f"block_size={block_size} is not supported on CUDA, whose attention kernels "
                f"take blocks of at most {MAX_CUDA_BLOCK_SIZE} tokens; set --block-size to "
                f"{MAX_CUDA_BLOCK_SIZE} or less (or leave it unset)."
            )
        self._check_dtype(vllm_config)

    def _check_dtype(self, vllm_config: VllmConfig) -> None:
        """bfloat16 needs compute capability 8.0 (Ampere) or newer."""
        model_config = vllm_config.model_config
        capability = self.get_device_capability()
        if model_config is None or capability is None:
            return
        if str(model_config.dtype).removeprefix("torch.") == "bfloat16" and capability < (8, 0):
            raise ValueError(
                f"bfloat16 needs a GPU of compute capability 8.0 or newer, but this one is "
                f"{capability.as_version_str()}; use --dtype float16."
            )
