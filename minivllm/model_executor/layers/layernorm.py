"""RMSNorm, optionally fused with the residual add that precedes it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.model_executor.custom_op import CustomOp


@CustomOp.register("rms_norm")
class RMSNorm(CustomOp):
    """Root-mean-square norm over the last dimension, as in Llama/Qwen.

    ``forward(x)`` returns the normed tensor; ``forward(x, residual)`` first adds
    ``residual`` to ``x`` and returns ``(normed, x + residual)`` so a decoder layer
    carries the residual stream without an extra add of its own.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward_native(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        orig_dtype = x.dtype
        # Statistics in float32 like the HF reference, then scale in the input dtype.
        xf = x.to(torch.float32)
        variance = xf.pow(2).mean(dim=-1, keepdim=True)
        out = self.weight * (xf * torch.rsqrt(variance + self.variance_epsilon)).to(orig_dtype)
        return out if residual is None else (out, residual)

    def forward_optimized(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            x = x + residual
            residual = x
        if x.dtype == torch.float32:
            out = F.rms_norm(x, (self.hidden_size,), self.weight, self.variance_epsilon)
        else:
            # F.rms_norm on half types would accumulate in the half type on some
            # builds; normalise in float32 and apply the weight in the input dtype.
            normed = F.rms_norm(x.float(), (self.hidden_size,), None, self.variance_epsilon)
            out = self.weight * normed.to(x.dtype)
        return out if residual is None else (out, residual)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.variance_epsilon}, {super().extra_repr()}"


@CustomOp.register("gemma_rms_norm")
class GemmaRMSNorm(CustomOp):
    """Gemma's RMSNorm: scales by ``1 + weight`` (the stored weight is an offset from
    one) and does the whole computation in float32 before casting back, as HF does."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.variance_epsilon)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)

    def forward_optimized(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (self.hidden_size,), None, self.variance_epsilon)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.variance_epsilon}, {super().extra_repr()}"
