"""A decoder layer of the CPU decode graph as one C++ call, for every family.

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

The C++ layer is one op for every family: what a family's layer computes is
described to it (`LayerParts`: the norm weights in a fixed order and the
``form`` bits), not coded per model:

- `PRE_NORM_SWIGLU` layers (Llama; Qwen2 with its q/k/v biases; Qwen3 with its
  per-head q/k norms) are form 0, plus `QK_NORM` where the layer has q/k norms;
- `SANDWICH_GEGLU` layers (Gemma 3) add `SANDWICH` (norms on the attention and
  MLP outputs), `NORM_PLUS_ONE` (Gemma's norms scale by ``1 + weight``),
  `GELU_TANH` and `SUM_OUTPUT` (the layer returns one stream, not
  ``(out, residual)``);
- biases are given per projection (None: none); each layer brings its own rotary
  table, sliding window and KV cache group, so Gemma 3's local and global layers
  stack together.

Eligible (`fusable`): a layer that declares one of those block forms; float32
activations; minivllm's C++ kernels loaded; the four projections in a native
low-bit form (``Q4``, or ``INT8`` with inputs a multiple of 64) with float32
biases if any; RMSNorm-kind norms of one kind and epsilon; SiLU or tanh-GELU
gating; the rotary table's layout (`RotaryEmbedding`); a float32 or bfloat16 KV
cache.  ``MINIVLLM_CPU_FUSED_LAYERS=0`` fuses nothing.

With LoRA on, a projection may be a LoRA layer (`minivllm.lora.layers.LoRALinear`,
read here by its attributes: this module sits below ``minivllm.lora``): its base
must be native low-bit and its slots float32; the C++ layer adds each row's
adapter delta from the stacked slots and the step's one-hot slot mask, both read
in place at every call (`lora_args`), so adapters loaded into slots after the
trace, and each step's rows, are what the graph computes with.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
from torch import nn

from minivllm import envs
from minivllm.attention.forward_context import DecodeStep, ForwardContextHandle
from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.activation import GeluAndMul, SiluAndMul
from minivllm.model_executor.layers.block_form import PRE_NORM_SWIGLU, SANDWICH_GEGLU
from minivllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNorm
from minivllm.model_executor.layers.quantized_linear import INT8, Q4
from minivllm.model_executor.layers.rotary_embedding import RotaryEmbedding

_CACHE_DTYPES = (torch.float32, torch.bfloat16)

# Bits of the C++ layer's ``form`` (kernels/decode_layer_cpu.cpp names them too).
NORM_PLUS_ONE = 1
"""Every norm scales by ``1 + weight`` (`GemmaRMSNorm`)."""
SANDWICH = 2
"""Norms on the attention output and on the MLP output as well (Gemma 3)."""
QK_NORM = 4
"""A per-head RMSNorm on q and k before the rotary embedding (Qwen3, Gemma 3)."""
GELU_TANH = 8
"""The MLP gates with tanh-approximated GELU (GeGLU) instead of SiLU."""
SUM_OUTPUT = 16
"""The layer's output is one stream (``out + residual``), as Gemma 3's layer
returns it, instead of Llama's ``(out, residual)``."""


class LayerParts(NamedTuple):
    """What the fused C++ layer reads of one fusable layer (`layer_parts`)."""

    norms: tuple[Any, ...]
    """Input norm, pre-MLP norm, then the attention- and MLP-output norms
    (`SANDWICH`), then the q and k norms (`QK_NORM`)."""
    linears: tuple[Any, Any, Any, Any]
    """``(qkv_proj, o_proj, gate_up_proj, down_proj)`` as the layer holds them (a
    LoRA layer or its base)."""
    attn: Any
    """The layer's `Attention` (heads, scale, window, KV cache and group)."""
    rotary: RotaryEmbedding
    form: int
    """The ``form`` bits above."""
    norm_kind: type
    """`RMSNorm` or `GemmaRMSNorm` (all the layer's norms are of one kind)."""
    gating: type
    """The MLP's activation module's type."""


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
    for p in parts:
        for linear in p.linears:
            mine = _lora_tensors(linear)
            counts.append(max(len(mine) - 1, 0))
            tensors += mine
            if mine:
                mask = linear.rows.mask
    return (mask, counts, tensors) if tensors else (None, [], [])


