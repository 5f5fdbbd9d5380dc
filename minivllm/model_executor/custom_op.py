"""Layers with two interchangeable implementations, chosen once per instance.

A `CustomOp` subclass provides ``forward_native`` (plain torch that Inductor can
see through and fuse) and ``forward_optimized`` (a hand-tuned eager path: a fused
torch kernel, a precomputed cache, an in-place op).  Which one an instance runs is
decided when it is constructed, from ``CompilationConfig.custom_ops`` of the
current config (``"+name"`` / ``"-name"`` / ``"all"`` / ``"none"``), and the choice
is counted in ``enabled_custom_ops`` / ``disabled_custom_ops`` so
``custom_op_log_check`` can warn about flags naming ops the model never built.
With no config current, the optimized path is used and nothing is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from minivllm.config.vllm import get_current_vllm_config_or_none
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.compilation import CompilationConfig

logger = init_logger(__name__)

op_registry: dict[str, type[CustomOp]] = {}
"""Every CustomOp class by its name (filled at import by `CustomOp.register`)."""


def current_compilation_config() -> CompilationConfig | None:
    """The compilation config of the current `VllmConfig`, or None when none is set."""
    cfg = get_current_vllm_config_or_none()
    return None if cfg is None else cfg.compilation_config


def custom_op_enabled(compilation_config: CompilationConfig, name: str) -> bool:
    """Whether op ``name`` should take its optimized path under ``compilation_config``."""
    ops = compilation_config.custom_ops
    if ops.count("all") + ops.count("none") == 1:
        return compilation_config.is_custom_op_enabled(name)
    # An unresolved list (no base mode yet, e.g. a bare CompilationConfig) still
    # honours explicit flags; anything not disabled keeps the optimized default.
    if f"-{name}" in ops:
        return False
    return True


class CustomOp(nn.Module):
    """Base class of layers with a native and an optimized implementation."""

    name: str = ""
    """Registry name, the word used in ``custom_ops`` flags (``+rms_norm``)."""

    def __init__(self) -> None:
        super().__init__()
        compilation_config = current_compilation_config()
        if compilation_config is None:
            self.use_optimized = True
        else:
            self.use_optimized = custom_op_enabled(compilation_config, self.name)
            counter = (
                compilation_config.enabled_custom_ops
                if self.use_optimized
                else compilation_config.disabled_custom_ops
            )
            counter[self.name] += 1
        self._forward_method: Callable[..., Any] = (
            self.forward_optimized if self.use_optimized else self.forward_native
        )

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._forward_method(*args, **kwargs)

    def forward_native(self, *args: Any, **kwargs: Any) -> Any:
        """Plain torch implementation (what a compiler should trace)."""
        raise NotImplementedError

    def forward_optimized(self, *args: Any, **kwargs: Any) -> Any:
        """Faster eager implementation; defaults to the native one."""
        return self.forward_native(*args, **kwargs)

    @classmethod
    def register(cls, name: str) -> Callable[[type[CustomOp]], type[CustomOp]]:
        """Class decorator that names a CustomOp and adds it to `op_registry`."""

        def decorator(op_cls: type[CustomOp]) -> type[CustomOp]:
            assert name not in op_registry, f"duplicate custom op {name}"
            op_cls.name = name
            op_registry[name] = op_cls
            return op_cls

        return decorator

    def extra_repr(self) -> str:
        return f"path={'optimized' if self.use_optimized else 'native'}"
