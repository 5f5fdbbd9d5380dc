"""The old spellings of `CompilationConfig` fields, and their translation.

Older configs (and many user files) still say ``level``, ``use_inductor``,
``use_cudagraph`` and ``full_cuda_graph``.  They keep working: each one is
translated into today's field, with a `DeprecationWarning` and a logged warning,
and is then reset to ``None`` so that the translated config hashes and prints
exactly like one written with today's names.  Giving an old and a new spelling
that disagree is an error, since neither can be preferred silently.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from minivllm.config.compilation.modes import CompilationMode, CUDAGraphMode
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.compilation import CompilationConfig

logger = init_logger(__name__)

LEGACY_FIELDS = ("level", "use_inductor", "use_cudagraph", "full_cuda_graph")
"""Old field names that `CompilationConfig` still accepts."""

# The old CompilationLevel names; the numbers are the same as CompilationMode's.
_LEGACY_LEVEL_NAMES = {
    "NO_COMPILATION": CompilationMode.NONE,
    "DYNAMO_AS_IS": CompilationMode.STOCK_TORCH_COMPILE,
    "DYNAMO_ONCE": CompilationMode.DYNAMO_TRACE_ONCE,
    "PIECEWISE": CompilationMode.VLLM_COMPILE,
}


def parse_legacy_level(value: Any) -> Any:
    """Turn an old ``level`` (0-3, or an old or new level name) into a CompilationMode."""
    if value is None or isinstance(value, CompilationMode):
        return value
    if isinstance(value, str):
        name = value.strip().upper()
        if name in _LEGACY_LEVEL_NAMES:
            return _LEGACY_LEVEL_NAMES[name]
        if name in CompilationMode.__members__:
            return CompilationMode[name]
        if name.isdigit():
            value = int(name)
    if isinstance(value, int) and not isinstance(value, bool):
        if value in {m.value for m in CompilationMode}:
            return CompilationMode(value)
    raise ValueError(
        f"Invalid compilation level {value!r}: use 0-3 (or better, the field 'mode' with one "
        f"of {', '.join(CompilationMode.__members__)})."
    )


def _deprecated(old: str, new: str) -> None:
    message = f"CompilationConfig.{old} is deprecated; use {new} instead."
    warnings.warn(message, DeprecationWarning, stacklevel=4)
    logger.warning(message)


def migrate_legacy_fields(cfg: CompilationConfig) -> None:
    """Translate the old fields of ``cfg`` into today's fields (in place)."""
    if cfg.level is not None:
        _deprecated("level", "'mode' (same numbers: 0 NONE ... 3 VLLM_COMPILE)")
        level_mode = parse_legacy_level(cfg.level)
        if cfg.mode is not None and cfg.mode != level_mode:
            raise ValueError(
                f"level={int(level_mode)} and mode={cfg.mode.name} disagree; 'level' is the "
                "deprecated spelling of 'mode', so drop 'level' and keep only 'mode'."
            )
        cfg.mode = level_mode
        cfg.level = None

    if cfg.use_inductor is not None:
        implied = "inductor" if cfg.use_inductor else "eager"
        _deprecated("use_inductor", f"backend={implied!r}")
        if cfg.backend not in ("", implied):
            raise ValueError(
                f"use_inductor={cfg.use_inductor} means backend={implied!r}, but "
                f"backend={cfg.backend!r} was also given; drop the deprecated 'use_inductor'."
            )
        cfg.backend = implied
        cfg.use_inductor = None

    if cfg.use_cudagraph is not None:
        _deprecated("use_cudagraph", "cudagraph_mode (use_cudagraph=False is cudagraph_mode=NONE)")
        if not cfg.use_cudagraph:
            if cfg.cudagraph_mode is not None and cfg.cudagraph_mode != CUDAGraphMode.NONE:
                raise ValueError(
                    "use_cudagraph=False and cudagraph_mode="
                    f"{cfg.cudagraph_mode} are mutually exclusive; use_cudagraph is "
                    "deprecated, so keep only cudagraph_mode."
                )
            cfg.cudagraph_mode = CUDAGraphMode.NONE
        cfg.use_cudagraph = None

    if cfg.full_cuda_graph is not None:
        _deprecated(
            "full_cuda_graph", "cudagraph_mode (full_cuda_graph=True is cudagraph_mode=FULL)"
        )
        if cfg.full_cuda_graph:
            if cfg.cudagraph_mode is not None and not cfg.cudagraph_mode.has_full_cudagraphs():
                raise ValueError(
                    "full_cuda_graph=True and cudagraph_mode="
                    f"{cfg.cudagraph_mode} are mutually exclusive; full_cuda_graph is "
                    "deprecated, so keep only cudagraph_mode."
                )
            cfg.cudagraph_mode = CUDAGraphMode.FULL
        cfg.full_cuda_graph = None


__all__ = ["LEGACY_FIELDS", "migrate_legacy_fields", "parse_legacy_level"]
