"""GGUF tensor data -> torch tensors.

Float types are reinterpreted without conversion (F16/BF16 stay half width).
Q8_0, Q4_0 and Q4_1 (the common small-model quants) are dequantized with torch,
which is several times faster than numpy and gives bit-identical float32
results (same operations, same order); every other type goes through
``gguf.quants.dequantize``.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants

_BLOCK = 32


def _scale(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 scale stored at byte ``start`` of each block, as float32 [n, 1]."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Low nibbles are elements 0..15 of a block, high nibbles 16..31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1).float()


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    q = blocks[:, 2:].contiguous().view(torch.int8).float()
    return q * _scale(blocks, 0)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    q = _nibbles(blocks[:, 2:]) - 8.0
    return _scale(blocks, 0) * q


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    return _scale(blocks, 0) * _nibbles(blocks[:, 4:]) + _scale(blocks, 2)


_FAST = {QT.Q8_0: (34, _q8_0), QT.Q4_0: (18, _q4_0), QT.Q4_1: (20, _q4_1)}


def dequantize(data: np.ndarray, qtype: QT | int, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of ``shape`` (row-major, HF order) from raw GGUF tensor data.

    ``data`` is `gguf.ReaderTensor.data`; F32 gives float32, F16 float16, BF16
    bfloat16, everything quantized float32.  Float types share memory with the
    (read-only) file mapping; callers copy them into parameters, never write them.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return _dequantize(data, QT(qtype), shape)


def _dequantize(data: np.ndarray, qtype: QT, shape: tuple[int, ...]) -> torch.Tensor:
    if qtype == QT.F32:
        return torch.from_numpy(np.ascontiguousarray(data).view(np.float32)).reshape(shape)
    if qtype == QT.F16:
        return torch.from_numpy(np.ascontiguousarray(data).view(np.float16)).reshape(shape)
    if qtype == QT.BF16:
        raw = torch.from_numpy(np.ascontiguousarray(data).view(np.int16))
        return raw.view(torch.bfloat16).reshape(shape)
    if qtype in _FAST:
        type_size, fn = _FAST[qtype]
        raw = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8))
        return fn(raw.reshape(-1, type_size)).reshape(shape)
    try:
        out = quants.dequantize(data, qtype)
    except NotImplementedError:
        raise ValueError(
            f"GGUF tensor type {qtype.name} cannot be dequantized by the installed gguf package"
        ) from None
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(shape)
