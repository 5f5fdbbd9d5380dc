"""A Llama-style decoder layer of the CPU decode graph as one C++ call.

At batch 1 on a small CPU, a decode step of a GGUF model spends as much time
around its low-bit GEMMs as in them: an op dispatch per GEMM, Inductor's loops
for the norms, rotary embedding, KV write and activation, and a wake-up of the
thread pool whenever its threads went idle between two calls.  While the decode
graph is traced (`DECODE_INPUTS.tracing`, minivllm's C++ kernels loaded), an
eligible layer becomes one ``minivllm_cpu::decoder_layer`` call
(``minivllm/kernels/decode_layer_cpu.cpp``) that runs the same computation with
the same kernels back to back, and a model whose layers all are (sharing one KV
cache group, window and rotary table) one ``minivllm_cpu::decoder_stack`` call
a step (`fused_decoder_stack`).

Eligible: float32 activations; the four projections in a native low-bit form
(``Q4``, or ``INT8`` with inputs a multiple of 64) without biases; no q/k norm;
the rotary table's layout (`RotaryEmbedding`); a float32 or bfloat16 KV cache.
Anything else traces the layer's own ops, as does ``MINIVLLM_CPU_FUSED_LAYERS=0``.
"""

from __future__ import annotations

from typing import Any

import torch

from minivllm import envs
from minivllm.attention.decode_graph import DECODE_INPUTS
from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.quantized_linear import INT8, Q4
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding

_CACHE_DTYPES = (torch.float32, torch.bfloat16)


def _native_linear(linear: Any) -> bool:
    kind = linear.quant_kind
    if linear.bias is not None or kind not in (Q4, INT8):
        return False
    return kind == Q4 or linear.input_size % lowbit_cpu.Q8_GROUP == 0


def fusable(
    hidden: torch.Tensor,
    norms: tuple[RMSNorm, RMSNorm],
    linears: tuple[Any, Any, Any, Any],
    attn: Any,
    rotary: Any,
    has_qk_norm: bool,
) -> bool:
    """Whether this layer, at this trace, can run as ``minivllm_cpu::decoder_layer``."""
    if not (DECODE_INPUTS.tracing and DECODE_INPUTS.native_attention):
        return False
    cache = attn.kv_cache
    return (
        envs.cpu_fused_layers()
        and hidden.dtype == torch.float32
        and not has_qk_norm
        and all(type(n) is RMSNorm for n in norms)
        and norms[0].variance_epsilon == norms[1].variance_epsilon
        and all(_native_linear(lin) for lin in linears)
        and type(rotary) is RotaryEmbedding
        and rotary.head_size == attn.head_size
        and rotary.cos_sin_cache.dtype == torch.float32
        and cache is not None
        and cache.dtype in _CACHE_DTYPES
    )


def fused_decoder_layer(
    positions: torch.Tensor,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norms: tuple[RMSNorm, RMSNorm],
    linears: tuple[Any, Any, Any, Any],
    attn: Any,
    rotary: RotaryEmbedding,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mlp_out, residual)`` of a pre-norm decoder layer (input norm, fused QKV,
    rotary, paged attention, output projection, post-attention norm, SwiGLU MLP),
    writing this step's K/V into ``attn.kv_cache``; `fusable` must have said yes.

    ``linears`` are ``(qkv_proj, o_proj, gate_up_proj, down_proj)``."""
    inputs = DECODE_INPUTS
    group = attn.kv_group
    weights = [t for lin in linears for t in (lin.qweight, lin.qscales)]
    return torch.ops.minivllm_cpu.decoder_layer(
        hidden, residual, norms[0].weight, norms[1].weight, weights,
        [lin.quant_kind for lin in linears], rotary.cos_sin_cache, positions, attn.kv_cache,
        inputs.block_tables[group], inputs.seq_lens, inputs.slots[group], attn.num_heads,
        norms[0].variance_epsilon, attn.scale, attn.sliding_window or 0,
    )  # fmt: skip


LayerParts = tuple[tuple[RMSNorm, RMSNorm], tuple[Any, Any, Any, Any], Any, RotaryEmbedding]
"""``(norms, linears, attn, rotary)`` of one fusable layer, as `fused_decoder_layer` takes them."""


def fused_decoder_stack(
    positions: torch.Tensor, hidden: torch.Tensor, layers: list[LayerParts]
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(hidden, residual)`` after all of ``layers`` (each `fusable`), as one
    ``minivllm_cpu::decoder_stack`` call: one op dispatch a step instead of one a
    layer.  None when the layers differ in what the call shares (KV cache group,
    sliding window, heads, scale, norm epsilon, rotary table): then call
    `fused_decoder_layer` per layer."""
    first_norms, _, first_attn, first_rotary = layers[0]
    shared = (first_attn.kv_group, first_attn.sliding_window, first_attn.num_heads,
              first_attn.scale, first_norms[0].variance_epsilon)  # fmt: skip
    for norms, _, attn, rotary in layers:
        mine = (attn.kv_group, attn.sliding_window, attn.num_heads, attn.scale,
                norms[0].variance_epsilon)  # fmt: skip
        if mine != shared or rotary is not first_rotary:
            return None
    inputs = DECODE_INPUTS
    group = first_attn.kv_group
    norm_weights = [n.weight for norms, _, _, _ in layers for n in norms]
    weights = [
        t for _, linears, _, _ in layers for lin in linears for t in (lin.qweight, lin.qscales)
    ]
    kinds = [lin.quant_kind for _, linears, _, _ in layers for lin in linears]
    caches = [attn.kv_cache for _, _, attn, _ in layers]
    return torch.ops.minivllm_cpu.decoder_stack(
        hidden, norm_weights, weights, kinds, first_rotary.cos_sin_cache, positions, caches,
        inputs.block_tables[group], inputs.seq_lens, inputs.slots[group], first_attn.num_heads,
        first_norms[0].variance_epsilon, first_attn.scale, first_attn.sliding_window or 0,
    )  # fmt: skip


__all__ = ["LayerParts", "fusable", "fused_decoder_layer", "fused_decoder_stack"]
