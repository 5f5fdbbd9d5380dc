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
through `DECODE_INPUTS`, a module-level holder the runner fills before each
call (the forward context is a ``ContextVar``, which Dynamo does not trace).
Its tensors become inputs of the compiled graph, read afresh on every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from minivllm.attention.ops import dequantize_from_cache, quantize_for_cache
from minivllm.torch_ops import register_op

_NATIVE_CACHE_DTYPES = (torch.float32, torch.bfloat16)


@dataclass
class DecodeInputs:
    """What the traced attention reads of one decode step (one token per request)."""

    tracing: bool = False
    """True while the decode graph is traced or run: `Attention` then inlines
    `decode_attention` instead of calling its custom ops."""
    seq_lens: torch.Tensor | None = None
    """int32 [B]: context length of each request, this step's token included."""
    block_tables: list[torch.Tensor] = field(default_factory=list)
    """Per KV cache group, int32 [B, nb]: the blocks holding each request's context
    (``nb * block_size >= max(seq_lens)``; entries past a request's end point at
    the null block and are masked)."""
    slots: list[torch.Tensor] = field(default_factory=list)
    """Per KV cache group, int64 [B]: the flat slot this step's K/V go to."""
    native_attention: bool = False
    """Whether minivllm's C++ kernels are loaded, so `decode_attention` calls
    ``minivllm_cpu::decode_attention`` (decided before tracing: the check
    builds the kernels on first use, which Dynamo cannot trace)."""


DECODE_INPUTS = DecodeInputs()


def decode_attention(
    layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> torch.Tensor:
    """Write this step's K/V into ``layer.kv_cache`` and return the attention of
    ``query`` [B, nh*hd] over each request's context, [B, nh*hd].

    With minivllm's C++ kernels loaded (`DecodeInputs.native_attention`) and a
    float32 or bfloat16 cache, one ``minivllm_cpu::decode_attention`` call does
    both, in place and split over the (request, KV head) pairs over the threads
    (Inductor runs the torch ops below, which serve otherwise, as loops on one
    thread on a small machine).  The query heads that share a KV head are
    computed together; scores and the softmax are float32 whatever the cache
    dtype.  Keys a query must not see (past its context, or before its sliding
    window) get a score of -inf.
    """
    inputs = DECODE_INPUTS
    cache = layer.kv_cache
    group = layer.kv_group
    if inputs.native_attention and cache.dtype in _NATIVE_CACHE_DTYPES:
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


def _boundary_impl(hidden: torch.Tensor) -> torch.Tensor:
    return hidden.clone()


def _boundary_fake(hidden: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(hidden)


LAYER_BOUNDARY_OP = "minivllm::decode_layer_boundary"
"""Where the decode graph is split: one compiled piece per decoder layer."""

_layer_boundary = register_op("decode_layer_boundary", _boundary_impl, _boundary_fake)


LAYERS_PER_PIECE = 5
"""Decoder layers per compiled piece of the decode graph.  Each piece call costs
~0.1 ms of Python (the split graph, AOTAutograd's and Inductor's wrappers) at
any batch, so fewer pieces make a faster step; pieces of the same layers are the
same graph and compile once, but a larger piece compiles longer.  Measured on
the default model (30 layers, ``benchmarks/decode_graph.py``): see the README."""


def decode_layer_boundary(hidden: torch.Tensor, index: int, fused: bool = False) -> torch.Tensor:
    """Mark the end of decoder layer ``index`` in the decode graph's trace (a copy
    of ``hidden``, ~1 us) after every `LAYERS_PER_PIECE` layers; elsewhere
    ``hidden`` itself.

    The decode graph is split at these marks, so its pieces are runs of decoder
    layers: the middle ones are the same graph with other weights and compile
    once, where a single whole-model graph takes Inductor minutes to compile.
    A ``fused`` layer (one ``minivllm_cpu::decoder_layer`` call) adds no mark:
    there is nothing for Inductor to compile in it, so a model whose layers all
    fuse is one piece, and its step pays one piece call instead of one per run.
    """
    if DECODE_INPUTS.tracing and not fused and (index + 1) % LAYERS_PER_PIECE == 0:
        return _layer_boundary(hidden)
    return hidden


__all__ = [
    "DECODE_INPUTS",
    "LAYER_BOUNDARY_OP",
    "DecodeInputs",
    "decode_attention",
    "decode_layer_boundary",
]
