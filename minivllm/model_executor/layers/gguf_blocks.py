"""GGUF block formats read with torch, for weights kept quantized in memory.

A GGUF weight of shape ``[rows, cols]`` is stored row by row as blocks of
``block_size`` elements (`GGUFWeight` holds them as ``uint8 [rows, row_bytes]``).
The 4-bit formats (Q4_0, Q4_1, Q4_K) are all *group-affine*: in each group of 32
elements of a row, ``w = q * scale + min`` with ``q`` in 0..15.  `int4_affine`
returns ``(q, scale, min)`` for them, which is exactly what torch's int4 CPU GEMM
takes (after its own packing), so those weights are computed on as they are.
The 5-bit formats (Q5_0, Q5_1, Q5_K) are the same with ``q`` in 0..31
(`int5_affine`), which minivllm's own kernels compute on as a fifth bit plane.

`dequantize_rows` turns raw rows back into floats; it gives exactly the values of
``gguf.quants.dequantize`` (tested per type).  `gather_rows` picks rows of a table
and expands them, in one C++ pass where minivllm's kernels are built (the embedding
lookup and the LM head's exact top logits, every decode step).
Q8_0 (int8 codes with a float16 scale per 32) is split once into its codes and
scales (`GGUFWeight.q8_0_parts`), which the int8 kernels, the embedding lookup and
the LM head's exact top logits all read: the file's bytes, held once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as QT

from minivllm.kernels import lowbit_cpu

INT4_TYPES = (QT.Q4_0, QT.Q4_1, QT.Q4_K)
"""Types whose values are int4 codes with one scale and min per 32 elements."""

INT5_TYPES = (QT.Q5_0, QT.Q5_1, QT.Q5_K)
"""Types whose values are 5-bit codes (0..31) with one scale and min per 32 elements."""

FLOAT_TYPES = (QT.F32, QT.F16, QT.BF16)

NATIVE_ROW_TYPES = frozenset((*FLOAT_TYPES, *INT4_TYPES, *INT5_TYPES, QT.Q8_0, QT.Q6_K))
"""Types whose rows ``minivllm_cpu::gguf_rows`` expands (`gather_rows`)."""


@dataclass
class GGUFWeight:
    """A quantized GGUF tensor as read from the file: raw blocks, not yet expanded.

    The GGUF loader yields these (instead of float tensors) for 2-D quantized
    weights when the model runs quantized; the layers' weight loaders keep them.
    """

    data: torch.Tensor
    """``uint8 [rows, row_bytes]``: each row's blocks, in file order."""
    qtype: QT
    """The GGUF tensor type."""
    shape: tuple[int, int]
    """``(rows, cols)`` of the weight it encodes (HF order)."""
    origin: tuple[str, int] | None = field(default=None, repr=False, compare=False)
    """``(file path, byte offset of row 0)`` where ``data`` lies as it is in the file,
    or None when the rows were re-laid (`stored` then keeps ``data`` itself)."""
    _q8_0: tuple[torch.Tensor, torch.Tensor] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    _stored: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def stored(self) -> torch.Tensor:
        """The blocks to keep after loading: a mapping of their own range of the file
        (read on demand, as the file's pages; resident only where a lookup touched
        them), or ``data`` itself when the rows are not the file's as laid out.

        The load reads every page of the file through its own mapping to convert the
        weights; a table kept for lookups (the embedding, an LM head's exact top
        logits) gets a fresh one, so the pages that conversion touched are not held
        resident by this process once the load's mapping is gone."""
        if self.origin is None:
            return self.data
        if self._stored is None:  # once: a tied embedding and head share the mapping
            path, offset = self.origin
            shape = tuple(self.data.shape)
            mapped = np.memmap(path, dtype=np.uint8, mode="c", offset=offset, shape=shape)
            self._stored = torch.from_numpy(mapped.view(np.ndarray))
        return self._stored

    def q8_0_parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A Q8_0 weight's codes ``int8 [rows, cols]`` and scales ``float16
        [rows, cols / 32]``, split from the blocks once: every caller (a tied
        embedding and LM head) gets the same two tensors."""
        if self.qtype != QT.Q8_0:
            raise ValueError(f"q8_0_parts needs a Q8_0 weight, not {self.qtype.name}")
        if self._q8_0 is None:
            self._q8_0 = q8_0_split(self.data, self.shape[1])
        return self._q8_0

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    def dequantize(self) -> torch.Tensor:
        """All rows as float32 (what the dequantizing loader would have produced)."""
        return dequantize_rows(self.data, self.qtype, self.shape[1])

    def narrow_rows(self, start: int, length: int) -> GGUFWeight:
        origin = None
        if self.origin is not None:
            origin = (self.origin[0], self.origin[1] + start * self.data.shape[1])
        data = self.data[start : start + length]
        return GGUFWeight(data, self.qtype, (length, self.shape[1]), origin)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 stored at byte ``start`` of each block, as float32 ``[n, 1]``."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _low_high(qs: torch.Tensor) -> torch.Tensor:
    """Nibbles of ``qs [n, 16]``: low nibbles are elements 0..15, high ones 16..31."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _q4_k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins of each Q4_K super-block (12 packed bytes)."""
    p = packed.reshape(-1, 3, 4)
    # Bytes 0-3 hold scales 0-3 in their low 6 bits and the top 2 bits of scales 4-7;
    # bytes 4-7 the same for the mins; bytes 8-11 the low 4 bits of scales and mins 4-7.
    scales_0_3, mins_0_3, nibbles_4_7 = p[:, 0], p[:, 1], p[:, 2]
    sc = torch.cat([scales_0_3 & 0x3F, (nibbles_4_7 & 0x0F) | ((scales_0_3 >> 2) & 0x30)], dim=1)
    mn = torch.cat([mins_0_3 & 0x3F, (nibbles_4_7 >> 4) | ((mins_0_3 >> 2) & 0x30)], dim=1)
    return sc, mn


