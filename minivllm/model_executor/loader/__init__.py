"""Build a model and fill its weights: ``load_model(model_path, hf_config, dtype)``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from minivllm.distributed import get_tp_group, get_world_group
from minivllm.model_executor.layers.tensor_parallel import shard_model
from minivllm.model_executor.loader.gguf import gguf_weights_iterator, is_gguf_file
from minivllm.model_executor.loader.safetensors import has_hf_weights, hf_weights_iterator
from minivllm.model_executor.models.registry import (
    get_model_class_for_config,
    get_pooling_model_class,
)

LOAD_FORMATS = ("auto", "gguf", "safetensors", "pt", "dummy")
"""Accepted ``load_format`` values."""


def find_gguf_file(model_path: str | os.PathLike[str]) -> Path | None:
    """The GGUF file ``model_path`` names, or the only one in that directory."""
    p = Path(model_path)
    if is_gguf_file(p):
        return p
    if p.is_dir() and not has_hf_weights(p):
        found = sorted(p.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
    return None


def get_weights_iterator(
    model_path: str | os.PathLike[str],
    load_format: str = "auto",
    use_cache: bool = True,
    lazy: bool = False,
    keep_quantized: bool = False,
) -> Iterator[tuple[str, Any]]:
    """HF-named ``(name, tensor)`` pairs from a GGUF file or an HF directory.

    ``lazy``: safetensors tensors come as `LazyWeight` slices that the (sharded)
    weight loaders read only in part; ``keep_quantized``: a GGUF file's quantized
    matrices stay `GGUFWeight` blocks.
    """
    gguf_file = find_gguf_file(model_path) if load_format in ("auto", "gguf") else None
    if gguf_file is not None:
        return gguf_weights_iterator(gguf_file, use_cache, lazy, keep_quantized)
    if load_format == "gguf":
        raise ValueError(f"{model_path} is not a GGUF file (or a directory with exactly one)")
    if not Path(model_path).is_dir():
        raise ValueError(f"model path {model_path} is neither a GGUF file nor a directory")
    return hf_weights_iterator(model_path, lazy=lazy)


def initialize_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights for tests: N(0, 0.02) matrices, unit norms, zero biases."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if param.dim() == 1:
            param.data.fill_(1.0 if "norm" in name else 0.0)
        else:
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * 0.02
            param.data.copy_(noise)


def load_model(
    model_path: str | os.PathLike[str] | None,
    hf_config: Any,
    dtype: torch.dtype = torch.float32,
    *,
    load_format: str = "auto",
    device: torch.device | str = "cpu",
    use_cache: bool = True,
    quantization: str | None = None,
    pooling_task: str | None = None,
) -> nn.Module:
    """Construct the model for ``hf_config`` on ``device`` and load its weights.

    Call inside ``with set_current_vllm_config(cfg):`` so layers see the
    compilation/cache config.  ``load_format="dummy"`` skips the checkpoint.
    ``quantization`` (`ModelConfig.quantization`): "gguf" keeps GGUF matrices
    quantized (each layer's ``process_weights_after_loading`` then stores its
    low-bit form); "int8_per_channel" quantizes the loaded float weights to int8.
    ``pooling_task`` ("embed" / "classify", `ModelConfig.convert_type`) builds the
    pooling form of the model (no LM head) for the pooling runner.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r} is not one of {', '.join(LOAD_FORMATS)}")
    if pooling_task is None:
        model_cls = get_model_class_for_config(hf_config)
    else:
        model_cls = get_pooling_model_class(hf_config, pooling_task)
    if get_world_group().world_size > 1 and not getattr(model_cls, "supports_parallel", False):
        raise ValueError(
            f"{model_cls.__name__} does not run with tensor or pipeline parallelism in "
            "minivllm yet; use --tensor-parallel-size 1 --pipeline-parallel-size 1"
        )
    with torch.device(device):
        model = model_cls(hf_config, dtype=dtype)
    tp = get_tp_group()
    shard_model(model, tp)
    if load_format == "dummy":
        initialize_dummy_weights(model)
    else:
        if model_path is None:
            raise ValueError("a model path is needed unless load_format='dummy'")
        weights = get_weights_iterator(
            model_path,
            load_format,
            use_cache,
            lazy=tp.world_size > 1,
            keep_quantized=quantization == "gguf",
        )
        model.load_weights(weights)
        process_weights_after_loading(model, dtype)
    if quantization == "int8_per_channel":
        quantize_int8(model)
    return model.eval()


def process_weights_after_loading(model: nn.Module, dtype: torch.dtype) -> None:
    """Let every layer convert what it was given (e.g. GGUF blocks to low-bit form)."""
    for module in model.modules():
        hook = getattr(module, "process_weights_after_loading", None)
        if hook is not None:
            hook(dtype)


def quantize_int8(model: nn.Module) -> int:
    """Quantize every linear layer and the LM head of ``model`` to int8, one scale per
    output channel (``quantization="int8_per_channel"``); returns how many."""
    count = 0
    for module in model.modules():
        if callable(getattr(module, "quantize_int8", None)):
            module.quantize_int8()
            count += 1
    return count


__all__ = [
    "LOAD_FORMATS",
    "quantize_int8",
    "get_weights_iterator",
    "initialize_dummy_weights",
    "load_model",
]
