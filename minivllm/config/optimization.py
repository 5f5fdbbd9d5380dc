"""Optimization levels (-O0 .. -O3) and the fusion predicates their defaults use.

A level is a bundle of defaults for fields the user left unset (``None``):
`VllmConfig._apply_optimization_level_defaults` walks `OPTIMIZATION_LEVEL_TO_CONFIG`
and fills only those fields.  A value in the table is either a constant or a
predicate ``(VllmConfig) -> value`` that is evaluated on the config being resolved,
so a fusion is switched on only where it can pay off (the ``enable_*`` functions).
"""

from __future__ import annotations

import enum
import importlib.util
from typing import TYPE_CHECKING, Any, Literal

from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.config.quantization import WEIGHT_ONLY_METHODS
from minivllm.platforms import current_platform

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


class OptimizationLevel(enum.IntEnum):
    """How much start-up time to spend for run-time speed."""

    O0 = 0
    """No optimization: no compilation, no CUDA graphs, no fusions; starts fastest."""
    O1 = 1
    """Quick optimizations: Dynamo + Inductor compilation and piecewise CUDA graphs."""
    O2 = 2
    """Full optimizations: O1 plus full-and-piecewise CUDA graphs (the default)."""
    O3 = 3
    """Currently identical to O2."""

    # vLLM's parser leaves ``-O1`` as the string "1" (its flag has no enum parser), so
    # code written for it compares levels with strings; a level equals its digit and
    # its name ("1", "O1") as well as its number.
    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return other.strip().upper() in (str(self.value), self.name)
        return int.__eq__(self, other)  # type: ignore[no-any-return]

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = int.__hash__


PerformanceMode = Literal["balanced", "interactivity", "throughput"]
"""Runtime trade-off: 'interactivity' captures every batch size up to 32 so small
batches are not padded; 'throughput' favours large batches; 'balanced' is the default."""


# -- predicates -------------------------------------------------------------------
# minivllm has no ROCm platform, so the AITER kernels some fusions need never exist.


def _aiter_enabled() -> bool:
    """Whether ROCm AITER kernels are available: never, minivllm runs on CPU and CUDA."""
    return False


def _has_flashinfer() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def _ir_priority_head(cfg: VllmConfig, op: Literal["rms_norm", "fused_add_rms_norm"]) -> str | None:
    """The preferred implementation of IR op ``op`` per the kernel config, if it says."""
    impls: list[str] = getattr(cfg.kernel_config.ir_op_priority, op)  # a field named by op
    return impls[0] if impls else None


def enable_norm_fusion(cfg: VllmConfig) -> bool:
    """On when the RMSNorm or fp8-quant custom op runs (or RMSNorm is not the native IR
    implementation); otherwise Inductor fuses the plain torch ops by itself."""
    compilation_config = cfg.compilation_config
    head = _ir_priority_head(cfg, "rms_norm")
    return (
        compilation_config.is_custom_op_enabled("rms_norm")
        or compilation_config.is_custom_op_enabled("quant_fp8")
        or (head is not None and head != "native")
    )


def enable_act_fusion(cfg: VllmConfig) -> bool:
    """On when the SiLU-and-mul or fp8-quant custom op runs, or for NVFP4 models whose
    quant op is always custom (Inductor cannot fuse through it)."""
    compilation_config = cfg.compilation_config
    model = cfg.model_config
    nvfp4 = model is not None and model.is_nvfp4_quantized()
    return (
        compilation_config.is_custom_op_enabled("silu_and_mul")
        or compilation_config.is_custom_op_enabled("quant_fp8")
        or nvfp4
    )


def enable_allreduce_rms_fusion(cfg: VllmConfig) -> bool:
    """On for tensor parallelism on Hopper (9.0) or data-center Blackwell (10.x) when
    flashinfer, which provides the fused kernel, is installed."""
    return (
        cfg.parallel_config.tensor_parallel_size > 1
        and current_platform.is_cuda()
        and (
            current_platform.is_device_capability_family(100)
            or current_platform.is_device_capability((9, 0))
        )
        and _has_flashinfer()
    )


def enable_mla_dual_rms_norm_fusion(cfg: VllmConfig) -> bool:
    """On with ROCm AITER only."""
    return _aiter_enabled()


def enable_norm_pad_fusion(cfg: VllmConfig) -> bool:
    """On with the AITER fused-add RMSNorm and hidden size 2880 (gpt-oss)."""
    model = cfg.model_config
    return (
        _ir_priority_head(cfg, "fused_add_rms_norm") == "aiter"
        and model is not None
        and model.get_hidden_size() == 2880
    )


def enable_qk_norm_rope_kvcache(cfg: VllmConfig) -> bool:
    """On with ROCm AITER when the rotary-embedding custom op runs."""
    if not _aiter_enabled():
        return False
    return cfg.compilation_config.is_custom_op_enabled("rotary_embedding")


