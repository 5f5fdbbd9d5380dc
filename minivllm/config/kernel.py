"""`KernelConfig`: kernel selection and warm-up."""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING

from minivllm.config.utils import config, get_hash_factors, hash_factors

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

NATIVE = "native"


@config
class IrOpPriorityConfig:
    """Preferred implementations of each fusable op, best first."""

    rms_norm: list[str] = field(default_factory=lambda: [NATIVE])
    """Implementations of RMSNorm to try, in order. An empty list is filled
    with ``["native"]`` by `KernelConfig.set_platform_defaults`."""
    fused_add_rms_norm: list[str] = field(default_factory=lambda: [NATIVE])
    """Implementations of residual-add + RMSNorm, in order (as ``rms_norm``)."""

    def fill_defaults(self, default: list[str]) -> None:
        """Give every op left empty the ``default`` priority list."""
        if not self.rms_norm:
            self.rms_norm = list(default)
        if not self.fused_add_rms_norm:
            self.fused_add_rms_norm = list(default)


@config
class KernelConfig:
    """Configuration for kernel selection and warm-up."""

    ir_op_priority: IrOpPriorityConfig = field(default_factory=IrOpPriorityConfig)
    """Implementation priority per op. minivllm implements "native" (PyTorch)
    only; any other name is refused."""
    enable_flashinfer_autotune: bool | None = None
    """Autotune FlashInfer kernels at start-up. None is filled in by the
    optimization level (False at O0, True above). minivllm has no FlashInfer,
    so the value has no effect."""
    enable_jit_warmup: bool = True
    """Run JIT-compiled kernels once at start-up so the first request does not
    pay for compilation. Turned off by ``enforce_eager``."""

    def __post_init__(self) -> None:
        self.check_supported()

    def set_platform_defaults(self, vllm_config: VllmConfig) -> None:
        """Fill op priorities left empty (after compilation mode and backend are known)."""
        self.ir_op_priority.fill_defaults([NATIVE])

    def check_supported(self) -> None:
        """Only the native implementations exist."""
        for op in ("rms_norm", "fused_add_rms_norm"):
            names = getattr(self.ir_op_priority, op)
            unknown = [n for n in names if n != NATIVE]
            if unknown:
                raise ValueError(
                    f"kernel_config.ir_op_priority.{op}={names}: minivllm only implements "
                    f"'{NATIVE}'; remove {unknown}"
                )

    def compute_hash(self) -> str:
        """Op priorities change the graph; warm-up and autotuning do not."""
        factors = get_hash_factors(self, {"enable_flashinfer_autotune", "enable_jit_warmup"})
        return hash_factors(factors)
