"""Attention backends: how attention is computed over the paged KV cache."""

from __future__ import annotations

from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend

_BACKENDS: dict[str, type[CpuSdpaBackend]] = {CpuSdpaBackend.name: CpuSdpaBackend}


def get_attn_backend(name: str | None = None) -> CpuSdpaBackend:
    """An instance of the backend called ``name`` (default: the SDPA backend).

    The SDPA backend is plain torch, so it also serves CUDA until a dedicated
    kernel backend is added here.
    """
    key = name or CpuSdpaBackend.name
    if key not in _BACKENDS:
        raise ValueError(
            f"unknown attention backend {key!r}; available: {', '.join(sorted(_BACKENDS))}"
        )
    return _BACKENDS[key]()
