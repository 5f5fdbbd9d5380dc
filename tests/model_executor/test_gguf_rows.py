"""``minivllm_cpu::gguf_rows``: picked rows of a raw GGUF table as float32, exactly
``gguf.quants.dequantize``'s values, for every type it covers; `gather_rows` uses it
where the kernels are built and falls back to `dequantize_rows` otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as QT

from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers import gguf_blocks
from minivllm.model_executor.layers.gguf_blocks import NATIVE_ROW_TYPES, gather_rows
from minivllm.model_executor.layers.vocab_embedding import gguf_embedding_impl

needs_kernels = pytest.mark.skipif(not lowbit_cpu.available(), reason="no C++ compiler here")

TYPES = sorted(NATIVE_ROW_TYPES)
QUANTIZABLE = (QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0)
SCALE_OFFSETS = {QT.Q4_K: (0, 2), QT.Q5_K: (0, 2), QT.Q6_K: (208,)}
"""Byte offsets of the float16 scales in each block of the types gguf cannot write."""
ROWS, DIM = 37, 512


def _table(qtype: QT, rows: int = ROWS, dim: int = DIM, seed: int = 0) -> torch.Tensor:
    """A table ``uint8 [rows, row_bytes]`` of valid blocks: quantized by gguf where it
    can, else random bytes whose float16 scales are finite random values."""
    rng = np.random.default_rng(seed)
    if qtype in QUANTIZABLE:
        dense = rng.standard_normal((rows, dim), dtype=np.float32) * 3
        data = np.ascontiguousarray(quants.quantize(dense, qtype)).view(np.uint8)
        return torch.from_numpy(data.reshape(rows, -1).copy())
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * dim // block_size, type_size), dtype=np.uint8)
    for at in SCALE_OFFSETS[qtype]:
        scale = (rng.standard_normal(len(blocks)) * 0.05).astype(np.float16)
        blocks[:, at : at + 2] = scale.view(np.uint8).reshape(-1, 2)
    return torch.from_numpy(blocks.reshape(rows, -1))


def _ids(rows: int, n: int, seed: int = 1) -> torch.Tensor:
    """``n`` ids with repeats, the first and last row among them."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, rows, (n,), generator=gen)
    ids[:4] = torch.tensor([0, rows - 1, 0, rows - 1])
    return ids[torch.randperm(n, generator=gen)]


def _reference(table: torch.Tensor, ids: torch.Tensor, qtype: QT) -> torch.Tensor:
    rows = table.numpy()[ids.reshape(-1).numpy()]
    out = quants.dequantize(np.ascontiguousarray(rows), qtype)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(rows.shape[0], -1)


def test_every_gguf_type_of_a_model_is_covered() -> None:
    # The types minivllm keeps quantized (gguf_blocks) are all expanded in C++.
    kept = {*gguf_blocks.FLOAT_TYPES, *gguf_blocks.INT4_TYPES, *gguf_blocks.INT5_TYPES}
    assert kept | {QT.Q8_0, QT.Q6_K} == set(NATIVE_ROW_TYPES)


@needs_kernels
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 16, 300])  # 300 x 512 values: split over threads
def test_rows_equal_gguf_dequantize(qtype: QT, n: int) -> None:
    table = _table(qtype)
    ids = _ids(ROWS, max(n, 4))[:n] if n >= 4 else torch.tensor([ROWS - 1])
    got = torch.ops.minivllm_cpu.gguf_rows(table, ids, int(qtype), DIM)
    want = _reference(table, ids, qtype)
    assert got.dtype == torch.float32 and got.shape == (n, DIM)
    assert torch.isfinite(want).all() and want.abs().sum() > 0
    assert torch.equal(got, want), qtype.name


@needs_kernels
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0, QT.BF16], ids=lambda t: t.name)
def test_rows_of_a_strided_view(qtype: QT) -> None:
    # A table whose rows lie apart in a larger buffer (row stride > row bytes), ids of
    # any shape: read where they lie, as the rows of a flattened id list.
    table = _table(qtype)
    wide = torch.zeros(ROWS, table.shape[1] + 24, dtype=torch.uint8)
    wide[:, 8 : 8 + table.shape[1]] = table
    view = wide[:, 8 : 8 + table.shape[1]]
    assert view.stride(0) != view.shape[1]
    ids = _ids(ROWS, 12).view(3, 4)
    got = torch.ops.minivllm_cpu.gguf_rows(view, ids, int(qtype), DIM)
    assert torch.equal(got, _reference(table, ids, qtype))


@needs_kernels
def test_rows_of_a_mapped_file(tmp_path: Path) -> None:
    # The embedding keeps the file's blocks as a mapping (GGUFWeight.stored).
    table = _table(QT.Q6_K)
    path = tmp_path / "table.bin"
    path.write_bytes(b"\0" * 96 + table.numpy().tobytes())
    mapped = np.memmap(path, dtype=np.uint8, mode="c", offset=96, shape=tuple(table.shape))
    ids = _ids(ROWS, 16)
    got = torch.ops.minivllm_cpu.gguf_rows(torch.from_numpy(mapped), ids, int(QT.Q6_K), DIM)
    assert torch.equal(got, _reference(table, ids, QT.Q6_K))


@needs_kernels
def test_bad_calls_raise() -> None:
    table = _table(QT.Q4_K)
    op = torch.ops.minivllm_cpu.gguf_rows
    for bad in (ROWS, -1):
        with pytest.raises(RuntimeError, match="out of range"):
            op(table, torch.tensor([0, bad]), int(QT.Q4_K), DIM)
    with pytest.raises(RuntimeError, match="not supported"):
        op(table, torch.tensor([0]), int(QT.Q2_K), DIM)
    with pytest.raises(RuntimeError, match="multiple of"):
        op(table, torch.tensor([0]), int(QT.Q4_K), DIM + 32)
    with pytest.raises(RuntimeError, match="bytes"):
        op(table, torch.tensor([0]), int(QT.Q5_K), DIM)
    assert op(table, torch.tensor([], dtype=torch.long), int(QT.Q4_K), DIM).shape == (0, DIM)


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q5_K, QT.Q6_K, QT.Q8_0], ids=lambda t: t.name)
def test_fallback_gives_the_same_rows(qtype: QT, monkeypatch: pytest.MonkeyPatch) -> None:
    # Without the kernels the rows are copied out and expanded by `dequantize_rows`.
    table = _table(qtype)
    ids = _ids(ROWS, 16)
    native = gather_rows(table, ids, qtype, DIM)
    with monkeypatch.context() as patch:
        patch.setattr(lowbit_cpu, "available", lambda: False)
        fallback = gather_rows(table, ids, qtype, DIM)
    assert torch.equal(fallback, native)
    assert torch.equal(native, _reference(table, ids, qtype))


def test_embedding_lookup_keeps_the_ids_shape() -> None:
    table = _table(QT.Q4_K)
    ids = _ids(ROWS, 6).view(2, 3)
    got = gguf_embedding_impl(ids, table, int(QT.Q4_K), DIM)
    assert got.shape == (2, 3, DIM)
    assert torch.equal(got.view(6, DIM), _reference(table, ids, QT.Q4_K))
