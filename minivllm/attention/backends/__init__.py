"""Attention backends: how attention is computed over the paged KV cache."""

from __future__ import annotations

from typing import Any

from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend

_BACKENDS: dict[str, type[CpuSdpaBackend]] = {CpuSdpaBackend.name: CpuSdpaBackend}


def get_attn_backend(name: str | None = None) -> Any:
    """An instance of the backend called ``name`` (vLLM's names accepted).

    ``name`` None: the current config's ``attention_config.backend``, which
    `VllmConfig` resolution always sets; with no config at all, the platform's
    choice (`Platform.choose_attention_backend`: the Triton paged backend on CUDA
    when triton is installed, else the SDPA backend).
    """
    from minivllm.config.attention import canonical_backend
    from minivllm.config.vllm import get_current_vllm_config_or_none
    from minivllm.platforms import current_platform

    cfg = get_current_vllm_config_or_none()
    if name is None and cfg is not None:
        name = cfg.attention_config.backend
    if name is None:
        device_type = cfg.device_config.device_type if cfg is not None else None
        name = current_platform.choose_attention_backend(device_type).name
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
