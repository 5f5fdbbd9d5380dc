"""A Llama-style decoder layer of the CPU decode graph as one C++ call.

At batch 1 on a small CPU, a decode step of a GGUF model spends as much time
around its low-bit GEMMs as in them: an op dispatch per GEMM, Inductor's loops
for the norms, rotary embedding, KV write and activation, and a wake-up of the
thread pool whenever its threads went idle between two calls.  The decode graph
(`minivllm.model_executor.decode_view`) therefore applies `fused_layers` to the
model's decoder layers before it traces them: an eligible layer becomes one
``minivllm_cpu::decoder_layer`` call (``minivllm/kernels/decode_layer_cpu.cpp``,
`FusedDecoderLayer`) that runs the same computation with the same kernels back
to back, and a model whose layers all are (sharing one KV cache group, window and
rotary table) one ``minivllm_cpu::decoder_stack`` call a step
(`FusedDecoderStack`).  The model's own forward never changes.

Eligible (`fusable`): a layer that declares `PRE_NORM_SWIGLU`; float32
activations; minivllm's C++ kernels loaded; the four projections in a native
low-bit form (``Q4``, or ``INT8`` with inputs a multiple of 64) without biases;
no q/k norm; the rotary table's layout (`RotaryEmbedding`); a float32 or
bfloat16 KV cache.  ``MINIVLLM_CPU_FUSED_LAYERS=0`` fuses nothing.

With LoRA on, a projection may be a LoRA layer (`minivllm.lora.layers.LoRALinear`,
read here by its attributes: this module sits below ``minivllm.lora``): its base
must be native low-bit and its slots float32; the C++ layer adds each row's
adapter delta from the stacked slots and the step's one-hot slot mask, both read
in place at every call (`lora_args`), so adapters loaded into slots after the
trace, and each step's rows, are what the graph computes with.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from minivllm import envs
from minivllm.attention.forward_context import DecodeStep, ForwardContextHandle
from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.activation import SiluAndMul
from minivllm.model_executor.layers.block_form import PRE_NORM_SWIGLU
from minivllm.model_executor.layers.layernorm import RMSNorm
from minivllm.model_executor.layers.quantized_linear import INT8, Q4
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding

_CACHE_DTYPES = (torch.float32, torch.bfloat16)

LayerParts = tuple[tuple[RMSNorm, RMSNorm], tuple[Any, Any, Any, Any], Any, RotaryEmbedding]
"""``(norms, linears, attn, rotary)`` of one fusable layer, as `fused_decoder_layer`
takes them; ``linears`` are ``(qkv_proj, o_proj, gate_up_proj, down_proj)`` as the
layer holds them (a LoRA layer or its base)."""

LoRAArgs = tuple[torch.Tensor | None, list[int], list[torch.Tensor]]
"""The C++ layer's LoRA inputs: the one-hot slot mask (None: no LoRA), per
projection its slice count (0: no LoRA), and per adapted projection its stacked A
then one B per slice."""


def base_linear(linear: Any) -> Any:
    """The projection that holds the low-bit weight: ``linear`` itself, or the base
    a LoRA layer wraps."""
    return getattr(linear, "base", linear)


def _lora_tensors(linear: Any) -> list[torch.Tensor]:
    """A LoRA layer's stacked slots (A of all slices, then each slice's B), as the
    LoRA layer keeps them; empty for a plain projection."""
    a = getattr(linear, "lora_a", None)
    if a is None:
        return []
    return [a, *(getattr(linear, f"lora_b{i}") for i in range(len(linear.slices)))]


def lora_args(parts: list[LayerParts]) -> LoRAArgs:
    """The LoRA inputs of ``parts``' layers for ``decoder_layer`` / ``decoder_stack``
    (4 counts per layer); no LoRA layer: ``(None, [], [])``."""
    mask, counts, tensors = None, [], []
    for _, linears, _, _ in parts:
        for linear in linears:
            mine = _lora_tensors(linear)
            counts.append(max(len(mine) - 1, 0))
            tensors += mine
            if mine:
                mask = linear.rows.mask
    return (mask, counts, tensors) if tensors else (None, [], [])


def layer_parts(layer: nn.Module) -> LayerParts:
    """The parts of a `PRE_NORM_SWIGLU` layer the fused C++ layer reads."""
    attn, mlp = layer.self_attn, layer.mlp
    norms = (layer.input_layernorm, layer.post_attention_layernorm)
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    return norms, linears, attn.attn, attn.rotary_emb  # type: ignore[return-value]


def _native_linear(linear: Any) -> bool:
    lora = _lora_tensors(linear)
    if any(t.dtype != torch.float32 for t in lora) or (
        lora and linear.rows.mask.dtype != torch.float32
    ):
        return False
    linear = base_linear(linear)
    kind = getattr(linear, "quant_kind", None)
    if linear.bias is not None or kind not in (Q4, INT8):
        return False
    return kind == Q4 or linear.input_size % lowbit_cpu.Q8_GROUP == 0


def fusable(layer: nn.Module, dtype: torch.dtype) -> bool:
    """Whether ``layer`` (its KV cache bound) can run as ``minivllm_cpu::decoder_layer``
    on activations of ``dtype``."""
    if not (envs.cpu_fused_layers() and lowbit_cpu.available()) or dtype != torch.float32:
        return False
    if getattr(layer, "block_form", None) != PRE_NORM_SWIGLU:
        return False
    if getattr(layer.self_attn, "q_norm", None) is not None:
        return False
    norms, linears, attn, rotary = layer_parts(layer)
    cache = attn.kv_cache
    return (
        all(type(n) is RMSNorm for n in norms)
        and norms[0].variance_epsilon == norms[1].variance_epsilon
        and type(layer.mlp.act_fn) is SiluAndMul
        and all(_native_linear(lin) for lin in linears)
        and type(rotary) is RotaryEmbedding
        and rotary.head_size == attn.head_size
        and rotary.cos_sin_cache.dtype == torch.float32
        and cache is not None
        and cache.dtype in _CACHE_DTYPES
    )


def stackable(parts: list[LayerParts]) -> bool:
    """Whether fusable layers share what one ``decoder_stack`` call takes once (KV
    cache group, sliding window, heads, scale, norm epsilon, rotary table)."""

    def shared(p: LayerParts) -> tuple[Any, ...]:
        norms, _, attn, _ = p
        return (attn.kv_group, attn.sliding_window, attn.num_heads, attn.scale,
                norms[0].variance_epsilon)  # fmt: skip

    first = parts[0]
    return all(shared(p) == shared(first) and p[3] is first[3] for p in parts)


def fused_decoder_layer(
    positions: torch.Tensor,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    parts: LayerParts,
    step: DecodeStep,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mlp_out, residual)`` of a pre-norm decoder layer (input norm, fused QKV,
    rotary, paged attention, output projection, post-attention norm, SwiGLU MLP),
    writing this step's K/V into ``attn.kv_cache``; `fusable` must have said yes."""
    norms, linears, attn, rotary = parts
    group = attn.kv_group
    weights, kinds = _weights([parts])
    return torch.ops.minivllm_cpu.decoder_layer(
        hidden, residual, norms[0].weight, norms[1].weight, weights, kinds,
        rotary.cos_sin_cache, positions, attn.kv_cache, step.block_tables[group],
        step.seq_lens, step.slots[group], attn.num_heads, norms[0].variance_epsilon,
        attn.scale, attn.sliding_window or 0, *lora_args([parts]),
    )  # fmt: skip


