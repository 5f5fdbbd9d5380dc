"""`KernelConfig`: kernel selection and warm-up."""

from __future__ import annotations

from dataclasses import field
from typing import TYPE_CHECKING

from minivllm.config.utils import config, get_hash_factors, hash_factors

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

NATIVE = "native"
VLLM_C = "vllm_c"
KNOWN_IMPLEMENTATIONS = (NATIVE, VLLM_C)
"""Names an op priority may hold: "native" (minivllm's own torch code) and "vllm_c"
(vLLM's CUDA kernels, which minivllm lacks: an op skips it and runs the next name; it
still heads the list for the fusion defaults, which is why CUDA prefers it without
Inductor, see `CudaPlatform.default_ir_op_priority`)."""


@config
class IrOpPriorityConfig:
    """Preferred implementations of each fusable op, best first."""

    rms_norm: list[str] = field(default_factory=list)
    """Implementations of RMSNorm to try, in order. `KernelConfig.set_platform_defaults`
    appends the platform's preference (``["native"]`` on CPU) to what is given here."""
    fused_add_rms_norm: list[str] = field(default_factory=list)
    """Implementations of residual-add + RMSNorm, in order (as ``rms_norm``)."""

    def fill_defaults(self, default: list[str]) -> None:
        """Append the ``default`` names each op's list does not hold yet (the user's
        names stay first)."""
        self.rms_norm = self.rms_norm + [n for n in default if n not in self.rms_norm]
        self.fused_add_rms_norm = self.fused_add_rms_norm + [
            n for n in default if n not in self.fused_add_rms_norm
        ]


@config
class KernelConfig:
    """Configuration for kernel selection and warm-up."""

    ir_op_priority: IrOpPriorityConfig = field(default_factory=IrOpPriorityConfig)
    """Implementation priority per op. minivllm implements "native" (PyTorch) only;
    "vllm_c" is accepted for the fusion defaults (see `KNOWN_IMPLEMENTATIONS`), any
    other name is refused."""
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
        """Append the platform's op priorities (after compilation mode and backend are
        known, before the fusion defaults that read them)."""
        from minivllm.platforms import current_platform

        self.ir_op_priority.fill_defaults(current_platform.default_ir_op_priority(vllm_config))

    def check_supported(self) -> None:
        """Only the native implementations exist (and vLLM's name for its CUDA ones)."""
        for op in ("rms_norm", "fused_add_rms_norm"):
            names = getattr(self.ir_op_priority, op)
            unknown = [n for n in names if n not in KNOWN_IMPLEMENTATIONS]
            if unknown:
                raise ValueError(
                    f"kernel_config.ir_op_priority.{op}={names}: minivllm only implements "
                    f"'{NATIVE}'; remove {unknown}"
                )

    def compute_hash(self) -> str:
        """Op priorities change the graph; warm-up and autotuning do not."""
        factors = get_hash_factors(self, {"enable_flashinfer_autotune", "enable_jit_warmup"})
        return hash_factors(factors)
