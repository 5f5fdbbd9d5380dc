"""Linear layers on CPU through oneDNN with weights packed once at load time.

``F.linear`` on CPU hands the weight to the BLAS in its checkpoint layout every
call; oneDNN can instead reorder a weight once into the blocked layout its GEMM
kernels read (for bfloat16 on CPUs with AMX, the tile layout), which makes the
small-batch GEMMs of decoding markedly faster.  `pack_linear_weights` does that
for every linear layer of a loaded model, in every compilation mode, the way
vLLM's CPU backend prepacks weights with oneDNN.

The packed weight is an opaque oneDNN tensor that Dynamo and Inductor cannot take
as a graph input, so the layer calls the custom op ``minivllm::packed_linear``
with its ordinary dense weight; the packed copy rides on that weight tensor as an
attribute (torch keeps a tensor's Python object, attributes included, through
compiled calls), so identical decoder layers still trace to identical graphs, the
copy is freed with its weight, and a weight that was replaced or moved after
packing simply falls back to ``F.linear``.  Set ``MINIVLLM_CPU_PACKED_GEMM=0`` to
turn packing off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm import envs
from minivllm.torch_ops import eager_or_op, register_op

PACK_BATCH_HINT = 32
"""Row count oneDNN tunes the packed layout for (any row count stays correct)."""

PACKED_ATTR = "_minivllm_packed_gemm"
"""Attribute of a dense weight that holds ``(packed copy, data_ptr it was made from)``;
the pointer catches a weight whose data was swapped (``module.to(...)``) after packing."""


def packed_gemm_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether linear weights of ``dtype`` on ``device`` are packed for oneDNN."""
    if not envs.cpu_packed_gemm():
        return False
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.float32:
        return True
    return dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def pack_weight(weight: torch.Tensor) -> None:
    """Attach a packed copy of the dense ``[out, in]`` ``weight`` for `packed_linear`."""
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)
    setattr(weight, PACKED_ATTR, (packed, weight.data_ptr()))


def packed_copy(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy of ``weight``, or None (never packed, or its data changed since)."""
    entry = getattr(weight, PACKED_ATTR, None)
    if entry is None or entry[1] != weight.data_ptr():
        return None
    return entry[0]


def onednn_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` packed by `pack_weight`; any leading dims of ``x``."""
    if x.dim() == 2 and x.is_contiguous():
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


def packed_linear_impl(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ weight.T + bias`` through the packed copy of ``weight`` when there is one."""
    packed = packed_copy(weight)
    if packed is None:
        return F.linear(x, weight, bias)
    return onednn_linear(x, packed, bias)


def _packed_linear_fake(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


packed_linear = register_op("packed_linear", packed_linear_impl, _packed_linear_fake)
"""``minivllm::packed_linear``: `packed_linear_impl` as an op Dynamo and Inductor
treat as opaque (they cannot handle the packed weight itself)."""


linear = eager_or_op(packed_linear, packed_linear_impl)
"""The linear map of a layer whose weight is packed (`packed_linear_impl`)."""


def pack_linear_weights(model: nn.Module, device: torch.device, dtype: torch.dtype) -> int:
    """Pack the weight of every layer of ``model`` that has a ``use_packed_gemm``
    switch; returns the number packed (0 where `packed_gemm_supported` says no)."""
    if not packed_gemm_supported(device, dtype):
        return 0
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "use_packed_gemm") and weight is not None and weight.dtype == dtype:
            pack_weight(weight)
            module.use_packed_gemm = True
            count += 1
    return count


__all__ = [
    "packed_copy",
    "linear",
    "onednn_linear",
    "pack_linear_weights",
    "packed_gemm_supported",
    "packed_linear",
]