def _weights(parts: list[LayerParts]) -> tuple[list[torch.Tensor], list[int]]:
    """The layers' low-bit weights and scales (8 a layer) and kinds (4 a layer)."""
    bases = [base_linear(lin) for _, linears, _, _ in parts for lin in linears]
    return [t for b in bases for t in (b.qweight, b.qscales)], [b.quant_kind for b in bases]


def fused_decoder_stack(
    positions: torch.Tensor, hidden: torch.Tensor, layers: list[LayerParts], step: DecodeStep
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden, residual)`` after all of ``layers`` (each `fusable`, together
    `stackable`), as one ``minivllm_cpu::decoder_stack`` call: one op dispatch a
    step instead of one a layer."""
    first_norms, _, first_attn, first_rotary = layers[0]
    group = first_attn.kv_group
    norm_weights = [n.weight for norms, _, _, _ in layers for n in norms]
    weights, kinds = _weights(layers)
    caches = [attn.kv_cache for _, _, attn, _ in layers]
    return torch.ops.minivllm_cpu.decoder_stack(
        hidden, norm_weights, weights, kinds, first_rotary.cos_sin_cache, positions, caches,
        step.block_tables[group], step.seq_lens, step.slots[group], first_attn.num_heads,
        first_norms[0].variance_epsilon, first_attn.scale, first_attn.sliding_window or 0,
        *lora_args(layers),
    )  # fmt: skip


class FusedDecoderLayer(nn.Module):
    """Stands for one fusable layer: the same forward as one C++ call."""

    def __init__(self, layer: nn.Module, handle: ForwardContextHandle) -> None:
        super().__init__()
        self.layer = layer
        self.handle = handle

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        step = self.handle.decode_step()
        return fused_decoder_layer(positions, hidden, residual, layer_parts(self.layer), step)


class FusedDecoderStack(nn.Module):
    """Stands for the first of a model's decoder layers and runs all of them, as
    one C++ call; the others' places hold `RunByStack`."""

    def __init__(self, layers: list[nn.Module], handle: ForwardContextHandle) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.handle = handle

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert residual is None, "the stack starts at the model's first layer"
        parts = [layer_parts(layer) for layer in self.layers]
        return fused_decoder_stack(positions, hidden, parts, self.handle.decode_step())


class RunByStack(nn.Module):
    """Holds the place of a layer that `FusedDecoderStack` already ran: passes the
    residual stream on unchanged."""

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return hidden, residual


FUSED_TYPES = (FusedDecoderLayer, FusedDecoderStack, RunByStack)
"""The stand-ins `fused_layers` makes (no layer boundary follows them)."""


def fused_layers(
    layers: list[nn.Module], dtype: torch.dtype, handle: ForwardContextHandle
) -> list[nn.Module | None]:
    """Per decoder layer, its fused stand-in or None (it keeps its own ops): all of
    them one `FusedDecoderStack` when every layer is `fusable` and they are
    `stackable`, else a `FusedDecoderLayer` per fusable layer.  ``layers`` are not
    changed; the caller puts the stand-ins in its copy of the model."""
    can = [fusable(layer, dtype) for layer in layers]
    if layers and all(can) and stackable([layer_parts(layer) for layer in layers]):
        return [FusedDecoderStack(layers, handle)] + [RunByStack() for _ in layers[1:]]
    return [
        FusedDecoderLayer(layer, handle) if ok else None
        for layer, ok in zip(layers, can, strict=True)
    ]


__all__ = [
    "FUSED_TYPES",
    "FusedDecoderLayer",
    "FusedDecoderStack",
    "LayerParts",
    "LoRAArgs",
    "RunByStack",
    "base_linear",
    "fusable",
    "fused_decoder_layer",
    "fused_decoder_stack",
    "fused_layers",
    "layer_parts",
    "lora_args",
    "stackable",
]
