"""The enums of the compilation configuration: how the model is compiled and captured.

`CompilationMode` picks the torch.compile pipeline; `CUDAGraphMode` picks which
batches replay a captured CUDA graph.  Both are re-exported by
`minivllm.config.compilation`.
"""

from __future__ import annotations

import enum
import functools
import logging
from typing import Any


class CompilationMode(enum.IntEnum):
    """Which torch.compile pipeline, if any, compiles the model."""

    NONE = 0
    """No torch.compile: the model runs eagerly, exactly as written."""
    STOCK_TORCH_COMPILE = 1
    """Plain ``torch.compile`` over the whole model."""
    DYNAMO_TRACE_ONCE = 2
    """One Dynamo trace with its guards dropped, so the model never recompiles; the model
    must not branch on dynamic shapes."""
    VLLM_COMPILE = 3
    """minivllm's own backend: the graph is split at the splitting ops, pieces are compiled
    (Inductor or eager), cached on disk, specialised for chosen sizes and run through the
    custom passes."""


class CUDAGraphMode(enum.Enum):
    """Which batches run as a captured CUDA graph.

    ``NONE``, ``PIECEWISE`` and ``FULL`` are also the concrete modes the runtime
    dispatcher hands out per batch.  The two tuple-valued members name one mode for
    uniform decode batches (first element) and one for mixed batches (second element).
    """

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    # Inside the class body the names above are still their raw values (0, 1, 2).
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def separate_routine(self) -> bool:
        """True for the members that treat decode and mixed batches differently."""
        return isinstance(self.value, tuple)

    def decode_mode(self) -> CUDAGraphMode:
        """The runtime mode of uniform decode batches."""
        return CUDAGraphMode(self.value[0]) if self.separate_routine() else self

    def mixed_mode(self) -> CUDAGraphMode:
        """The runtime mode of prefill and mixed batches."""
        return CUDAGraphMode(self.value[1]) if self.separate_routine() else self

    def has_mode(self, mode: CUDAGraphMode) -> bool:
        """Whether ``mode`` (a runtime mode) is used for some kind of batch."""
        if mode.separate_routine():
            raise ValueError(f"has_mode expects a runtime mode (NONE, PIECEWISE, FULL), got {mode}")
        if self.separate_routine():
            return mode.value in self.value
        return self == mode

    def requires_piecewise_compilation(self) -> bool:
        """Piecewise graphs need the model compiled in pieces (VLLM_COMPILE + splitting ops)."""
        return self.has_mode(CUDAGraphMode.PIECEWISE)

    def without_piecewise(self) -> CUDAGraphMode:
        """This mode with its piecewise part dropped (PIECEWISE -> NONE, F&P -> FULL_DECODE_ONLY)."""
        if self == CUDAGraphMode.PIECEWISE:
            return CUDAGraphMode.NONE
        if self == CUDAGraphMode.FULL_AND_PIECEWISE:
            return CUDAGraphMode.FULL_DECODE_ONLY
        return self

    def max_cudagraph_mode(self) -> CUDAGraphMode:
        """The strongest runtime mode in use (FULL > PIECEWISE > NONE)."""
        return CUDAGraphMode(max(self.value)) if self.separate_routine() else self

    def has_full_cudagraphs(self) -> bool:
        """Whether any batch replays a full graph."""
        return self.max_cudagraph_mode() == CUDAGraphMode.FULL

    def has_piecewise_cudagraphs(self) -> bool:
        """Whether any batch replays piecewise graphs."""
        return self.requires_piecewise_compilation()

    @classmethod
    def valid_runtime_modes(cls) -> frozenset[CUDAGraphMode]:
        """The modes the dispatcher may return for one batch."""
        return frozenset({cls.NONE, cls.PIECEWISE, cls.FULL})

    def is_valid_runtime_mode(self) -> bool:
        """Whether this member is one of `valid_runtime_modes`."""
        return self in CUDAGraphMode.valid_runtime_modes()

    def __str__(self) -> str:
        return self.name

    def __bool__(self) -> bool:
        # ``if cudagraph_mode:`` reads as "are graphs captured at all".
        return self != CUDAGraphMode.NONE


@functools.lru_cache(maxsize=1024)
def _log_once_cached(logger_name: str, level: int, msg: str, args: tuple[Any, ...]) -> None:
    logging.getLogger(logger_name).log(level, msg, *args)


def log_once(logger: logging.Logger, level: int, msg: str, *args: Any) -> None:
    """Log ``msg % args`` at ``level`` the first time this exact message is seen.

    Resolution code runs once per config, but configs are built many times in one process
    (tests, draft models); repeating the same downgrade notice adds nothing.
    """
    try:
        _log_once_cached(logger.name, level, msg, args)
    except TypeError:  # unhashable args: log every time rather than fail
        logger.log(level, msg, *args)


__all__ = ["CUDAGraphMode", "CompilationMode", "log_once"]
