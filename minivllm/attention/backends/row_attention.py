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

With minivllm's C++ kernels and a float32 or bfloat16 cache the rows run instead as
one ``minivllm_cpu::decode_attention`` call (`native_row_attention`): each query
row becomes a request of its own, whose context ends at its own token, and the
kernel computes every (row, KV head) pair whole on one thread, reading the keys
through the block table (no gathered copy).  A row's result again depends on its
query and its keys only, and is the same for a prefill row and for the decode step
of that token.  The per-row SDPA calls spent half of a batch-invariant step
(default model, 32 x 128/128): their gathers, calls and Python loop.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.ops import gather_kv
from minivllm.kernels import lowbit_cpu

_NATIVE_CACHE_DTYPES = (torch.float32, torch.bfloat16)


ROW_PLAN = "row_attention"
"""`AttentionMetadata.backend_plan` key of `_row_requests`' tensors."""


def _row_requests(
    attn_metadata: AttentionMetadata, block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each of the step's query rows as a request of its own: its request's block
    table (int32), its context length up to and including its token (int32) and its
    token's slot (int64)."""
    qsl = attn_metadata.query_start_loc.to(device=device, dtype=torch.long)
    seq_lens = attn_metadata.seq_lens.to(device=device, dtype=torch.long)
    num_tokens = int(qsl[-1])
    query_lens = qsl[1:] - qsl[:-1]
    req = torch.repeat_interleave(torch.arange(query_lens.numel(), device=device), query_lens)
    row = torch.arange(num_tokens, device=device)
    # Row r of request i is the token at position seq_len - query_len + (r - start).
    lens = seq_lens[req] - query_lens[req] + (row - qsl[req]) + 1
    tables = attn_metadata.block_tables.index_select(0, req).to(torch.int32)
    pos = lens - 1
    slots = tables.gather(1, (pos // block_size)[:, None]).squeeze(1).long() * block_size
    slots += pos % block_size
    return tables, lens.to(torch.int32), slots


def native_row_attention(
    layer: Any, query: torch.Tensor, attn_metadata: AttentionMetadata, output: torch.Tensor
) -> bool:
    """Fill ``output``'s first rows (the step's tokens) on the C++ decode kernel, each
    query row as its own request; False (nothing done) where the kernels are not
    loaded or the cache is of another dtype."""
    cache = layer.kv_cache
    if cache.dtype not in _NATIVE_CACHE_DTYPES or not lowbit_cpu.available():
        return False
    plan = attn_metadata.backend_plan.get(ROW_PLAN)
    if plan is None:  # once per step (and KV group): every layer reads the same
        plan = attn_metadata.backend_plan[ROW_PLAN] = _row_requests(
            attn_metadata, cache.shape[2], query.device
        )
    tables, lens, slots = plan
    num_tokens = lens.numel()
    if num_tokens == 0:
        return True
    # The kernel writes each row's K/V to its slot before attending: give it the
    # values already there (this step's, written by the KV update), so nothing changes.
    kv = cache.view(2, -1, cache.shape[3] * cache.shape[4])
    out = torch.ops.minivllm_cpu.decode_attention(
        query[:num_tokens].reshape(num_tokens, -1), kv[0].index_select(0, slots),
        kv[1].index_select(0, slots), cache, tables, lens, slots,
        layer.scale, getattr(layer, "sliding_window", None) or 0,
    )  # fmt: skip
    output[:num_tokens] = out.view(num_tokens, *output.shape[1:])
    return True


def row_attention(
    layer: Any, query: torch.Tensor, attn_metadata: AttentionMetadata, output: torch.Tensor
) -> None:
    """Fill ``output`` [T, nh, hd] one query row at a time (the cache already holds
    this step's K/V) with per-row SDPA calls on one thread."""
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
