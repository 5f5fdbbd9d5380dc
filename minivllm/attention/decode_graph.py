"""Paged decode attention written in plain torch ops, for a whole-forward CPU graph.

A decode step (every request has one new token) is the step a CPU engine runs
most, and at small batches its time goes to per-op overhead more than to work:
each layer's KV write and attention are Python-level custom ops with their own
gathers, copies and SDPA call.  The CPU decode graph
(`minivllm.worker.decode_graph`) traces the forward with attention inlined as the
ops below, so Inductor compiles the KV write (an in-place ``index_put_`` into the
cache tensor), the gather of the context through the block table (indirect
loads inside the score loop, nothing materialised) and the softmax into C++
loops next to the layer's other ops.

The step's block tables, context lengths and write slots reach the traced code
as the forward context's `DecodeStep`, which the compiled forward takes as an
argument (`minivllm.attention.forward_context.ForwardContextHandle`): its
tensors are inputs of the compiled graph, read afresh on every call.  The
decode graph's copy of the model has a `DecodeAttention` where the model has an
`Attention`; the model itself never runs this code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minivllm.attention.forward_context import DecodeStep, ForwardContextHandle
from minivllm.attention.ops import dequantize_from_cache, quantize_for_cache

_NATIVE_CACHE_DTYPES = (torch.float32, torch.bfloat16)


def decode_attention(
    layer: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    step: DecodeStep,
    native: bool,
) -> torch.Tensor:
    """Write this step's K/V into ``layer.kv_cache`` and return the attention of
    ``query`` [B, nh*hd] over each request's context, [B, nh*hd].

    With minivllm's C++ kernels loaded (``native``) and a
    float32 or bfloat16 cache, one ``minivllm_cpu::decode_attention`` call does
    both, in place and split over the (request, KV head) pairs over the threads
    (Inductor runs the torch ops below, which serve otherwise, as loops on one
    thread on a small machine).  The query heads that share a KV head are
    computed together; scores and the softmax are float32 whatever the cache
    dtype.  Keys a query must not see (past its context, or before its sliding
    window) get a score of -inf.
    """
    inputs = step
    cache = layer.kv_cache
    group = layer.kv_group
    if native and cache.dtype in _NATIVE_CACHE_DTYPES:
        return torch.ops.minivllm_cpu.decode_attention(
            query, key, value, cache, inputs.block_tables[group], inputs.seq_lens,
            inputs.slots[group], layer.scale, layer.sliding_window or 0,
        )  # fmt: skip
    num_blocks, block_size, nkv, hd = cache.shape[1:]
    b = query.shape[0]
    nh = layer.num_heads
    slots = inputs.slots[group]
    # One index_put_ on the cache tensor itself (not a view of it), so Inductor
    # writes the rows in place instead of rebuilding the whole cache.
    new_kv = torch.stack([key.view(b, nkv, hd), value.view(b, nkv, hd)])
    scales = torch.stack([layer.k_scale, layer.v_scale]).view(2, 1, 1, 1)
    which = torch.arange(2, device=cache.device)[:, None]
    cache.index_put_(
        (which, (slots // block_size)[None], (slots % block_size)[None]),
        quantize_for_cache(new_kv, cache.dtype, scales),
    )
    table = inputs.block_tables[group]
    keys = dequantize_from_cache(cache[0][table], torch.float32, layer.k_scale)
    values = dequantize_from_cache(cache[1][table], torch.float32, layer.v_scale)
    keys = keys.view(b, -1, nkv, 1, hd)  # [B, T, nkv, 1, hd]
    values = values.view(b, -1, nkv, 1, hd)
    q = query.view(b, 1, nkv, nh // nkv, hd).float()
    scores = (q * keys).sum(-1) * layer.scale  # [B, T, nkv, G]
    pos = torch.arange(keys.shape[1], device=query.device)[None, :]
    lens = inputs.seq_lens[:, None]
    visible = pos < lens
    window = layer.sliding_window
    if window is not None:
        visible = visible & (pos >= lens - window)
    scores = scores.masked_fill(~visible[:, :, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=1)
    out = (probs[..., None] * values).sum(1)  # [B, nkv, G, hd]
    return out.reshape(b, nh * hd).to(query.dtype)


class DecodeAttention(nn.Module):
    """Stands for an `Attention` layer in the decode graph's copy of the model:
    `decode_attention` over the layer's cache, with the step's inputs read from
    the forward context of the call under way."""

    def __init__(self, layer: nn.Module, handle: ForwardContextHandle, native: bool) -> None:
        super().__init__()
        self.layer = layer
        self.handle = handle
        self.native = native
        """Whether minivllm's C++ kernels are loaded, so the attention is
        ``minivllm_cpu::decode_attention`` (decided before tracing: the check builds
        the kernels on first use, which Dynamo cannot trace)."""

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        step = self.handle.decode_step()
        return decode_attention(self.layer, query, key, value, step, self.native)


__all__ = ["DecodeAttention", "decode_attention"]
