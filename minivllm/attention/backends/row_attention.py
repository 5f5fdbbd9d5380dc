"""Batch-invariant attention (``VLLM_BATCH_INVARIANT=1``): each query row alone.

`CpuSdpaBackend` batches decode rows into one padded SDPA call and runs a
request's prefill rows as one causal SDPA call; both are exact up to float
rounding, but the rounding depends on the batch (the padded key length, the
query block a row falls in), so a token decoded in a batch, or recomputed by a
prefill after preemption, gets slightly different keys and values than it gets
alone.  Here every query row, decode or prefill, is one SDPA call of the same
shape over exactly the keys it sees: ``[1, kv_heads, group, head_dim]`` queries
(the heads that share a KV head folded into rows of it) against its own
``p + 1`` keys (the last ``window`` of them with a sliding window), on one
thread.  The result of a row depends on nothing else in the step.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.ops import gather_kv


def row_attention(
    layer: Any, query: torch.Tensor, attn_metadata: AttentionMetadata, output: torch.Tensor
) -> None:
    """Fill ``output`` [T, nh, hd] one query row at a time (the cache already holds
    this step's K/V)."""
    qsl = attn_metadata.query_start_loc_cpu
    if qsl is None:
        qsl = attn_metadata.query_start_loc.tolist()
    seq_lens = attn_metadata.seq_lens_cpu
    if seq_lens is None:
        seq_lens = attn_metadata.seq_lens.tolist()
    window = getattr(layer, "sliding_window", None)
    for req in range(len(qsl) - 1):
        start, end, seq_len = qsl[req], qsl[req + 1], seq_lens[req]
        if end == start:
            continue
        k, v = gather_kv(
            layer.kv_cache,
            attn_metadata.block_tables[req],
            seq_len,
            query.dtype,
            layer.k_scale,
            layer.v_scale,
        )
        k, v = k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        first_pos = seq_len - (end - start)
        for row in range(start, end):
            keys = first_pos + row - start + 1
            lo = 0 if window is None else max(0, keys - window)
            output[row] = _one_row(query[row], k[:, :, lo:keys], v[:, :, lo:keys], layer.scale)


def _one_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of one query token [nh, hd] over keys/values [1, nkv, L, hd]."""
    num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    grouped = q.reshape(1, num_kv_heads, num_heads // num_kv_heads, head_dim)
    res = F.scaled_dot_product_attention(grouped, k, v, scale=scale)
    return res.reshape(num_heads, head_dim)