def int4_affine(
    data: torch.Tensor, qtype: QT, cols: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q uint8 [rows, cols], scale f32 [rows, cols/32], min f32 [rows, cols/32])``
    with ``w = q * scale + min`` for a Q4_0, Q4_1 or Q4_K weight."""
    rows = data.shape[0]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = data.reshape(-1, type_size)
    if qtype in (QT.Q4_0, QT.Q4_1):
        d = _f16(blocks, 0)
        q = _low_high(blocks[:, 2:] if qtype == QT.Q4_0 else blocks[:, 4:])
        mn = d * -8.0 if qtype == QT.Q4_0 else _f16(blocks, 2)
        scale = d
    elif qtype == QT.Q4_K:
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        sc, m = _q4_k_scale_min(blocks[:, 4:16])
        scale = d * sc.float()
        mn = -(dmin * m.float())
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32)
        q = torch.cat([qs & 0x0F, qs >> 4], dim=2)
    else:
        raise ValueError(f"{qtype.name} is not a 4-bit group-affine GGUF type")
    groups = cols // 32
    return (
        q.reshape(rows, cols),
        scale.reshape(rows, groups),
        mn.reshape(rows, groups),
    )


def k_quant_scales(
    data: torch.Tensor, qtype: QT
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_K or Q5_K weight's own scales, as stored: ``(d, dmin)`` float16
    ``[rows, cols / 256]`` and the 6-bit ``(sc, m)`` uint8 ``[rows, cols / 32]``, with
    ``w = d * sc * q - dmin * m`` (`int4_affine` / `int5_affine` give the products)."""
    if qtype not in (QT.Q4_K, QT.Q5_K):
        raise ValueError(f"{qtype.name} has no super-block scales")
    rows = data.shape[0]
    blocks = data.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    d = blocks[:, 0:2].contiguous().view(torch.float16).reshape(rows, -1)
    dmin = blocks[:, 2:4].contiguous().view(torch.float16).reshape(rows, -1)
    sc, m = _q4_k_scale_min(blocks[:, 4:16])
    return d, dmin, sc.reshape(rows, -1), m.reshape(rows, -1)


