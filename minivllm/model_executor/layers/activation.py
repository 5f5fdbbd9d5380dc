"""Gated activations of the MLP block."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.model_executor.custom_op import CustomOp


@CustomOp.register("silu_and_mul")
class SiluAndMul(CustomOp):
    """``silu(x[..., :d]) * x[..., d:]`` for an input of width ``2 * d``.

    The gate and up projections are one fused matmul, so the activation splits
    its input in halves.
    """

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]

    def forward_optimized(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        # silu's output is a fresh tensor, so multiplying into it saves one allocation.
        return F.silu(gate).mul_(up)


@CustomOp.register("gelu_and_mul")
class GeluAndMul(CustomOp):
    """``gelu(x[..., :d]) * x[..., d:]`` (GeGLU); ``approximate="tanh"`` for Gemma's
    ``gelu_pytorch_tanh``."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]

    def forward_optimized(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate).mul_(up)
