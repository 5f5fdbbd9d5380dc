"""The post-init steps of `CompilationConfig`: defaults it fills and rules it enforces.

Kept apart from `compilation.py` so the config class reads as its list of fields;
`CompilationConfig.__post_init__` runs these in order.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
from typing import TYPE_CHECKING, Any

from minivllm import envs
from minivllm.platforms import current_platform
from minivllm.platforms.cpu import usable_cpu_cores

if TYPE_CHECKING:
    from minivllm.config.compilation import CompilationConfig

COMPILE_SIZES_FROM_CAPTURE = "cudagraph_capture_sizes"
"""The one string `compile_sizes` accepts: "compile every CUDA graph capture size"."""

BASE_CUSTOM_OPS = frozenset({"all", "none"})
"""The base modes of `custom_ops`."""

PIECEWISE_BACKENDS = ("", "eager", "inductor")
"""Backends VLLM_COMPILE can compile the pieces with ("" becomes the platform's)."""

SERIAL_INDUCTOR_MAX_CORES = 4
"""On a CPU with at most this many usable cores, Inductor's generated loops run on
one thread (``cpp.threads=1``) unless the user sets ``cpp.threads``: at decode sizes
(a few rows of a few hundred values) forking and joining the OpenMP team costs more
than the loop, 30-odd kernels per step; the GEMMs and attention are ATen calls and
keep torch's threads."""

SAVE_FORMATS = ("binary", "unpacked")


def torch_at_least(version: str) -> bool:
    """Whether the installed torch is at least ``version`` (read without importing torch,
    which takes seconds)."""
    from packaging.version import Version

    try:
        return Version(importlib.metadata.version("torch")) >= Version(version)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - torch is a dependency
        return False


def resolve_obj_by_qualname(qualname: str) -> Any:
    """The object named by a dotted path such as ``"package.module.function"``."""
    module_name, _, attr = qualname.rpartition(".")
    if not module_name:
        raise ValueError(f"{qualname!r} is not a qualified name: use 'package.module.name'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot resolve {qualname!r}: {exc}") from exc


def check_compile_cache_save_format(cfg: CompilationConfig) -> None:
    """The default comes from the environment, which the field validator never sees."""
    if cfg.compile_cache_save_format not in SAVE_FORMATS:
        raise ValueError(
            "MINIVLLM_COMPILE_CACHE_SAVE_FORMAT must be 'binary' or 'unpacked', got "
            f"{cfg.compile_cache_save_format!r}"
        )


def _inductor_deterministic_default() -> bool:
    # Inductor's own default, without importing torch._inductor just to read it.
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        return bool(getattr(inductor_config, "deterministic", False))
    return envs.inductor_deterministic()


def default_inductor_options(cfg: CompilationConfig) -> None:
    """Fill the Inductor options minivllm relies on, unless the user set them."""
    options = cfg.inductor_compile_config
    # Custom passes match auto-functionalized (v1) ops, so keep Inductor on v1.
    options.setdefault("enable_auto_functionalized_v2", False)
    if current_platform.is_cpu() and usable_cpu_cores() <= SERIAL_INDUCTOR_MAX_CORES:
        options.setdefault("cpp.threads", 1)
    if not torch_at_least("2.12.0.dev"):
        # Runtime shape asserts cost ~ms per step before torch 2.12 made them
        # assert-once; keep them only when debugging.
        enable_asserts = envs.log_level() == "DEBUG"
        for key in ("size_asserts", "alignment_asserts", "scalar_asserts"):
            options.setdefault(key, enable_asserts)
    if (
        torch_at_least("2.9.0.dev")
        and "combo_kernels" not in options
        and "benchmark_combo_kernel" not in options
        and not current_platform.is_cpu()  # combo kernels do not support CPU yet
    ):
        # Horizontal fusion lets q-norm and k-norm (different shapes) share a kernel.
        options["combo_kernels"] = True
        deterministic = options.get("deterministic", _inductor_deterministic_default())
        options["benchmark_combo_kernel"] = not deterministic


def resolve_inductor_passes(cfg: CompilationConfig) -> None:
    """Put each extra pass, imported if given by name, into the Inductor options."""
    for name, value in cfg.inductor_passes.items():
        if isinstance(value, str):
            value = resolve_obj_by_qualname(value)
        if not callable(value):
            raise ValueError(
                f"inductor_passes[{name!r}] must be a callable or the dotted path of one"
            )
        cfg.inductor_compile_config[name] = value


def enable_rope_op_for_rope_fusions(cfg: CompilationConfig) -> None:
    """The RoPE fusions match the custom rotary_embedding op, not its plain form."""
    pass_config = cfg.pass_config
    wants_rope_op = (
        pass_config.enable_qk_norm_rope_fusion
        or pass_config.fuse_rope_kvcache
        or pass_config.fuse_qk_norm_rope_kvcache
    )
    if wants_rope_op and "+rotary_embedding" not in cfg.custom_ops:
        cfg.custom_ops.append("+rotary_embedding")


def validate_custom_ops(custom_ops: list[str]) -> None:
    """Well-formed entries, at most one base mode, and no op both enabled and disabled."""
    for op in custom_ops:
        if op not in BASE_CUSTOM_OPS and (len(op) < 2 or op[0] not in "+-"):
            raise ValueError(
                f"Invalid syntax '{op}' for custom op: use 'all', 'none', '+op' or '-op' "
                "(where 'op' is the registered op name)"
            )
    if sum(op in BASE_CUSTOM_OPS for op in custom_ops) > 1:
        raise ValueError(
            "custom_ops can contain only one base mode: 'all' or 'none'; remove the others"
        )
    enabled = {op[1:] for op in custom_ops if op.startswith("+")}
    disabled = {op[1:] for op in custom_ops if op.startswith("-")}
    conflicting = sorted(enabled & disabled)
    if conflicting:
        raise ValueError(
            "custom_ops cannot both enable and disable the same operation(s): "
            f"{', '.join(conflicting)}. Remove either the '+' or '-' directive"
        )


def validate_sizes(cfg: CompilationConfig) -> None:
    """Replay sizes and encoder budgets positive, encoder limits non-negative, and the
    only string in compile_sizes the capture-sizes marker."""
    if any(s <= 0 for s in cfg.decoder_replay_cudagraph_capture_sizes):
        raise ValueError(
            "All decoder_replay_cudagraph_capture_sizes must be positive, got "
            f"{cfg.decoder_replay_cudagraph_capture_sizes}"
        )
    if cfg.cudagraph_mm_encoder and cfg.encoder_cudagraph_max_vision_items_per_batch < 0:
        raise ValueError("encoder_cudagraph_max_vision_items_per_batch must be >= 0 (0 = infer)")
    frames = cfg.encoder_cudagraph_max_frames_per_batch
    if cfg.cudagraph_mm_encoder and frames is not None and frames < 0:
        raise ValueError("encoder_cudagraph_max_frames_per_batch must be >= 0 (None = infer)")
    if any(b <= 0 for b in cfg.encoder_cudagraph_token_budgets):
        raise ValueError(
            "All encoder_cudagraph_token_budgets must be positive, got "
            f"{cfg.encoder_cudagraph_token_budgets}"
        )
    for size in cfg.compile_sizes or []:
        if isinstance(size, str) and size != COMPILE_SIZES_FROM_CAPTURE:
            raise ValueError(
                f"compile_sizes accepts integers and the string "
                f"'{COMPILE_SIZES_FROM_CAPTURE}', got {size!r}"
            )


__all__ = [
    "BASE_CUSTOM_OPS",
    "COMPILE_SIZES_FROM_CAPTURE",
    "PIECEWISE_BACKENDS",
    "resolve_obj_by_qualname",
    "torch_at_least",
]