def layer_parts(layer: nn.Module) -> LayerParts:
    """The parts of a `PRE_NORM_SWIGLU` or `SANDWICH_GEGLU` layer the fused C++
    layer reads."""
    attn, mlp = layer.self_attn, layer.mlp
    norms: tuple[Any, ...] = (layer.input_layernorm,)
    form = 0
    if getattr(layer, "block_form", None) == SANDWICH_GEGLU:
        norms += (layer.pre_feedforward_layernorm, layer.post_attention_layernorm,
                  layer.post_feedforward_layernorm)  # fmt: skip
        form |= SANDWICH | SUM_OUTPUT
    else:
        norms += (layer.post_attention_layernorm,)
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if q_norm is not None and k_norm is not None:
        norms += (q_norm, k_norm)
        form |= QK_NORM
    kinds = {type(n) for n in norms}
    norm_kind = kinds.pop() if len(kinds) == 1 else type(None)
    if norm_kind is GemmaRMSNorm:
        form |= NORM_PLUS_ONE
    act = mlp.act_fn
    if type(act) is GeluAndMul and act.approximate == "tanh":
        form |= GELU_TANH
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    return LayerParts(norms, linears, attn.attn, attn.rotary_emb, form, norm_kind, type(act))


def _native_linear(linear: Any) -> bool:
    lora = _lora_tensors(linear)
    if any(t.dtype != torch.float32 for t in lora) or (
        lora and linear.rows.mask.dtype != torch.float32
    ):
        return False
    linear = base_linear(linear)
    kind = getattr(linear, "quant_kind", None)
    if kind not in (Q4, INT8):
        return False
    bias = linear.bias
    if bias is not None and (bias.dtype != torch.float32 or bias.numel() != linear.output_size):
        return False
    return kind == Q4 or linear.input_size % lowbit_cpu.Q8_GROUP == 0


def fusable(layer: nn.Module, dtype: torch.dtype) -> bool:
    """Whether ``layer`` (its KV cache bound) can run as ``minivllm_cpu::decoder_layer``
    on activations of ``dtype``."""
    if not (envs.cpu_fused_layers() and lowbit_cpu.available()) or dtype != torch.float32:
        return False
    form = getattr(layer, "block_form", None)
    if form not in (PRE_NORM_SWIGLU, SANDWICH_GEGLU):
        return False
    qk = (getattr(layer.self_attn, "q_norm", None), getattr(layer.self_attn, "k_norm", None))
    if (qk[0] is None) != (qk[1] is None):
        return False
    parts = layer_parts(layer)
    attn, rotary, cache = parts.attn, parts.rotary, parts.attn.kv_cache
    gating = SiluAndMul if form == PRE_NORM_SWIGLU else GeluAndMul
    return (
        parts.norm_kind in (RMSNorm, GemmaRMSNorm)
        and len({n.variance_epsilon for n in parts.norms}) == 1
        and all(n.weight.dtype == torch.float32 for n in parts.norms)
        and parts.gating is gating
        and (gating is SiluAndMul or parts.form & GELU_TANH)
        and all(_native_linear(lin) for lin in parts.linears)
        and type(rotary) is RotaryEmbedding
        and rotary.head_size == attn.head_size
        and rotary.cos_sin_cache.dtype == torch.float32
        and cache is not None
        and cache.dtype in _CACHE_DTYPES
        and cache.dim() == 5
        and cache.is_contiguous()
    )


def stackable(parts: list[LayerParts]) -> bool:
    """Whether fusable layers share what one ``decoder_stack`` call takes once
    (heads, scale, norm epsilon, form); rotary tables, windows and KV cache groups
    may differ per layer."""

    def shared(p: LayerParts) -> tuple[Any, ...]:
        return (p.attn.num_heads, p.attn.scale, p.norms[0].variance_epsilon, p.form)

    return all(shared(p) == shared(parts[0]) for p in parts)


