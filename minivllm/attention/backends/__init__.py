"""Attention backends: how attention is computed over the paged KV cache."""

from __future__ import annotations

from typing import Any

from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend

_BACKENDS: dict[str, type[CpuSdpaBackend]] = {CpuSdpaBackend.name: CpuSdpaBackend}


def _cuda_default() -> Any | None:
    """The Triton paged backend on CUDA (importing triton only there), if it applies."""
    from minivllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    try:
        from minivllm.attention.backends.triton_paged import TritonPagedBackend, supports
    except ImportError:
        return None
    from minivllm.config.vllm_context import get_current_vllm_config_or_none

    cfg = get_current_vllm_config_or_none()
    block_size = getattr(getattr(cfg, "cache_config", None), "block_size", None) or 16
    return TritonPagedBackend() if supports(block_size) else None


def get_attn_backend(name: str | None = None) -> Any:
    """An instance of the backend called ``name`` (vLLM's names accepted).

    ``name`` None: the current config's ``attention_config.backend``; when that is
    unset too, the Triton paged backend on CUDA (CUDA graph safe), else the SDPA
    backend (plain torch, any device).
    """
    from minivllm.config.attention import canonical_backend
    from minivllm.config.vllm_context import get_current_vllm_config_or_none
    from minivllm.platforms import current_platform

    if name is None:
        attention_config = getattr(get_current_vllm_config_or_none(), "attention_config", None)
        name = getattr(attention_config, "backend", None)
    if name is None:
        backend = _cuda_default()
        return backend if backend is not None else CpuSdpaBackend()
    key = canonical_backend(name)
    if key not in current_platform.attention_backends:
        raise ValueError(
            f"attention backend {key} does not run on {current_platform!r}; available here: "
            f"{', '.join(current_platform.attention_backends)}"
        )
    if key == "TRITON_PAGED":
        from minivllm.attention.backends.triton_paged import TritonPagedBackend

        return TritonPagedBackend()
    return _BACKENDS[key]()
