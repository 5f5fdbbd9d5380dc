"""The CPU decode graph's copy of a model: the transforms applied before tracing.

The model's code knows nothing of the decode graph (`minivllm.worker.decode_graph`).
What the graph runs differently is applied from outside, the way weight packing
is (`minivllm.model_executor.layers.cpu_gemm.pack_linear_weights`): `decode_view`
returns a copy of the model's module tree (module objects only: parameters,
buffers and KV caches are the model's own) in which

- each `Attention` is a `DecodeAttention` (attention inlined as torch ops or
  minivllm's C++ decode attention, reading the step's inputs from the forward
  context the call was given);
- decoder layers that can run fused are minivllm's fused C++ layers
  (`minivllm.model_executor.layers.fused_decoder_layer.fused_layers`);
- each ``Q4`` linear layer calls the int4 kernel directly (`Q4KernelLinear`), also
  as the base of a LoRA layer: LoRA layers (`minivllm.lora.layers.LoRALinear`) that
  do not run fused are copied like any module, sharing their adapter slots and the
  step's slot mask with the model (read in place by the graph at every step);
- after every `LAYERS_PER_PIECE`-th decoder layer that is not fused, a
  ``minivllm::decode_layer_boundary`` mark splits the graph (`LayerBoundary`).

The model itself keeps serving every other step (prefill chunks, the piecewise
forward) unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from minivllm.attention.decode_graph import DecodeAttention
from minivllm.attention.forward_context import ForwardContext, ForwardContextHandle
from minivllm.attention.layer import Attention
from minivllm.model_executor.layers.fused_decoder_layer import FUSED_TYPES, fused_layers
from minivllm.model_executor.layers.linear import LinearBase
from minivllm.model_executor.layers.quantized_linear import Q4, q4_kernel_linear
from minivllm.torch_ops import register_op

LAYERS_PER_PIECE = 5
"""Decoder layers per compiled piece of the decode graph.  Each piece call costs
~0.1 ms of Python (the split graph, AOTAutograd's and Inductor's wrappers) at
any batch, so fewer pieces make a faster step; pieces of the same layers are the
same graph and compile once, but a larger piece compiles longer.  Measured on
the default model (30 layers, ``benchmarks/decode_graph.py``): see the README."""


def _boundary_impl(hidden: torch.Tensor) -> torch.Tensor:
    return hidden.clone()


def _boundary_fake(hidden: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(hidden)


LAYER_BOUNDARY_OP = "minivllm::decode_layer_boundary"
"""Where the decode graph is split: one compiled piece per `LAYERS_PER_PIECE` layers."""

_layer_boundary = register_op("decode_layer_boundary", _boundary_impl, _boundary_fake)


class LayerBoundary(nn.Module):
    """A decoder layer followed by a ``minivllm::decode_layer_boundary`` mark on its
    hidden states (a copy, ~1 us).

    The decode graph is split at these marks, so its pieces are runs of decoder
    layers: the middle ones are the same graph with other weights and compile
    once, where a single whole-model graph takes Inductor minutes to compile.  A
    fused layer gets no mark: there is nothing for Inductor to compile in it, so a
    model whose layers all fuse is one piece, and its step one piece call."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, *args: Any) -> Any:
        out = self.layer(*args)
        if isinstance(out, tuple):  # (hidden, residual)
            return (_layer_boundary(out[0]), *out[1:])
        return _layer_boundary(out)


class Q4KernelLinear(nn.Module):
    """A ``Q4`` linear layer as one ``minivllm_cpu::q4_gemm`` call: the decode graph
    never has more rows than that kernel takes (`q4_kernel_linear`)."""

    def __init__(self, linear: LinearBase) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lin = self.linear
        return q4_kernel_linear(x, lin.qweight, lin.qscales, lin.bias)


class DecodeView(nn.Module):
    """The decode graph's copy of a model; ``forward`` takes the step's forward
    context and lends it to the modules (`ForwardContextHandle`) for the call."""

    def __init__(self, model: nn.Module, handle: ForwardContextHandle) -> None:
        super().__init__()
        self.model = model
        self.handle = handle

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        self.handle.context = ctx
        try:
            return self.model(input_ids, positions)
        finally:
            self.handle.context = None


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a model laid out as HF's are (``model.model.layers``);
    empty when there is no such list."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return list(layers) if isinstance(layers, nn.ModuleList) else []


def _copy_tree(
    module: nn.Module, stand_in: Callable[[nn.Module], nn.Module | None], memo: dict[int, Any]
) -> nn.Module:
    """A copy of ``module``'s tree sharing its tensors, with ``stand_in(m)`` where it
    gives one (not descended into); a module met twice is copied once."""
    if id(module) in memo:
        return memo[id(module)]
    new = stand_in(module)
    if new is None:
        new = copy.copy(module)
        new._parameters = dict(module._parameters)
        new._buffers = dict(module._buffers)
        new._modules = {
            name: None if child is None else _copy_tree(child, stand_in, memo)
            for name, child in module._modules.items()
        }
    memo[id(module)] = new
    return new


def decode_view(
    model: nn.Module, dtype: torch.dtype, native_attention: bool
) -> tuple[DecodeView, int]:
    """The decode graph's copy of ``model`` (KV caches bound; activations of
    ``dtype``; ``native_attention``: minivllm's C++ kernels are loaded) and how many
    decoder layers in it run fused."""
    handle = ForwardContextHandle()
    layers = decoder_layers(model)
    fused = fused_layers(layers, dtype, handle)
    stand_ins = {id(layer): f for layer, f in zip(layers, fused, strict=True) if f is not None}

    def stand_in(m: nn.Module) -> nn.Module | None:
        if id(m) in stand_ins:
            return stand_ins[id(m)]
        if isinstance(m, Attention):
            return DecodeAttention(m, handle, native_attention)
        if isinstance(m, LinearBase) and m.quant_kind == Q4:
            return Q4KernelLinear(m)
        return None

    copied = _copy_tree(model, stand_in, {})
    view_layers = copied.model.layers if layers else []
    for i, layer in enumerate(view_layers):
        if (i + 1) % LAYERS_PER_PIECE == 0 and not isinstance(layer, FUSED_TYPES):
            view_layers[i] = LayerBoundary(layer)
    return DecodeView(copied, handle), len(stand_ins)


__all__ = [
    "LAYERS_PER_PIECE",
    "LAYER_BOUNDARY_OP",
    "DecodeView",
    "LayerBoundary",
    "Q4KernelLinear",
    "decode_view",
    "decoder_layers",
]
