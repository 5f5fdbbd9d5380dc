"""Weights of a GGUF file as HF-named tensors (read once, cached dequantized), or
with quantized matrices kept as raw blocks for layers that compute on them.

llama.cpp stores llama-architecture Q and K projections with the rows of each
head interleaved for its rotary layout; `unpermute_qk` undoes that exactly as
transformers' GGUF loader does, so our weights equal what HF loads.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from minivllm.logger import init_logger
from minivllm.model_executor.layers.gguf_blocks import FLOAT_TYPES, GGUFWeight
from minivllm.model_executor.loader import gguf_dequant
from minivllm.model_executor.loader.weight_cache import (
    cache_path_for,
    load_cached_weights,
    save_cached_weights,
)

logger = init_logger(__name__)

_TOP_LEVEL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_PER_BLOCK = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 norms around each sub-block (its ffn_norm precedes the MLP).
_GEMMA3_PER_BLOCK = {
    **_PER_BLOCK,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# Tensors we derive from the config instead (llama3 rope factors).
_IGNORED = {"rope_freqs.weight"}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file starting with the GGUF magic."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(4) == b"GGUF"


def gguf_to_hf_name(name: str, arch: str = "llama") -> str | None:
    """HF parameter name for a GGUF tensor name (None for tensors we skip)."""
    if name in _IGNORED:
        return None
    per_block = _GEMMA3_PER_BLOCK if arch == "gemma3" else _PER_BLOCK
    m = _BLOCK_RE.fullmatch(name)
    if m:
        layer, part, kind = m.groups()
        if part not in per_block:
            raise ValueError(f"GGUF tensor {name!r} has no counterpart in our models")
        return f"model.layers.{layer}.{per_block[part]}.{kind}"
    base, _, kind = name.rpartition(".")
    if base in _TOP_LEVEL:
        return f"{_TOP_LEVEL[base]}.{kind}"
    raise ValueError(f"GGUF tensor {name!r} has no counterpart in our models")


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row interleave of a Q or K weight (or bias)."""
    half = w.shape[0] // num_heads // 2
    rest = w.shape[1:]
    return w.reshape(num_heads, half, 2, *rest).transpose(1, 2).reshape(w.shape).contiguous()


class _Tensor:
    """One tensor of a GGUF file: name, type, GGUF-order shape, raw bytes."""

    def __init__(
        self, name: str, tensor_type: GGMLQuantizationType, shape, data, origin: tuple[str, int]
    ) -> None:
        self.name, self.tensor_type, self.shape, self.data = name, tensor_type, shape, data
        self.origin = origin
        """``(path, byte offset)`` of the tensor's bytes in the file."""


