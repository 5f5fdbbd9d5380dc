"""Layout, allocation and per-step metadata of the paged KV cache tensors.

Per layer the cache is one tensor ``[2, num_blocks, block_size, num_kv_heads, head_dim]``
(index 0 holds keys, 1 values).  A token in slot ``s`` lives in block
``s // block_size`` at offset ``s % block_size``.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

import torch

from minivllm.attention.metadata import AttentionMetadata
from minivllm.math_utils import cdiv

_NAMED_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "float": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}

FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)


def resolve_kv_cache_dtype(cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """Map ``CacheConfig.cache_dtype`` to the torch dtype the cache is stored in.

    ``"auto"`` follows the model; ``"fp8"``/``"fp8_e4m3"`` store float8_e4m3fn and
    ``"fp8_e5m2"`` float8_e5m2, with per-layer scales.
    """
    if cache_dtype == "auto":
        return model_dtype
    try:
        return _NAMED_DTYPES[cache_dtype]
    except KeyError:
        raise ValueError(
            f"kv cache dtype {cache_dtype!r} is not supported here; use one of "
            f"'auto', {', '.join(repr(k) for k in _NAMED_DTYPES)}"
        ) from None


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether a cache of this dtype is quantized (needs scales)."""
    return dtype in FP8_DTYPES


def kv_cache_shape(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
) -> tuple[int, int, int, int, int]:
    """Shape of one layer's cache tensor."""
    return (2, num_blocks, block_size, num_kv_heads, head_dim)


def kv_cache_bytes_per_block(
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    num_layers: int = 1,
) -> int:
    """Bytes one block takes, keys and values, summed over ``num_layers`` layers."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * block_size * num_kv_heads * head_dim * elem * num_layers


def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    """One zeroed cache tensor per layer (zeros so padded reads are finite).

    On the CPU each tensor lives in its own anonymous memory map, whose pages the
    kernel hands out zero-filled on first touch: start-up does not spend the time of
    writing the whole cache (0.4-0.9 s per GiB), and the resident set grows with the
    blocks actually written instead of holding the whole cache from the start."""
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(
            f"num_blocks ({num_blocks}) and block_size ({block_size}) must be positive; "
            "give the KV cache more memory or a smaller block size"
        )
    shape = kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
    if torch.device(device).type == "cpu":
        return [lazily_zeroed(shape, dtype) for _ in range(num_layers)]
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]


def lazily_zeroed(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros backed by an anonymous memory map (page-aligned; the
    pages are zero-filled by the kernel when first touched, and unmapped when the
    tensor is freed)."""
    elem = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * elem
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buffer, dtype=dtype).view(*shape)


def build_attention_metadata(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    block_tables: Sequence[Sequence[int]],
    block_size: int,
    device: torch.device | str = "cpu",
    num_padded_tokens: int | None = None,
) -> AttentionMetadata:
    """Metadata for a flat batch, computing each new token's slot from its position.

    Request ``i`` contributes ``query_lens[i]`` tokens at positions
    ``seq_lens[i] - query_lens[i] .. seq_lens[i] - 1`` of its sequence, whose
    blocks are ``block_tables[i]``.  ``num_padded_tokens`` adds padding rows
    (slot -1).  A reference for model runners and what the tests use.
    """
    slots: list[int] = []
    for q_len, s_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
        if not 0 <= q_len <= s_len or cdiv(s_len, block_size) > len(table):
            raise ValueError(f"query_len {q_len} / seq_len {s_len} / {len(table)} blocks mismatch")
        for pos in range(s_len - q_len, s_len):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
    num_tokens = len(slots)
    if num_padded_tokens is not None:
        slots += [-1] * (num_padded_tokens - num_tokens)
    qsl = [0]
    for q_len in query_lens:
        qsl.append(qsl[-1] + q_len)
    width = max((len(t) for t in block_tables), default=0) or 1
    table_rows = [list(t) + [0] * (width - len(t)) for t in block_tables]
    return AttentionMetadata(
        num_actual_tokens=num_tokens,
        max_query_len=max(query_lens, default=0),
        max_seq_len=max(seq_lens, default=0),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        block_tables=torch.tensor(table_rows, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=list(seq_lens),
    )
