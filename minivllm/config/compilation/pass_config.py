"""`PassConfig`: which custom graph passes (fusions) VLLM_COMPILE runs.

It is kept apart from `CompilationConfig` so passes see only their own switches.
Most switches start as ``None`` ("unset"): `VllmConfig` fills them from the
optimization level; a switch the current platform cannot honour is turned off here,
with a warning, whatever set it.
"""

from __future__ import annotations

import dataclasses
import logging

from pydantic import Field

from minivllm.config.compilation.modes import log_once
from minivllm.config.utils import config, get_hash_factors, hash_factors
from minivllm.logger import init_logger
from minivllm.platforms import current_platform

logger = init_logger(__name__)

MiB = 1024 * 1024

FI_ALLREDUCE_FUSION_SUPPORTED_WORLD_SIZES = (2, 4, 8, 16)
"""World sizes the fused all-reduce kernel supports."""

FI_ALLREDUCE_FUSION_MAX_SIZE_MB: dict[int, dict[int, float]] = {
    90: {2: 64, 4: 2, 8: 1},
    100: {2: 64, 4: 32, 8: 1},
}
"""Default all-reduce fusion thresholds in MiB, by compute capability then world size."""


@config
class PassConfig:
    """Switches and thresholds of the custom graph passes run under VLLM_COMPILE.

    Build it through `CompilationConfig` inside a `VllmConfig`: the unset (``None``)
    switches are resolved there.
    """

    fuse_norm_quant: bool | None = None
    """Fuse RMSNorm with the following (fp8) quantization."""
    fuse_act_quant: bool | None = None
    """Fuse SiluAndMul with the following (fp8) quantization."""
    fuse_attn_quant: bool | None = None
    """Fuse attention (and MLA attention) with the quantization of its output."""
    eliminate_noops: bool = Field(default=True)
    """Remove no-op reshapes/slices first, which the fusion patterns rely on."""
    fuse_allreduce_rms: bool | None = None
    """Fuse tensor-parallel all-reduce with the RMSNorm after it (flashinfer kernel)."""
    enable_qk_norm_rope_fusion: bool | None = None
    """Fuse the per-head Q/K RMSNorm with RoPE (CUDA, ROCm or XPU only)."""
    fuse_rope_kvcache_cat_mla: bool | None = None
    """Fuse RoPE with the MLA KV-cache write (CUDA or ROCm only)."""
    fuse_act_padding: bool | None = None
    """Fuse RMSNorm with the padding after it (ROCm only)."""
    fuse_mla_dual_rms_norm: bool | None = None
    """Fuse the paired q/kv RMSNorms of MLA attention (ROCm with AITER only)."""
    fuse_rope_kvcache: bool | None = None
    """Fuse Q/K RoPE with the KV-cache write (ROCm only)."""
    fuse_qk_norm_rope_kvcache: bool | None = Field(default=None)
    """Fuse Q/K RMSNorm, RoPE (or MRoPE) and the KV-cache write in one kernel (ROCm with
    AITER only). Where a layer supports it, it replaces both enable_qk_norm_rope_fusion
    and fuse_rope_kvcache."""
    rope_kvcache_fusion_max_token_num: int = 256
    """Largest batch (in tokens) that takes the fused RoPE+KV-cache kernels; larger
    batches, i.e. prefills, use the unfused kernels. Also bounds the QK-norm variant."""
    fi_allreduce_fusion_max_size_mb: float | None = None
    """Largest all-reduce (MiB) that uses the fused all-reduce kernel. None: the default
    for the device's compute capability and the world size
    (FI_ALLREDUCE_FUSION_MAX_SIZE_MB)."""

    def __post_init__(self) -> None:
        if not self.eliminate_noops:
            self._warn_fusions_without_noop_elimination()
        self._disable_fusions_unsupported_here()

    def _warn_fusions_without_noop_elimination(self) -> None:
        # Fusion patterns are matched after no-ops are removed; without that they may miss.
        fusions = {
            "fuse_norm_quant": "RMSNorm + quant",
            "fuse_act_quant": "SiluMul + quant",
            "fuse_attn_quant": "attention + quant",
            "fuse_allreduce_rms": "all-reduce + RMSNorm",
            "fuse_act_padding": "RMSNorm + padding",
        }
        for name, what in fusions.items():
            if getattr(self, name):
                log_once(
                    logger,
                    logging.WARNING,
                    "%s fusion is on but eliminate_noops is off, so the fusion may not "
                    "match; set eliminate_noops=True.",
                    what,
                )

    def _disable_fusions_unsupported_here(self) -> None:
        platform = current_platform
        checks = (
            (
                "enable_qk_norm_rope_fusion",
                platform.is_cuda_alike() or platform.is_xpu(),
                "QK-norm + RoPE fusion needs CUDA, ROCm or XPU",
            ),
            ("fuse_act_padding", platform.is_rocm(), "RMSNorm + padding fusion needs ROCm"),
            ("fuse_mla_dual_rms_norm", platform.is_rocm(), "MLA dual RMSNorm fusion needs ROCm"),
            ("fuse_rope_kvcache", platform.is_rocm(), "RoPE + KV-cache fusion needs ROCm"),
            (
                "fuse_qk_norm_rope_kvcache",
                platform.is_rocm(),
                "QK-norm + RoPE + KV-cache fusion needs ROCm with AITER",
            ),
            (
                "fuse_rope_kvcache_cat_mla",
                platform.is_cuda_alike(),
                "MLA RoPE + KV-cache fusion needs CUDA or ROCm",
            ),
        )
        for name, supported, why in checks:
            if getattr(self, name) and not supported:
                log_once(
                    logger,
                    logging.WARNING,
                    "%s; the current platform is %r, so %s is turned off.",
                    why,
                    platform,
                    name,
                )
                setattr(self, name, False)

    @staticmethod
    def default_fi_allreduce_fusion_max_size_mb() -> dict[int, float]:
        """Default thresholds (MiB by world size) for the current device; empty off CUDA."""
        if not current_platform.is_cuda():
            return {}
        capability = current_platform.get_device_capability()
        if capability is None:
            return {}
        return FI_ALLREDUCE_FUSION_MAX_SIZE_MB.get(capability.to_int(), {})

    def flashinfer_max_size(self, world_size: int) -> int | None:
        """Largest all-reduce in bytes to fuse at ``world_size``; None when not fusable."""
        if world_size not in FI_ALLREDUCE_FUSION_SUPPORTED_WORLD_SIZES:
            return None
        max_size_mb = self.fi_allreduce_fusion_max_size_mb
        if max_size_mb is None:
            max_size_mb = self.default_fi_allreduce_fusion_max_size_mb().get(world_size)
        return int(max_size_mb * MiB) if max_size_mb is not None else None

    def enabled_fusions(self) -> list[str]:
        """Names (without the ``fuse_``/``enable_`` prefix) of the switches that are on."""
        # Both prefixes are one word, so the name after the first "_" is the fusion's.
        return [name.split("_", 1)[1] for name in FUSION_SWITCHES if getattr(self, name)]

    def log_enabled_passes(self) -> list[str]:
        """Log the fusions that are on (called once the config is fully resolved)."""
        names = self.enabled_fusions()
        if names:
            log_once(logger, logging.INFO, "Enabled custom fusions: %s", ", ".join(names))
        return names

    def compute_hash(self) -> str:
        """Every field can change the compiled graph, so every field is hashed."""
        return hash_factors(get_hash_factors(self, set()))


FUSION_SWITCHES: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(PassConfig) if f.name.startswith(("fuse_", "enable_"))
)
"""The fusion switches of `PassConfig` (its ``fuse_*`` / ``enable_*`` fields), in order."""

__all__ = [
    "FI_ALLREDUCE_FUSION_MAX_SIZE_MB",
    "FI_ALLREDUCE_FUSION_SUPPORTED_WORLD_SIZES",
    "FUSION_SWITCHES",
    "PassConfig",
]