def zero_point_scales(data: torch.Tensor, qtype: QT) -> torch.Tensor:
    """A Q4_0 or Q5_0 weight's float16 ``d`` per 32, as stored ``[rows, cols / 32]``
    (``w = (q - 8) d`` or ``(q - 16) d``)."""
    if qtype not in (QT.Q4_0, QT.Q5_0):
        raise ValueError(f"{qtype.name} is not a zero-point type")
    rows = data.shape[0]
    blocks = data.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    return blocks[:, 0:2].contiguous().view(torch.float16).reshape(rows, -1)


def q6_k_parts(data: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q6_K weight as stored: codes ``q`` uint8 ``[rows, cols]`` in 0..63, float16
    ``d`` ``[rows, cols / 256]`` and int8 ``sc`` ``[rows, cols / 16]``, with
    ``w = d * sc * (q - 32)`` (sc per 16 elements in order)."""
    rows = data.shape[0]
    blocks = data.reshape(-1, GGML_QUANT_SIZES[QT.Q6_K][1])
    # 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales, a float16 d.  In
    # each half of 128 elements, low byte l holds elements l (low nibble) and l + 64
    # (high), byte l + 32 elements l + 32 and l + 96; high byte l their top two bits
    # at bits 0, 2, 4 and 6 (elements l, l + 32, l + 64, l + 96).
    ql = blocks[:, :128].reshape(-1, 2, 2, 32)
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)
    low = torch.cat([ql & 0x0F, ql >> 4], dim=2)  # [n, half, quarter, 32]
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).view(1, 1, 4, 1)
    q = low | (((qh >> shifts) & 3) << 4)
    sc = blocks[:, 192:208].contiguous().view(torch.int8)
    d = blocks[:, 208:210].contiguous().view(torch.float16)
    return q.reshape(rows, cols), d.reshape(rows, -1), sc.reshape(rows, -1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Bits 0..31 of each block's little-endian ``uint8 [n, 4]`` word as ``[n, 32]``."""
    shifts = torch.arange(8, dtype=torch.uint8)
    return ((qh[:, :, None] >> shifts) & 1).reshape(-1, 32)


def int5_affine(
    data: torch.Tensor, qtype: QT, cols: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q uint8 [rows, cols] in 0..31, scale, min f32 [rows, cols/32])`` with
    ``w = q * scale + min`` for a Q5_0, Q5_1 or Q5_K weight."""
    rows = data.shape[0]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = data.reshape(-1, type_size)
    if qtype in (QT.Q5_0, QT.Q5_1):
        # d (f16), [m (f16)], qh (32 fifth bits), 16 bytes of nibbles (elements j, 16 + j).
        head = 2 if qtype == QT.Q5_0 else 4
        scale = _f16(blocks, 0)
        mn = scale * -16.0 if qtype == QT.Q5_0 else _f16(blocks, 2)
        q = _low_high(blocks[:, head + 4 :]) | (_fifth_bits(blocks[:, head : head + 4]) << 4)
    elif qtype == QT.Q5_K:
        # d, dmin (f16), 12 bytes of 6-bit scales and mins (as Q4_K), 32 bytes of fifth
        # bits, 128 bytes of nibbles: chunk c of 64 elements is bytes 32 c .. 32 c + 31,
        # low nibbles first; byte l of the bits holds element 64 c + l's at bit 2 c and
        # element 64 c + 32 + l's at bit 2 c + 1.
        d, dmin = _f16(blocks, 0), _f16(blocks, 2)
        sc, m = _q4_k_scale_min(blocks[:, 4:16])
        scale = d * sc.float()
        mn = -(dmin * m.float())
        qh = blocks[:, 16:48]
        qs = blocks[:, 48:].reshape(-1, 4, 1, 32)
        low = torch.cat([qs & 0x0F, qs >> 4], dim=2)  # [n, chunk, half, 32]
        shifts = torch.arange(8, dtype=torch.uint8).view(4, 2, 1)
        high = (qh[:, None, None, :] >> shifts) & 1
        q = low | (high << 4)
    else:
        raise ValueError(f"{qtype.name} is not a 5-bit group-affine GGUF type")
    groups = cols // 32
    return q.reshape(rows, cols), scale.reshape(rows, groups), mn.reshape(rows, groups)


def q8_0_split(data: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 rows ``uint8 [rows, row_bytes]`` as their int8 codes ``[rows, cols]`` and
    float16 scales ``[rows, cols / 32]`` (each block: a float16, then 32 codes)."""
    rows = data.shape[0]
    blocks = data.reshape(rows, cols // 32, 34)
    scales = blocks[..., :2].contiguous().view(torch.float16).reshape(rows, cols // 32)
    codes = blocks[..., 2:].contiguous().view(torch.int8).reshape(rows, cols)
    return codes, scales


def scaled_rows(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Float32 values of int8 ``codes [rows, cols]`` times their ``scales``: one a
    row (``[rows]``) or one per 32 inputs (``[rows, cols / 32]``, Q8_0's)."""
    if scales.dim() == 1:
        return codes.float() * scales.float()[:, None]
    rows, cols = codes.shape
    groups = codes.view(rows, -1, 32).float() * scales.float()[..., None]
    return groups.view(rows, cols)


def dequantize_rows(data: torch.Tensor, qtype: QT, cols: int) -> torch.Tensor:
    """Float32 ``[rows, cols]`` from raw rows ``uint8 [rows, row_bytes]``."""
    rows = data.shape[0]
    if qtype in INT4_TYPES:
        q, scale, mn = int4_affine(data, qtype, cols)
        scale = scale.repeat_interleave(32, 1)
        if qtype == QT.Q4_0:  # gguf computes d * (q - 8): the same rounding needs that form
            return scale * (q.float() - 8.0)
        return scale * q.float() + mn.repeat_interleave(32, 1)
    if qtype == QT.Q8_0:
        blocks = data.reshape(-1, 34)
        w = blocks[:, 2:].contiguous().view(torch.int8).float() * _f16(blocks, 0)
        return w.reshape(rows, cols)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        out = quants.dequantize(data.numpy(), qtype)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(rows, cols)


def gather_rows(table: torch.Tensor, ids: torch.Tensor, qtype: QT | int, cols: int) -> torch.Tensor:
    """Float32 ``[ids.numel(), cols]``: rows ``ids`` (any shape, flattened) of a raw
    table ``uint8 [rows, row_bytes]``, the values `dequantize_rows` gives.  With
    minivllm's kernels, one C++ pass reads each picked row's blocks where they lie
    (``minivllm_cpu::gguf_rows``: 3-10 us for 1-16 rows of 1024 on a 2-core EPYC,
    against 20-130 us for the torch ops of `dequantize_rows`); otherwise the rows
    are copied out and expanded by `dequantize_rows`."""
    if qtype in NATIVE_ROW_TYPES and table.is_cpu and ids.is_cpu and lowbit_cpu.available():
        return torch.ops.minivllm_cpu.gguf_rows(table, ids, int(qtype), cols)
    return dequantize_rows(table.index_select(0, ids.reshape(-1)), QT(qtype), cols)


__all__ = [
    "FLOAT_TYPES",
    "GGUFWeight",
    "INT4_TYPES",
    "INT5_TYPES",
    "NATIVE_ROW_TYPES",
    "dequantize_rows",
    "gather_rows",
    "int4_affine",
    "int5_affine",
    "q8_0_split",
    "scaled_rows",
]
