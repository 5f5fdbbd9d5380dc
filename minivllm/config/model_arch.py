"""Architecture numbers and dtype resolution for `ModelConfig` (kept apart to keep
model.py short)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from minivllm.config.utils import getattr_iter
from minivllm.logger import init_logger

logger = init_logger(__name__)

STR_TO_DTYPE: dict[str, torch.dtype] = {
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
}
_HALF_DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class ModelArchConfig:
    """The architecture numbers of a model, read once from its HF config."""

    architectures: tuple[str, ...]
    """HF architecture names, e.g. ``("LlamaForCausalLM",)``."""
    model_type: str
    """HF model type, e.g. ``"llama"``."""
    hidden_size: int
    """Width of the residual stream."""
    total_num_hidden_layers: int
    """Decoder layers of the whole model."""
    total_num_attention_heads: int
    """Query heads of the whole model."""
    total_num_kv_heads: int
    """Key/value heads of the whole model (fewer than query heads with GQA)."""
    head_size: int
    """Dimension of one attention head."""
    vocab_size: int
    """Rows of the embedding matrix."""
    num_experts: int
    """Routed experts per MoE layer (0 for dense models)."""
    derived_max_model_len: int | None
    """Longest context the config supports (after RoPE scaling)."""
    derived_max_model_len_key: str | None
    """Config key ``derived_max_model_len`` came from."""


def checkpoint_dtype(hf_config: Any, hf_text_config: Any) -> torch.dtype:
    """The dtype the checkpoint's config declares (float32 when it declares none)."""
    raw = getattr_iter(hf_text_config, ["dtype", "torch_dtype"], None)
    if raw is None:
        raw = getattr_iter(hf_config, ["dtype", "torch_dtype"], None)
    if isinstance(raw, torch.dtype):
        return raw
    if isinstance(raw, str) and raw.removeprefix("torch.") in STR_TO_DTYPE:
        return STR_TO_DTYPE[raw.removeprefix("torch.")]
    return torch.float32


def resolve_dtype(
    requested: str | torch.dtype, checkpoint: torch.dtype, *, pooling: bool = False
) -> torch.dtype:
    """The compute dtype for ``requested`` given the checkpoint dtype (float32 for
    a quantized GGUF file: the dtype its blocks dequantize to exactly); ``pooling``
    for a pooling model of unquantized weights.

    See the module docstring of `minivllm.config.model` for the rules.
    """
    from minivllm.platforms import cpu as cpu_platform
    from minivllm.platforms import current_platform

    if isinstance(requested, str) and requested != "auto":
        resolved = STR_TO_DTYPE[requested]
        if current_platform.is_cpu() and resolved == torch.float16:
            logger.warning("float16 on CPU is slow in PyTorch; consider float32.")
        if (
            current_platform.is_cuda()
            and resolved == torch.bfloat16
            and current_platform.get_device_capability() is not None
            and not current_platform.has_device_capability(80)
        ):
            raise ValueError(
                "bfloat16 needs a GPU of compute capability >= 8.0; use dtype='float16'"
            )
        return resolved
    if isinstance(requested, torch.dtype):
        return requested
    if current_platform.is_cpu():
        return _cpu_auto_dtype(checkpoint, cpu_platform.cpu_has_native_bf16(), pooling)
    bf16_ok = current_platform.get_device_capability() is None or (
        current_platform.has_device_capability(80)
    )
    if checkpoint == torch.float32:
        return torch.bfloat16 if bf16_ok else torch.float16
    if checkpoint == torch.bfloat16 and not bf16_ok:
        logger.info("This GPU lacks bfloat16; running the bfloat16 checkpoint in float16.")
        return torch.float16
    return checkpoint


def _cpu_auto_dtype(checkpoint: torch.dtype, native_bf16: bool, pooling: bool) -> torch.dtype:
    """``dtype="auto"`` on a CPU (figures: `minivllm.config.model`'s docstring):
    bfloat16 checkpoints, and float32 ones of pooling models, run in bfloat16 where
    the CPU computes it natively; every other checkpoint, quantized GGUF included,
    runs in float32."""
    if native_bf16 and (checkpoint == torch.bfloat16 or (pooling and checkpoint == torch.float32)):
        _log_auto(str(checkpoint).removeprefix("torch."), torch.bfloat16)
        return torch.bfloat16
    if checkpoint in _HALF_DTYPES:
        _log_auto(str(checkpoint).removeprefix("torch."), torch.float32)
        return torch.float32
    return checkpoint


def _log_auto(what: str, dtype: torch.dtype) -> None:
    why = (
        "this CPU computes bfloat16 natively (AMX or AVX512-BF16)"
        if dtype == torch.bfloat16
        else "half types on this CPU are emulated (slow) or less accurate"
    )
    logger.info(
        "dtype auto: running the %s checkpoint in %s on CPU (%s); pass --dtype to override.",
        what,
        str(dtype).removeprefix("torch."),
        why,
    )
