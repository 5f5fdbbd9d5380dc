"""Environment variables that minivllm reads.

They are read when asked for (not cached at import) so tests can set them
with ``monkeypatch.setenv``.
"""

from __future__ import annotations

import os
from pathlib import Path


def _flag(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def torch_compile_disable() -> bool:
    """``TORCH_COMPILE_DISABLE=1`` turns every torch.compile into eager (as in PyTorch)."""
    return _flag("TORCH_COMPILE_DISABLE")


def cache_root() -> Path:
    """Root of minivllm's on-disk caches (``MINIVLLM_CACHE_ROOT``, default ~/.cache/minivllm)."""
    raw = os.environ.get("MINIVLLM_CACHE_ROOT")
    if raw:
        return Path(raw).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "minivllm"


def log_level() -> str:
    """``MINIVLLM_LOGGING_LEVEL`` (default INFO)."""
    return os.environ.get("MINIVLLM_LOGGING_LEVEL", "INFO").upper()


def compile_cache_save_format() -> str:
    """``MINIVLLM_COMPILE_CACHE_SAVE_FORMAT``: ``binary`` (default) or ``unpacked``."""
    return os.environ.get("MINIVLLM_COMPILE_CACHE_SAVE_FORMAT", "binary").strip().lower()


def use_aot_compile() -> bool:
    """``MINIVLLM_USE_AOT_COMPILE`` (default on): save VLLM_COMPILE's Dynamo trace with
    the compile cache and load it on later starts instead of tracing again."""
    return _flag("MINIVLLM_USE_AOT_COMPILE", default=True)


def cpu_fused_layers() -> bool:
    """``MINIVLLM_CPU_FUSED_LAYERS`` (default on): the CPU decode graph runs each
    eligible decoder layer as one ``minivllm_cpu::decoder_layer`` call (all of
    them as one ``decoder_stack`` call where every layer is eligible:
    `minivllm.model_executor.layers.fused_decoder_layer`); 0 traces the layers'
    own ops instead (same results up to float rounding)."""
    return _flag("MINIVLLM_CPU_FUSED_LAYERS", default=True)
