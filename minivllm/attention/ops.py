"""Paged KV cache primitives: quantize, write tokens to slots, gather a context.

Plain torch, device-agnostic.  The cache layout is described in
`minivllm.attention.paged_kv`.
"""

from __future__ import annotations

import torch

from minivllm.attention.paged_kv import is_fp8
from minivllm.math_utils import cdiv


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


def compute_kv_scale(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """Per-tensor scale ``max|x| / fp8_max`` (float32 scalar; never zero)."""
    amax = x.detach().abs().max().float()
    return (amax / fp8_max(cache_dtype)).clamp(min=torch.finfo(torch.float32).tiny)


def quantize_for_cache(
    x: torch.Tensor, cache_dtype: torch.dtype, scale: torch.Tensor
) -> torch.Tensor:
    """Convert new K or V rows to the cache dtype (``x / scale`` for fp8, saturating)."""
    if not is_fp8(cache_dtype):
        return x.to(cache_dtype)
    limit = fp8_max(cache_dtype)
    return (x.float() / scale).clamp_(-limit, limit).to(cache_dtype)


def dequantize_from_cache(
    x: torch.Tensor, out_dtype: torch.dtype, scale: torch.Tensor
) -> torch.Tensor:
    """Inverse of `quantize_for_cache` (a plain cast for non-fp8 caches)."""
    if not is_fp8(x.dtype):
        return x.to(out_dtype)
    return (x.float() * scale).to(out_dtype)


def valid_slots(
    slot_mapping: torch.Tensor, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The slots to write for the first ``num_tokens`` rows, and which rows they are.

    Rows whose slot is negative (padding) are dropped; the row index is None when
    every row is kept (the common case, which then needs no gather).
    """
    slots = slot_mapping[:num_tokens]
    valid = slots >= 0
    if bool(valid.all()):
        return slots, None
    rows = valid.nonzero().squeeze(1)
    return slots.index_select(0, rows), rows


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slots: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> None:
    """Store ``key``/``value`` [len(slots), num_kv_heads, head_dim] at flat ``slots``."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, head_dim)
    flat[0][slots] = quantize_for_cache(key, kv_cache.dtype, k_scale)
    flat[1][slots] = quantize_for_cache(value, kv_cache.dtype, v_scale)


def gather_kv(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    out_dtype: torch.dtype,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seq_len`` cached K and V rows of one request, [seq_len, nkv, hd] each."""
    block_size = kv_cache.shape[2]
    num_blocks = cdiv(seq_len, block_size)
    blocks = kv_cache.index_select(1, block_table[:num_blocks])
    kv = blocks.flatten(1, 2)[:, :seq_len]
    return (
        dequantize_from_cache(kv[0], out_dtype, k_scale),
        dequantize_from_cache(kv[1], out_dtype, v_scale),
    )


def gather_kv_batched(
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    max_seq_len: int,
    out_dtype: torch.dtype,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of several requests padded to a common length, [B, L, nkv, hd] each.

    ``L`` is ``max_seq_len`` rounded up to whole blocks; rows past a request's
    own length hold whatever its table points at and must be masked.
    """
    block_size = kv_cache.shape[2]
    num_blocks = cdiv(max_seq_len, block_size)
    tables = block_tables[:, :num_blocks]
    b = tables.shape[0]
    # index_select over the flattened table is the cheapest gather on CPU.
    flat = tables.reshape(-1)
    shape = (b, num_blocks * block_size, *kv_cache.shape[3:])
    k = kv_cache[0].index_select(0, flat).view(shape)
    v = kv_cache[1].index_select(0, flat).view(shape)
    return dequantize_from_cache(k, out_dtype, k_scale), dequantize_from_cache(
        v, out_dtype, v_scale
    )
