"""`AttentionConfig`: attention backend selection."""

from __future__ import annotations

from typing import Any, ClassVar

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


@config
class AttentionConfig:
    """Configuration for attention mechanisms."""

    backend: str | None = None
    """Attention backend name (upper case). None lets the platform choose:
    PyTorch SDPA over the paged KV cache on CPU, minivllm's kernel on CUDA.
    Names are checked by the attention backend selector."""
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
            self.backend = self.backend.strip().upper()
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
