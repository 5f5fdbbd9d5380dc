"""Linear layers, including the fused QKV and gate/up projections.

The names follow vLLM's so the model code reads the same; tensor parallelism is
not implemented here (every layer holds the full weight), but the fused layers
already load their checkpoint pieces through shard-aware weight loaders.

A layer handed quantized GGUF blocks (`GGUFWeight`) keeps them until
`process_weights_after_loading`, which stores the weight in a low-bit form
(`quantized_linear`) and drops the float parameter; `quantize_int8` does the same
for a float weight (``quantization="int8_per_channel"``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.model_executor.layers import cpu_gemm
from minivllm.model_executor.layers.gguf_blocks import GGUFWeight
from minivllm.model_executor.layers.quantized_linear import (
    lowbit_linear,
    quantize_parts,
)
from minivllm.model_executor.layers.utils import (
    default_weight_loader,
    make_param,
    set_weight_loader,
)


class LinearBase(nn.Module):
    """``y = x @ W.T (+ b)`` with ``W`` of shape [output_size, input_size]."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.weight = make_param(output_size, input_size)
        set_weight_loader(self.weight, self.weight_loader)
        if bias:
            self.bias: nn.Parameter | None = make_param(output_size)
            set_weight_loader(self.bias, self.weight_loader)
        else:
            self.register_parameter("bias", None)
        self.use_packed_gemm = False
        """Set by `cpu_gemm.pack_linear_weights` once the weight is packed for oneDNN."""
        self.quant_kind = 0
        """0: float weight; else the low-bit form of ``qweight`` (see `quantized_linear`)."""
        self.register_buffer("qweight", None, persistent=False)
        self.register_buffer("qscales", None, persistent=False)
        self._gguf_parts: dict[int | str | None, GGUFWeight | torch.Tensor] = {}

    def weight_loader(
        self,
        param: nn.Parameter,
        loaded: torch.Tensor | GGUFWeight,
        shard_id: int | str | None = None,
    ) -> None:
        """Copy ``loaded`` into ``param``, or into the rows of shard ``shard_id``;
        quantized GGUF blocks for the weight are kept for `process_weights_after_loading`."""
        if param is self.weight and (isinstance(loaded, GGUFWeight) or self._gguf_parts):
            self._gguf_parts[shard_id] = loaded
            return
        assert isinstance(loaded, torch.Tensor)
        rows = None if shard_id is None else self.shard_rows(shard_id)
        if rows is None:
            default_weight_loader(param, loaded)
            return
        offset, size = rows
        default_weight_loader(param.data.narrow(0, offset, size), loaded)

    def shard_rows(self, shard_id: int | str) -> tuple[int, int] | None:
        """``(offset, size)`` of shard ``shard_id`` on the output dim; None: the whole
        weight (a layer that is not fused has no shards)."""
        return None

    def process_weights_after_loading(self, dtype: torch.dtype) -> None:
        """Store kept GGUF blocks in low-bit form (activations in ``dtype``)."""
        if not self._gguf_parts:
            return
        parts = self._gguf_parts
        self._gguf_parts = {}
        order = sorted(parts, key=lambda sid: 0 if sid is None else self.shard_rows(sid)[0])
        pieces = [parts[sid] for sid in order]
        rows = sum(p.shape[0] for p in pieces)
        if rows != self.output_size:
            raise ValueError(
                f"checkpoint gave {rows} rows for a weight of {self.output_size}; "
                "the checkpoint does not match the model config"
            )
        if any(not isinstance(p, GGUFWeight) for p in pieces):
            # A float piece beside quantized ones: expand the rest (rare; the old path).
            for sid in order:
                piece = parts[sid]
                full = piece.dequantize() if isinstance(piece, GGUFWeight) else piece
                self.weight_loader(self.weight, full, sid)
            return
        self.quant_kind, self.qweight, self.qscales = quantize_parts(list(pieces))
        self.weight = None  # type: ignore[assignment]

    def quantize_int8(self) -> None:
        """Replace the float weight by int8 codes with one scale per output row."""
        if self.quant_kind or self.weight is None:
            return
        self.quant_kind, self.qweight, self.qscales = quantize_parts([self.weight.detach()])
        self.weight = None  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant_kind:
            return lowbit_linear(x, self.qweight, self.qscales, self.bias, self.quant_kind)
        if self.use_packed_gemm:
            return cpu_gemm.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        quant = f", int{self.quant_kind}" if self.quant_kind else ""
        return f"in={self.input_size}, out={self.output_size}, bias={self.bias is not None}{quant}"


class ReplicatedLinear(LinearBase):
    """A plain linear layer."""


class ColumnParallelLinear(LinearBase):
    """Linear layer whose output dim would be split under tensor parallelism."""


class RowParallelLinear(LinearBase):
    """Linear layer whose input dim would be split under tensor parallelism."""


class MergedColumnParallelLinear(LinearBase):
    """Several projections of the same input stacked on the output dim (gate + up)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias)

    def shard_rows(self, shard_id: int | str) -> tuple[int, int]:
        assert isinstance(shard_id, int), shard_id
        return sum(self.output_sizes[:shard_id]), self.output_sizes[shard_id]


class QKVParallelLinear(LinearBase):
    """The query, key and value projections stacked on the output dim."""

    def __init__(
        self,
        hidden_size: int,
        head_size: int,
        total_num_heads: int,
        total_num_kv_heads: int | None = None,
        bias: bool = False,
    ) -> None:
        self.head_size = head_size
        self.num_heads = total_num_heads
        self.num_kv_heads = total_num_kv_heads or total_num_heads
        self.q_size = self.num_heads * head_size
        self.kv_size = self.num_kv_heads * head_size
        super().__init__(hidden_size, self.q_size + 2 * self.kv_size, bias)

    def shard_rows(self, shard_id: int | str) -> tuple[int, int]:
        offsets = {
            "q": (0, self.q_size),
            "k": (self.q_size, self.kv_size),
            "v": (self.q_size + self.kv_size, self.kv_size),
        }
        return offsets[str(shard_id)]
