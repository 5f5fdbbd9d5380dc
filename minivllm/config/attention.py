"""`AttentionConfig`: attention backend selection."""

from __future__ import annotations

from typing import Any, ClassVar

from minivllm.config.attention_support import AttentionCGSupport
from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors


@config
class HiSparseConfig(UnsupportedFeature):
    """Host-resident sparse KV for DSA models (vLLM's HiSparse). Not supported."""

    FEATURE: ClassVar[str] = "HiSparse (attention_config.hisparse_config)"
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = True

    device_buffer_ratio: float = 0.2
    """Fraction of the sparse KV kept on the device."""


# vLLM knobs of FlashAttention / FlashInfer / TRT-LLM kernels minivllm does not ship,
# with their defaults.
_KERNEL_KNOBS: dict[str, Any] = {
    "flash_attn_version": None,
    "use_prefill_decode_attention": False,
    "flash_attn_max_num_splits_for_cuda_graph": 32,
    "use_cudnn_prefill": False,
    "use_trtllm_ragged_deepseek_prefill": False,
    "use_trtllm_attention": None,
    "disable_flashinfer_prefill": False,
    "disable_flashinfer_q_quantization": False,
}


ATTENTION_BACKENDS: dict[str, str] = {
    "CPU_SDPA": "PyTorch SDPA over the paged KV cache, any device",
    "TRITON_PAGED": "Triton paged-attention kernels, CUDA only, CUDA-graph safe",
}
"""minivllm's attention backends (names as `AttentionConfig.backend` takes them)."""

ATTENTION_CG_SUPPORT: dict[str, AttentionCGSupport] = {
    "CPU_SDPA": AttentionCGSupport.NEVER,
    "TRITON_PAGED": AttentionCGSupport.ALWAYS,
}
"""How far each backend can be captured in full CUDA graphs. SDPA plans each step on
the host (Python lists of requests), so it only runs between piecewise graphs; the
Triton kernels read everything from device tensors, so any batch can be captured.
`VllmConfig` resolution downgrades ``cudagraph_mode`` to what the backend allows."""

BACKEND_ALIASES: dict[str, str] = {
    "CPU_ATTN": "CPU_SDPA",
    "TORCH_SDPA": "CPU_SDPA",
    "TRITON_ATTN": "TRITON_PAGED",
}
"""vLLM backend names with a minivllm counterpart (vLLM's CPU backend and its Triton
paged-attention backend); other vLLM names (FLASH_ATTN, FLASHINFER, ...) are refused."""


def canonical_backend(name: str) -> str:
    """minivllm's name of attention backend ``name`` (any case, vLLM names accepted);
    ValueError naming the backends there are for anything else."""
    key = name.strip().upper()
    key = BACKEND_ALIASES.get(key, key)
    if key not in ATTENTION_BACKENDS:
        aliases = {v: [k for k, t in BACKEND_ALIASES.items() if t == v] for v in ATTENTION_BACKENDS}
        known = "; ".join(
            f"{n} ({what}; vLLM: {', '.join(aliases[n])})" for n, what in ATTENTION_BACKENDS.items()
        )
        raise ValueError(
            f"attention backend {name!r} is not available in minivllm; its backends are: "
            f"{known}. Choose one of them or leave the backend unset."
        )
    return key


@config
class AttentionConfig:
    """Configuration for attention mechanisms."""

    backend: str | None = None
    """Attention backend: "CPU_SDPA" (PyTorch SDPA over the paged KV cache, any device)
    or "TRITON_PAGED" (Triton kernels, CUDA only); vLLM's names CPU_ATTN / TORCH_SDPA and
    TRITON_ATTN mean these, other vLLM backends are refused. None lets the platform
    choose (TRITON_PAGED on a CUDA device when triton is installed, else CPU_SDPA);
    `VllmConfig` resolution records its choice here, so a resolved config names the
    backend that runs."""
    flash_attn_version: int | None = None
    """FlashAttention version to force. Unsupported (no FlashAttention)."""
    use_prefill_decode_attention: bool = False
    """Split prefill and decode attention kernels. Unsupported."""
    flash_attn_max_num_splits_for_cuda_graph: int = 32
    """FlashAttention split-KV limit under CUDA graphs. Unsupported to change."""
    use_cudnn_prefill: bool = False
    """cuDNN prefill kernels. Unsupported."""
    use_trtllm_ragged_deepseek_prefill: bool = False
    """TRT-LLM ragged DeepSeek prefill. Unsupported."""
    use_trtllm_attention: bool | None = None
    """TRT-LLM attention kernels. Unsupported."""
    disable_flashinfer_prefill: bool = False
    """FlashInfer knob. Unsupported."""
    disable_flashinfer_q_quantization: bool = False
    """FlashInfer knob. Unsupported."""
    hisparse_config: HiSparseConfig | None = None
    """HiSparse settings. Unsupported: must be None."""

    def __post_init__(self) -> None:
        if self.backend is not None:
            self.backend = canonical_backend(self.backend)
        self.check_supported()

    def check_supported(self) -> None:
        """Raise for FlashAttention/FlashInfer/TRT-LLM knobs and HiSparse."""
        changed = [
            f"{k}={getattr(self, k)!r}" for k, v in _KERNEL_KNOBS.items() if getattr(self, k) != v
        ]
        if self.hisparse_config is not None:
            changed.append("hisparse_config (HiSparse)")
        if changed:
            raise ValueError(
                "attention settings not supported by minivllm (its attention backends are "
                f"PyTorch SDPA and its own kernel): {', '.join(changed)}. Leave them unset."
            )

    def compute_hash(self) -> str:
        """The backend shapes the attention ops in the graph: every field counts."""
        return hash_factors(get_hash_factors(self, set()))