def _biases(parts: list[LayerParts]) -> list[torch.Tensor | None]:
    """Per projection of ``parts``' layers (4 a layer), its bias or None."""
    return [base_linear(lin).bias for p in parts for lin in p.linears]


def fused_decoder_layer(
    positions: torch.Tensor,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    parts: LayerParts,
    step: DecodeStep,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, residual)`` of one decoder layer (``out`` carries the residual when
    the form has `SUM_OUTPUT`), writing this step's K/V into ``attn.kv_cache``;
    `fusable` must have said yes."""
    attn, group = parts.attn, parts.attn.kv_group
    weights, kinds = _weights([parts])
    return torch.ops.minivllm_cpu.decoder_layer(
        hidden, residual, list(n.weight for n in parts.norms), weights, kinds, _biases([parts]),
        parts.rotary.cos_sin_cache, positions, attn.kv_cache, step.block_tables[group],
        step.seq_lens, step.slots[group], attn.num_heads, parts.norms[0].variance_epsilon,
        attn.scale, attn.sliding_window or 0, parts.form, *lora_args([parts]),
    )  # fmt: skip


def _weights(parts: list[LayerParts]) -> tuple[list[torch.Tensor], list[int]]:
    """The layers' low-bit weights and scales (8 a layer) and kinds (4 a layer)."""
    bases = [base_linear(lin) for p in parts for lin in p.linears]
    return [t for b in bases for t in (b.qweight, b.qscales)], [b.quant_kind for b in bases]


def shared_caches(layers: list[LayerParts]) -> list[int]:
    """Per layer, the index of the first layer whose KV cache tensor it uses.

    Layers of different KV cache groups may share a tensor (Gemma 3's six groups
    share three).  ``decoder_stack`` takes each tensor once: two aliases in its
    list of mutated caches would each be copied back by the traced graph, the last
    copy undoing the other layers' writes.  Computed when the stack is built (not
    traced: it compares data pointers)."""
    first: dict[tuple[Any, ...], int] = {}
    owners = []
    for i, p in enumerate(layers):
        cache = p.attn.kv_cache
        key = (cache.data_ptr(), tuple(cache.shape), cache.stride(), cache.dtype)
        owners.append(first.setdefault(key, i))
    return owners


def _cache_lists(
    layers: list[LayerParts], owners: list[int] | None
) -> tuple[list[torch.Tensor], list[int]]:
    """The distinct KV cache tensors of ``layers`` and each layer's index into them."""
    owners = shared_caches(layers) if owners is None else owners
    distinct = sorted(set(owners))
    return [layers[i].attn.kv_cache for i in distinct], [distinct.index(o) for o in owners]


def bind_decoder_stack(layers: list[LayerParts], owners: list[int]) -> int:
    """Hand the C++ stack what stays the same from step to step (norms, weights,
    biases, rotary tables, KV caches, shapes); its number for
    ``decoder_stack_bound`` (`unbind_decoder_stack` releases it)."""
    first = layers[0]
    weights, kinds = _weights(layers)
    caches, cache_index = _cache_lists(layers, owners)
    return int(
        torch.ops.minivllm_cpu.decoder_stack_bind(
            [n.weight for p in layers for n in p.norms],
            weights,
            kinds,
            _biases(layers),
            [p.rotary.cos_sin_cache for p in layers],
            caches,
            cache_index,
            [p.attn.kv_group for p in layers],
            first.attn.num_heads,
            first.norms[0].variance_epsilon,
            first.attn.scale,
            [p.attn.sliding_window or 0 for p in layers],
            first.form,
        )  # fmt: skip
    )


def unbind_decoder_stack(binding: int) -> None:
    """Release what `bind_decoder_stack` holds (the tensors it kept alive)."""
    if lowbit_cpu.available():
        torch.ops.minivllm_cpu.decoder_stack_unbind(binding)