def _read_tensors(path: str | os.PathLike[str]) -> tuple[dict[str, Any], list[_Tensor]]:
    """Metadata and tensors (memory-mapped bytes, copy-on-write, one row per matrix row)
    of a GGUF file, read with minivllm's header parser: ``gguf.GGUFReader`` parses
    every metadata array, ~10 s for a 49k-token vocabulary on a busy 2-core CPU."""
    from gguf import GGML_QUANT_SIZES

    from minivllm.transformers_utils.config import read_gguf_header

    header = read_gguf_header(path)
    mm = np.memmap(path, dtype=np.uint8, mode="c")
    tensors = []
    for t in header.tensors:
        qtype = GGMLQuantizationType[t.ggml_type]
        block, type_size = GGML_QUANT_SIZES[qtype]
        count = int(np.prod(t.shape))
        start = header.data_start + t.offset
        raw = mm[start : start + count // block * type_size]
        rows = raw.reshape(count // t.shape[0], -1)
        tensors.append(_Tensor(t.name, qtype, t.shape, rows, (os.fspath(path), start)))
    return header.metadata, tensors


def _head_counts(metadata: dict[str, Any]) -> tuple[str, Any, Any]:
    arch = metadata.get("general.architecture")
    num_heads = metadata.get(f"{arch}.attention.head_count")
    return arch, num_heads, metadata.get(f"{arch}.attention.head_count_kv") or num_heads


def read_gguf_weights(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Dequantize every tensor of the file into an HF-named dict (no cache)."""
    metadata, tensors = _read_tensors(path)
    arch, num_heads, num_kv_heads = _head_counts(metadata)
    out: dict[str, torch.Tensor] = {}
    for t in tensors:
        hf_name = gguf_to_hf_name(t.name, arch)
        if hf_name is None:
            continue
        shape = tuple(int(d) for d in reversed(t.shape))
        w = gguf_dequant.dequantize(t.data, t.tensor_type, shape)
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            # llama.cpp stores Gemma's norm scale as 1 + w; HF (and we) keep w.
            w = w.float() - 1.0
        if arch == "llama" and num_heads:
            if ".q_proj." in hf_name:
                w = unpermute_qk(w, int(num_heads))
            elif ".k_proj." in hf_name:
                w = unpermute_qk(w, int(num_kv_heads))
        out[hf_name] = w
    return out


def read_gguf_quantized(path: str | os.PathLike[str]) -> Iterator[tuple[str, Any]]:
    """HF-named weights with 2-D quantized tensors left as raw `GGUFWeight` blocks
    (for layers that compute on them); float tensors and 1-D ones as tensors."""
    metadata, tensors = _read_tensors(path)
    arch, num_heads, num_kv_heads = _head_counts(metadata)
    for t in tensors:
        hf_name = gguf_to_hf_name(t.name, arch)
        if hf_name is None:
            continue
        qtype = GGMLQuantizationType(t.tensor_type)
        shape = tuple(int(d) for d in reversed(t.shape))
        w: Any
        if len(shape) == 2 and qtype not in FLOAT_TYPES:
            # The file's bytes in place (a copy-on-write mapping: nothing is copied, and
            # pages are read as the layers convert them), shaped in numpy: a torch view
            # would reach the layers as a tensor with a ``_base``, which the AOT-saved
            # Dynamo trace cannot pickle.
            raw = t.data.view(np.ndarray).reshape(shape[0], -1)
            w = GGUFWeight(torch.from_numpy(raw), qtype, (shape[0], shape[1]), t.origin)
        else:
            w = gguf_dequant.dequantize(t.data, t.tensor_type, shape)
            if arch == "gemma3" and hf_name.endswith("norm.weight"):
                w = w.float() - 1.0  # as in read_gguf_weights
        if arch == "llama" and num_heads and (".q_proj." in hf_name or ".k_proj." in hf_name):
            heads = int(num_heads if ".q_proj." in hf_name else num_kv_heads)
            if isinstance(w, GGUFWeight):  # rows are whole blocks: permute them as bytes
                w = GGUFWeight(unpermute_qk(w.data, heads), w.qtype, w.shape)
            else:
                w = unpermute_qk(w, heads)
        yield hf_name, w


def load_gguf_weights(
    path: str | os.PathLike[str], use_cache: bool = True
) -> dict[str, torch.Tensor]:
    """HF-named tensors of a GGUF file, from the dequantized cache when present."""
    if use_cache:
        t0 = time.perf_counter()
        cached = load_cached_weights(path)
        if cached is not None:
            logger.info("loaded cached GGUF weights in %.2fs", time.perf_counter() - t0)
            return cached
    t0 = time.perf_counter()
    tensors = read_gguf_weights(path)
    logger.info("dequantized %d GGUF tensors in %.2fs", len(tensors), time.perf_counter() - t0)
    if use_cache:
        try:
            target = save_cached_weights(path, tensors)
            logger.info("cached dequantized weights at %s", target)
        except OSError as e:  # a read-only cache dir must not stop the load
            logger.warning("could not write the GGUF weight cache: %s", e)
    return tensors


def gguf_weights_iterator(
    path: str | os.PathLike[str],
    use_cache: bool = True,
    lazy: bool = False,
    keep_quantized: bool = False,
) -> Iterator[tuple[str, Any]]:
    """``(hf_name, tensor)`` pairs of a GGUF file, for ``model.load_weights``.

    ``lazy`` (tensor-parallel ranks): once the dequantized cache exists, its tensors
    come as `LazyWeight` slices, so each rank reads only its shard of the file.
    ``keep_quantized``: quantized matrices come as `GGUFWeight` blocks.
    """
    if keep_quantized:
        yield from read_gguf_quantized(path)
        return
    if lazy and use_cache:
        target = cache_path_for(path)
        if target.exists():
            from safetensors import safe_open

            from minivllm.model_executor.layers.tensor_parallel import LazyWeight

            with safe_open(str(target), framework="pt") as sf:
                for name in sf.keys():
                    yield name, LazyWeight(sf.get_slice(name))
            return
    yield from load_gguf_weights(path, use_cache).items()