def enable_rope_kvcache_fusion(cfg: VllmConfig) -> bool:
    """On with ROCm AITER when the rotary-embedding custom op runs and the KV-cache
    update stays inside the compiled graph (Inductor partitioning, or not split out)."""
    compilation_config = cfg.compilation_config
    return (
        _aiter_enabled()
        and compilation_config.is_custom_op_enabled("rotary_embedding")
        and (
            compilation_config.use_inductor_graph_partition
            or not compilation_config.splitting_ops_contain_kv_cache_update()
        )
    )


def enable_rope_kvcache_mla_fusion(cfg: VllmConfig) -> bool:
    """On when the MLA KV-cache update stays inside the compiled graph."""
    compilation_config = cfg.compilation_config
    return (
        bool(compilation_config.use_inductor_graph_partition)
        or not compilation_config.splitting_ops_contain_kv_cache_update()
    )


def enable_attn_quant_fusion(cfg: VllmConfig) -> bool:
    """On for models whose attention output is quantized (fp8/fp4 checkpoints).

    minivllm's methods (GGUF, int8_per_channel) are weight-only: their kernels take
    activations in the model dtype and attention writes them so, there is no output
    quant to fuse, and turning the pass on would only empty ``splitting_ops`` (no
    piecewise graphs).
    """
    model = cfg.model_config
    quantization = None if model is None else model.quantization
    return quantization is not None and quantization not in WEIGHT_ONLY_METHODS


# -- the per-level tables ---------------------------------------------------------

_O0: dict[str, Any] = {
    "compilation_config": {
        "cudagraph_mode": CUDAGraphMode.NONE,
        "use_inductor_graph_partition": False,
        "pass_config": {
            "fuse_norm_quant": False,
            "fuse_act_quant": False,
            "fuse_allreduce_rms": False,
            "fuse_attn_quant": False,
            "fuse_act_padding": False,
            "fuse_mla_dual_rms_norm": False,
            "fuse_rope_kvcache": False,
            "fuse_qk_norm_rope_kvcache": False,
            "enable_qk_norm_rope_fusion": False,
            "fuse_rope_kvcache_cat_mla": False,
        },
    },
    "kernel_config": {"enable_flashinfer_autotune": False},
}

_O1: dict[str, Any] = {
    "compilation_config": {
        "cudagraph_mode": CUDAGraphMode.PIECEWISE,
        "use_inductor_graph_partition": False,
        "pass_config": {
            "fuse_norm_quant": enable_norm_fusion,
            "fuse_act_quant": enable_act_fusion,
            "fuse_allreduce_rms": False,
            "fuse_attn_quant": False,
            "fuse_act_padding": enable_norm_pad_fusion,
            "fuse_mla_dual_rms_norm": enable_mla_dual_rms_norm_fusion,
            "fuse_rope_kvcache": False,
            "fuse_qk_norm_rope_kvcache": False,
            "enable_qk_norm_rope_fusion": False,
            "fuse_rope_kvcache_cat_mla": False,
        },
    },
    "kernel_config": {"enable_flashinfer_autotune": True},
}

_O2: dict[str, Any] = {
    "compilation_config": {
        "cudagraph_mode": CUDAGraphMode.FULL_AND_PIECEWISE,
        "use_inductor_graph_partition": False,
        "pass_config": {
            "fuse_norm_quant": enable_norm_fusion,
            "fuse_act_quant": enable_act_fusion,
            "fuse_allreduce_rms": enable_allreduce_rms_fusion,
            "fuse_attn_quant": enable_attn_quant_fusion,
            "fuse_act_padding": enable_norm_pad_fusion,
            "fuse_mla_dual_rms_norm": enable_mla_dual_rms_norm_fusion,
            "fuse_rope_kvcache": enable_rope_kvcache_fusion,
            "fuse_qk_norm_rope_kvcache": enable_qk_norm_rope_kvcache,
            "enable_qk_norm_rope_fusion": False,
            "fuse_rope_kvcache_cat_mla": enable_rope_kvcache_mla_fusion,
        },
    },
    "kernel_config": {"enable_flashinfer_autotune": True},
}

OPTIMIZATION_LEVEL_TO_CONFIG: dict[OptimizationLevel, dict[str, Any]] = {
    OptimizationLevel.O0: _O0,
    OptimizationLevel.O1: _O1,
    OptimizationLevel.O2: _O2,
    # O3 has no extra optimizations yet.
    OptimizationLevel.O3: _O2,
}
"""Per-level defaults, nested like the config tree; values are constants or predicates."""


def flatten_level_defaults(defaults: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"compilation_config.pass_config.fuse_norm_quant": value_or_predicate, ...}``."""
    out: dict[str, Any] = {}
    for key, value in defaults.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            out.update(flatten_level_defaults(value, path))
        else:
            out[path] = value
    return out


__all__ = [
    "OPTIMIZATION_LEVEL_TO_CONFIG",
    "OptimizationLevel",
    "PerformanceMode",
    "enable_act_fusion",
    "enable_allreduce_rms_fusion",
    "enable_attn_quant_fusion",
    "enable_mla_dual_rms_norm_fusion",
    "enable_norm_fusion",
    "enable_norm_pad_fusion",
    "enable_qk_norm_rope_kvcache",
    "enable_rope_kvcache_fusion",
    "enable_rope_kvcache_mla_fusion",
    "flatten_level_defaults",
]
