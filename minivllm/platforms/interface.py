"""The platform interface: what the configuration and the engine ask of hardware."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


class PlatformEnum(enum.Enum):
    CUDA = enum.auto()
    CPU = enum.auto()


class AttentionBackendChoice(NamedTuple):
    """The attention backend a platform runs when `AttentionConfig.backend` is unset."""

    name: str
    """The backend (an `AttentionConfig.backend` name such as "TRITON_PAGED")."""
    reason: str
    """Why this one, for ``minivllm config --explain``."""


class DeviceCapability(NamedTuple):
    """A CUDA compute capability such as (9, 0)."""

    major: int
    minor: int

    def as_version_str(self) -> str:
        return f"{self.major}.{self.minor}"

    def to_int(self) -> int:
        """``(9, 0) -> 90``, ``(10, 0) -> 100``."""
        return self.major * 10 + self.minor


class Platform:
    """Base class; `CpuPlatform` and `CudaPlatform` fill it in."""

    _enum: PlatformEnum
    device_name: str
    device_type: str
    dispatch_key: str = "CPU"
    simple_compile_backend: str = "inductor"
    supported_dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    attention_backends: tuple[str, ...] = ("CPU_SDPA",)
    """Attention backends that run here (`AttentionConfig.backend` names), default first."""

    # -- identity -----------------------------------------------------------
    def is_cuda(self) -> bool:
        return self._enum == PlatformEnum.CUDA

    def is_cuda_alike(self) -> bool:
        return self.is_cuda()

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_tpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return self._enum == PlatformEnum.CPU

    def is_out_of_tree(self) -> bool:
        return False

    # -- device capability --------------------------------------------------
    def get_device_capability(self, device_id: int = 0) -> DeviceCapability | None:
        return None

    def has_device_capability(self, capability: tuple[int, int] | int, device_id: int = 0) -> bool:
        """True when the device is at least ``capability``."""
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return current >= capability
        return current.to_int() >= capability

    def is_device_capability(self, capability: tuple[int, int] | int, device_id: int = 0) -> bool:
        """True when the device is exactly ``capability``."""
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return current == capability
        return current.to_int() == capability

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        """True when the device's major version matches, e.g. ``100`` for any 10.x."""
        current = self.get_device_capability(device_id)
        if current is None:
            return False
        return current.to_int() // 10 == capability // 10

    # -- compilation and graphs --------------------------------------------
    def get_compile_backend(self) -> str:
        """The torch.compile backend that VLLM_COMPILE pieces use here."""
        return self.simple_compile_backend

    def support_static_graph_mode(self) -> bool:
        """Whether the platform can capture and replay static (CUDA) graphs."""
        return False

    def support_hybrid_kv_cache(self) -> bool:
        return False

    def default_max_cudagraph_capture_size(self) -> int:
        """The platform's default largest capture size (before max_num_batched_tokens caps it)."""
        return 512

    def get_default_block_size(self) -> int:
        return 16

    def default_ir_op_priority(self, vllm_config: VllmConfig) -> list[str]:
        """Implementations of the fusable ops (RMSNorm) to prefer here, best first.

        `KernelConfig.set_platform_defaults` appends them to the user's lists once the
        compilation mode and backend are known; the fusion defaults read the head.
        """
        return ["native"]

    def supports_async_scheduling(self, executor_backend: str | None) -> bool:
        """Whether the engine can overlap scheduling with execution under ``executor_backend``.

        ``external_launcher`` (torchrun-style SPMD) steps every rank in lockstep with
        the caller, so there is nothing to overlap with.
        """
        return executor_backend != "external_launcher"

    def apply_config_platform_defaults(self, vllm_config: VllmConfig) -> None:
        """Fill platform-specific defaults into fields the user left unset.

        Called from `VllmConfig.__post_init__` before the compilation mode and the
        optimization-level defaults are resolved, so anything set here wins over them.
        """

    def check_and_update_config(self, vllm_config: VllmConfig) -> None:
        """Adjust a configuration to what this platform can run (called from post-init).

        Runs after static-graph support and capture sizes are resolved; raise
        `ValueError` for what cannot run here.  The base version gives the KV cache
        its block size when the user left it unset (CacheConfig has no static default
        for it); subclasses call it first.
        """
        if vllm_config.cache_config.block_size is None:
            vllm_config.cache_config.block_size = self.get_default_block_size()

    # -- attention --------------------------------------------------------
    def choose_attention_backend(self, device_type: str | None = None) -> AttentionBackendChoice:
        """The attention backend that runs on ``device_type`` when the user chose none.

        The one place this default is decided: `VllmConfig` resolution records it in
        ``attention_config.backend`` and `get_attn_backend` falls back to it.
        """
        return AttentionBackendChoice(
            self.attention_backends[0], f"the default attention backend of {self!r}"
        )

    def check_attention_backend(self, backend: str, device_type: str | None = None) -> None:
        """Raise `ValueError` when the chosen ``backend`` cannot run on ``device_type`` here."""
        if backend not in self.attention_backends:
            raise ValueError(
                f"attention backend {backend} does not run on {self!r}; the attention "
                f"backends minivllm has on this platform: {', '.join(self.attention_backends)}. "
                "Choose one of them (e.g. -ac.backend=CPU_SDPA) or leave the backend unset."
            )

    def __repr__(self) -> str:
        cap = self.get_device_capability()
        return f"{type(self).__name__}({cap.as_version_str() if cap else ''})"
