"""Helpers of the fused decoder layer tests: low-bit weights set by hand, a
decode step's forward context, and a layer run with its attention inlined as the
decode graph's copy of the model runs it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants

from minivllm.attention.decode_graph import DecodeAttention
from minivllm.attention.forward_context import DecodeStep, ForwardContext, ForwardContextHandle
from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.gguf_blocks import q8_0_split
from minivllm.model_executor.layers.quantized_linear import INT8, Q4


def set_q4(linear: torch.nn.Module, gen: torch.Generator) -> None:
    """Give ``linear`` random int4 weights in the tiled layout (``Q4``)."""
    n, k = linear.output_size, linear.input_size
    q = torch.randint(0, 16, (n, k), generator=gen)
    scale = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().float()
    mins = (-torch.rand(n, k // 32, generator=gen) * 0.15).half().float()
    codes, scale_min = lowbit_cpu.pack_q4(q, scale, mins)
    linear.quant_kind, linear.weight = Q4, None
    linear.qweight, linear.qscales = codes.view(n, k // 2), scale_min.view(n, -1)


def set_q4_stacked(linear: torch.nn.Module, gen: torch.Generator) -> None:
    """Give ``linear`` random int4 weights stacked from two scale forms (the first 16
    rows offset, as Q4_0; the rest pair, as Q4_1): one ``Q4`` weight of two segments."""
    n, k = linear.output_size, linear.input_size
    q = torch.randint(0, 16, (n, k), generator=gen)
    d = (torch.rand(16, k // 32, generator=gen) * 0.02 + 1e-3).half()
    scale = (torch.rand(n - 16, k // 32, generator=gen) * 0.02 + 1e-3).half().float()
    mins = (-torch.rand(n - 16, k // 32, generator=gen) * 0.15).half().float()
    first = lowbit_cpu.pack_q4_offset(q[:16], d, five=False)
    rest = lowbit_cpu.pack_q4(q[16:], scale, mins)
    linear.quant_kind, linear.weight = Q4, None
    linear.qweight, linear.qscales = lowbit_cpu.pack_q4_stack([first, rest], k)


def set_q8_0(linear: torch.nn.Module, gen: torch.Generator) -> None:
    """Give ``linear`` random Q8_0 weights as minivllm's kernels hold them: the
    file's int8 codes with a float16 scale per 32 inputs (``INT8``, grouped)."""
    n, k = linear.output_size, linear.input_size
    dense = torch.randn(n, k, generator=gen) * 0.05
    blocks = torch.from_numpy(quants.quantize(dense.numpy(), QT.Q8_0))
    linear.qweight, linear.qscales = q8_0_split(blocks, k)
    linear.quant_kind, linear.weight = INT8, None


class StepHandle:
    """A `ForwardContextHandle` lent ``step`` inside the block, as the decode graph's
    compiled call lends it."""

    def __init__(self, step: DecodeStep) -> None:
        self.handle = ForwardContextHandle()
        self.step = step

    def __enter__(self) -> ForwardContextHandle:
        self.handle.context = ForwardContext(None, decode_step=self.step)
        return self.handle

    def __exit__(self, *exc: object) -> None:
        self.handle.context = None


def with_decode_attention(layer: Any, handle: ForwardContextHandle) -> Callable[..., Any]:
    """``layer`` with its attention inlined (`DecodeAttention`), restored after the call."""
    attn = layer.self_attn

    def run(*args: Any) -> Any:
        original = attn.attn
        attn.attn = DecodeAttention(original, handle, native=True)
        try:
            return layer(*args)
        finally:
            attn.attn = original

    return run