def fused_decoder_stack(
    positions: torch.Tensor,
    hidden: torch.Tensor,
    layers: list[LayerParts],
    step: DecodeStep,
    owners: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(hidden, residual)`` after all of ``layers`` (each `fusable`, together
    `stackable`), as one ``minivllm_cpu::decoder_stack`` call: one op dispatch a
    step instead of one a layer.  ``owners``: `shared_caches` of the layers
    (computed here when not given)."""
    first = layers[0]
    weights, kinds = _weights(layers)
    caches, cache_index = _cache_lists(layers, owners)
    return torch.ops.minivllm_cpu.decoder_stack(
        hidden, [n.weight for p in layers for n in p.norms], weights, kinds, _biases(layers),
        [p.rotary.cos_sin_cache for p in layers], positions, caches, cache_index,
        step.block_tables, step.seq_lens, step.slots, [p.attn.kv_group for p in layers],
        first.attn.num_heads, first.norms[0].variance_epsilon, first.attn.scale,
        [p.attn.sliding_window or 0 for p in layers], first.form, *lora_args(layers),
    )  # fmt: skip


class FusedDecoderLayer(nn.Module):
    """Stands for one fusable layer: the same forward as one C++ call (a
    `SUM_OUTPUT` layer's call and return as the layer's: one stream)."""

    def __init__(self, layer: nn.Module, handle: ForwardContextHandle) -> None:
        super().__init__()
        self.layer = layer
        self.handle = handle

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None = None
    ) -> Any:
        parts = layer_parts(self.layer)
        step = self.handle.decode_step()
        out = fused_decoder_layer(positions, hidden, residual, parts, step)
        return out[0] if parts.form & SUM_OUTPUT else out


class FusedDecoderStack(nn.Module):
    """Stands for the first of a model's decoder layers and runs all of them, as
    one C++ call; the others' places hold `RunByStack`.

    Without LoRA, what the call takes that never changes is bound to the C++ stack
    once (`bind_decoder_stack`: the weights, norms, rotary tables and KV caches it
    keeps alive until this module is collected), so a step passes only its own
    inputs and the number of the binding, as a buffer (`decoder_stack_bound`): the
    compiled step no longer gathers, checks and boxes every layer's tensors (~480
    graph inputs for a 30-layer model).  With LoRA each call passes everything, the
    adapters' slots and masks included."""

    def __init__(self, layers: list[nn.Module], handle: ForwardContextHandle) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.handle = handle
        parts = [layer_parts(layer) for layer in layers]
        self.owners = shared_caches(parts)
        self.sum_output = bool(parts[0].form & SUM_OUTPUT)
        binding = None
        if not lora_args(parts)[2]:
            number = bind_decoder_stack(parts, self.owners)
            binding = torch.tensor(number)
            weakref.finalize(self, unbind_decoder_stack, number)
        self.binding: torch.Tensor | None
        self.register_buffer("binding", binding, persistent=False)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None = None
    ) -> Any:
        assert residual is None, "the stack starts at the model's first layer"
        step = self.handle.decode_step()
        if self.binding is not None:
            out = torch.ops.minivllm_cpu.decoder_stack_bound(
                hidden, self.binding, positions, step.block_tables, step.seq_lens, step.slots
            )
            return out[0] if self.sum_output else out
        parts = [layer_parts(layer) for layer in self.layers]
        out = fused_decoder_stack(positions, hidden, parts, step, self.owners)
        return out[0] if self.sum_output else out


class RunByStack(nn.Module):
    """Holds the place of a layer that `FusedDecoderStack` already ran: passes the
    stream on unchanged (``(hidden, residual)``, or one stream)."""

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None = None
    ) -> Any:
        return hidden if residual is None else (hidden, residual)


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
    "GELU_TANH",
    "LayerParts",
    "LoRAArgs",
    "NORM_PLUS_ONE",
    "QK_NORM",
    "RunByStack",
    "SANDWICH",
    "SUM_OUTPUT",
    "base_linear",
    "fusable",
    "fused_decoder_layer",
    "fused_decoder_stack",
    "fused_layers",
    "layer_parts",
    "lora_args",
    "shared_caches",
    "stackable",
]
