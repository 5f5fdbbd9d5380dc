"""Weight-only low-bit linear maps on CPU: GGUF weights computed on quantized.

minivllm's own kernels (`minivllm.kernels.lowbit_cpu`, C++ built on
first use) run batches of up to `Q4_MAX_TOKENS` rows: int4 weights in the ``Q4``
form (codes tiled 16 rows at a time, with the file's own scales re-laid beside
them: Q4_K's super-block and 6-bit ones, Q4_0's one float16 per 32, Q4_1's scale
and min, so the weight is the file's bytes and values, `_pack_run`; Q5_0 / Q5_1 /
Q5_K the same tiles plus a plane of fifth bits, Q6_K two planes and its int8
scales per 16; a weight fused from parts of different types, runs of each form
behind one header, `_tile_runs`) and int8 weights below 16 rows (64 without
VNNI), both as
integer dot products (AVX-512 VNNI or AVX2) on activations quantized to two int8
terms per group (opt-in: the second only in the groups where what the first one's
rounding left matters, `lowbit_cpu.residual_cut`).  Measured on the default model (2-core Sapphire Rapids, -O2,
``benchmarks/step_profile.py --baseline``): batch-1 decode 2.5x torch's int4 kernel,
and teacher-forced top-1 agreement with the float32 model 99.8% (98.6% with torch's
kernels on bfloat16 activations).  Without a C++ compiler the forms below serve.

Torch's kernels: two forms, chosen per weight from its GGUF type (measured on a 2-core Sapphire
Rapids, bfloat16 activations: at one token both kernels read 2-4x fewer bytes
than a bfloat16 GEMM and run ~2x faster; at 32 tokens they are 3-4x slower):

- ``int4``: Q4_0, Q4_1 and Q4_K are int4 codes with a scale and a min per 32
  elements, which is exactly the input of torch's ``_weight_int4pack_mm_for_cpu``
  (``w = (q - 8) * scale + zero``, so ``zero = min + 8 * scale``): no value changes.
- ``int8``: every other type (Q6_K, Q8_0, and the 5-bit ones without minivllm's
  kernels; on them, a Q6_K LM head and Q6_K on AMX CPUs) is expanded once at
  load and re-quantized to int8 with one scale per output row, for
  ``_weight_int8pack_mm`` (weight-only, like gpt-fast's int8).  On minivllm's
  kernels Q8_0 is not: its codes and float16 scales per 32 inputs are split from
  the blocks and computed on as stored (`q8_0_native`).

Both kernels' cost grows linearly with rows (they do not use AMX), so a large
batch (prefill chunks) expands the weight to bfloat16 for that call and runs a
dense GEMM instead; nothing expanded is kept.  An int8 weight at 16-64 rows runs
int8 x int8 instead (`int8_act_mm`, activations quantized as two int8 terms), or
on minivllm's AMX int8 kernel where the CPU has AMX (`q8_on_amx`).
An int8 weight is cheap to expand (above `LOWBIT_MAX_TOKENS` rows); an int4 one
costs ~2-10 ms (torch ops), which the dense GEMM repays from ~200-300 rows on the
default model's shapes (`INT4_MAX_TOKENS`; ``python benchmarks/lowbit_gemm.py``).  The expanded weight
is rounded to bfloat16, so prefill chunks past that size compute on slightly
different values than the decode kernels (which take the file's int4 values
exactly); the accuracy test's figures are for the decode kernels.

The LM head (`lowbit_logits`, then `refine_top_logits`): the kernels' bfloat16
outputs rank close logits wrongly, so each row's top logits are recomputed in
float32 from the file's raw blocks; the rest stay approximate.  With that, an
int8 head from `INT_MM_MIN_TOKENS` rows quantizes its activations too and runs
int8 x int8 (minivllm's one-term kernel or ``torch._int_mm``; with AMX, its tile
kernel).  Measured teacher-forced on the default model
(``benchmarks/gguf_accuracy.py``): top-1 agreement with the float32 model 93.8%
before, 98.6% with these; the rest of the loss is the body's bfloat16
activations, outputs and scales (~1.5%).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as QT

from minivllm import envs
from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.gguf_blocks import (
    INT4_TYPES,
    INT5_TYPES,
    GGUFWeight,
    gather_rows,
    int4_affine,
    int5_affine,
    k_quant_scales,
    q6_k_parts,
    scaled_rows,
    zero_point_scales,
)
from minivllm.platforms.cpu import cpu_has_fast_int8_matmul, cpu_has_native_bf16
from minivllm.torch_ops import eager_or_op, register_op

KERNEL_DTYPE = torch.bfloat16
"""Activation dtype of the low-bit kernels (their float32 variants are ~30x slower
measured); inputs are cast to it and outputs back, so the model itself (residual
stream, norms, attention) may stay float32: teacher-forced on the default model,
top-1 agreement with the dequantized float32 model is 98.6% that way and 97.5% with
an all-bfloat16 model (both with the LM head's exact top logits), which was not
measurably faster (`minivllm.config.model`), so ``dtype="auto"`` keeps float32."""

LOWBIT_MAX_TOKENS = 64
"""Most rows the int8 kernel computes; more rows expand the int8 weight per call."""

INT4_MAX_TOKENS = 256
"""Most rows the int4 kernel computes; more rows expand the int4 weight per call."""

Q4_MAX_TOKENS = 64
"""Most rows minivllm's own int4 kernel (`Q4`) computes; more rows expand the weight."""

INT4, INT8, Q4, INT8_TILES = 4, 8, 5, 9
"""Low-bit forms: ``INT4`` torch's packed int4 (``_weight_int4pack_mm_for_cpu``),
``INT8`` row-major int8 codes with one scale per row, or (Q8_0 on minivllm's
kernels, `q8_0_native`) with the file's float16 scale per 32 inputs, ``Q4`` int4
codes tiled for minivllm's own kernels (`lowbit_cpu`: int8 activations, VNNI/AVX2
dot products), ``INT8_TILES`` an LM head's int8 codes with one float32 scale per
row in 16-row tiles (`lowbit_cpu.pack_q8_tiles`, `tiled_head_kernel`)."""
GROUP = 32
_N_BLOCK = 64  # torch's CPU int4 packing interleaves output rows in blocks of 64


def native_kernels() -> bool:
    """Whether minivllm's own CPU kernels (`lowbit_cpu`) are built and loaded."""
    return lowbit_cpu.available()


def q8_on_amx() -> bool:
    """Whether minivllm's int8 kernel computes batches of 3 rows or more on AMX tiles
    here (``amx_int8``; `lowbit_cpu.amx`).  It then serves an int8 weight at every row
    count up to `LOWBIT_MAX_TOKENS`, the LM head included: on a 2-core Sapphire Rapids
    it ran 16-64 rows at 3-6x its VNNI form and about 2x ``torch._int_mm`` on the same
    two activation terms (Gemma 3's 262144 x 640 head at 32 rows: 15 against 43 ms;
    ``python benchmarks/q8_kernel.py``)."""
    return native_kernels() and lowbit_cpu.amx()


def int4_supported(parts: list[GGUFWeight]) -> bool:
    rows = sum(p.shape[0] for p in parts)
    block = lowbit_cpu.ROW_TILE if native_kernels() else _N_BLOCK
    return all(p.qtype in INT4_TYPES for p in parts) and rows % block == 0


def q6_supported(parts: list[GGUFWeight]) -> bool:
    """Whether minivllm's kernels compute this Q6_K weight on its own 6-bit codes and
    scales (``Q4`` kind, six form: the file's bytes, 6.56 bits a weight, where the
    per-row int8 form takes 8).  Not where the CPU has AMX: its int8 tiles run the
    int8 form's batches several times faster than the vector kernel runs six-form
    ones."""
    rows = sum(p.shape[0] for p in parts)
    return (
        native_kernels()
        and not q8_on_amx()
        and all(p.qtype == QT.Q6_K for p in parts)
        and rows % lowbit_cpu.ROW_TILE == 0
        and parts[0].shape[1] % 256 == 0
    )


def q8_0_native(parts: list[GGUFWeight]) -> bool:
    """Whether minivllm's int8 kernel computes this weight on Q8_0's own codes and
    float16 scales per 32 inputs (``INT8`` with group scales): read as stored, and
    exactly the file's values, where re-quantizing per row rounds them again.

    Only where the CPU lacks VNNI/AMX: the kernel for group scales is the AVX2 one,
    and with VNNI/AMX the per-row form's int8 x int8 GEMMs (16-64 rows: the LM
    head of a batched step) are several times faster than it."""
    return (
        native_kernels()
        and not cpu_has_fast_int8_matmul()
        and all(p.qtype == QT.Q8_0 for p in parts)
        and parts[0].shape[1] % lowbit_cpu.Q8_GROUP == 0
    )


def grouped_int8(scales: torch.Tensor) -> bool:
    """Whether an ``INT8`` weight's ``scales`` are Q8_0's, one per 32 inputs
    (only minivllm's kernel reads those; torch's int8 kernels take one a row)."""
    return scales.dim() == 2


def _affine(part: GGUFWeight, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if part.qtype in INT5_TYPES:
        return int5_affine(part.data, part.qtype, cols)
    return int4_affine(part.data, part.qtype, cols)


def quantize_parts(
    parts: list[GGUFWeight | torch.Tensor],
    dtype: torch.dtype = KERNEL_DTYPE,
    lm_head: bool = False,
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(kind, qweight, scales)`` for the weight made of ``parts`` stacked on rows.

    An ``lm_head`` of Q6_K keeps the int8 form: its batches of 16-64 rows run the
    one-term int8 kernel (`coarse_head_kernel`), which the six form has no
    counterpart of (Llama-1B shape's 49152 x 2048 head, 2-core Zen 4: 16 / 32 / 64
    rows 38 / 61 / 134 ms in the six form against 20 / 37 / 54; one row 6.0 against
    7.5)."""
    gguf = all(isinstance(p, GGUFWeight) for p in parts)
    if gguf and q8_0_native(parts):  # type: ignore[arg-type]
        if len(parts) == 1:  # shared with a tied embedding
            return INT8, *parts[0].q8_0_parts()  # type: ignore[union-attr]
        split = [p.q8_0_parts() for p in parts]  # type: ignore[union-attr]
        return INT8, torch.cat([c for c, _ in split]), torch.cat([s for _, s in split])
    runs = _tile_runs(parts, lm_head) if gguf else None  # type: ignore[arg-type]
    if runs is not None:
        packed = [_pack_run(form, run) for form, run in runs]
        if len(packed) == 1:
            return Q4, *packed[0]
        return Q4, *lowbit_cpu.pack_q4_stack(packed, parts[0].shape[1])
    if gguf and int4_supported(parts):  # type: ignore[arg-type]
        cols = parts[0].shape[1]
        affine = [int4_affine(p.data, p.qtype, cols) for p in parts]  # type: ignore[union-attr]
        q = torch.cat([a[0] for a in affine]).to(torch.int32)
        scale = torch.cat([a[1] for a in affine])
        mins = torch.cat([a[2] for a in affine])
        zero = mins + 8.0 * scale
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
        scale_zero = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
        return INT4, packed, scale_zero.to(dtype)
    w8, scale = _int8_rows(parts, dtype)
    if lm_head and tiled_head_kernel() and w8.shape[0] % lowbit_cpu.ROW_TILE == 0:
        if w8.shape[1] % lowbit_cpu.Q8_GROUP == 0:
            return INT8_TILES, lowbit_cpu.pack_q8_tiles(w8), scale.float()
    return INT8, w8, scale


def _tile_form(part: GGUFWeight, lm_head: bool) -> str | None:
    """The scale form minivllm's tiles hold ``part`` in (q4_scales.h), with the file's
    values in the file's bytes; None where they do not hold it."""
    if part.qtype == QT.Q6_K:
        return "six" if not lm_head and q6_supported([part]) else None
    if part.qtype in (QT.Q4_K, QT.Q5_K):
        return "super" if part.shape[1] % 256 == 0 else "pair"
    if part.qtype in (QT.Q4_0, QT.Q5_0):
        return "offset5" if part.qtype == QT.Q5_0 else "offset4"
    return "pair" if part.qtype in (QT.Q4_1, QT.Q5_1) else None


def _tile_runs(parts: list[GGUFWeight], lm_head: bool) -> list[tuple[str, list[GGUFWeight]]] | None:
    """``parts`` as runs of consecutive parts of one tile form (one run is the usual
    weight; more, a stacked one: Q4_K q and k beside a Q6_K v), or None where
    minivllm's kernels do not hold them all (a run's rows must fill whole tiles)."""
    if not native_kernels():
        return None
    runs: list[tuple[str, list[GGUFWeight]]] = []
    for part in parts:
        form = _tile_form(part, lm_head)
        if form is None:
            return None
        if runs and runs[-1][0] == form:
            runs[-1][1].append(part)
        else:
            runs.append((form, [part]))
    rows = [sum(p.shape[0] for p in run) for _, run in runs]
    return runs if all(r % lowbit_cpu.ROW_TILE == 0 for r in rows) else None


def _pack_run(form: str, parts: list[GGUFWeight]) -> tuple[torch.Tensor, torch.Tensor]:
    """Parts of one tile form as one tiled weight ``(codes [rows, ...], scales)``:
    super for Q4_K / Q5_K (`lowbit_cpu.pack_q4_super`), offset for Q4_0 / Q5_0
    (`pack_q4_offset`), six for Q6_K (`pack_q6`), pair (a float16 scale and min per
    32: Q4_1 and Q5_1's own, `pack_q4`) otherwise."""
    cols = parts[0].shape[1]
    rows = sum(p.shape[0] for p in parts)
    if form == "six":
        split = [q6_k_parts(p.data, cols) for p in parts]
        q, d, sc = (torch.cat([s[i] for s in split]) for i in range(3))
        codes, scales = lowbit_cpu.pack_q6(q, d, sc)
        return codes.view(rows, -1), scales
    affine = [_affine(p, cols) for p in parts]
    q = torch.cat([a[0] for a in affine])
    if form == "super":
        raw = [k_quant_scales(p.data, p.qtype) for p in parts]
        d, dmin, sc, m = (torch.cat([r[i] for r in raw]) for i in range(4))
        codes, scales = lowbit_cpu.pack_q4_super(q, d, dmin, sc, m)
    elif form.startswith("offset"):
        d = torch.cat([zero_point_scales(p.data, p.qtype) for p in parts])
        codes, scales = lowbit_cpu.pack_q4_offset(q, d, five=form == "offset5")
    else:
        scale = torch.cat([a[1] for a in affine])
        codes, scales = lowbit_cpu.pack_q4(q, scale, torch.cat([a[2] for a in affine]))
        scales = scales.view(rows, -1)
    return codes.view(rows, -1), scales


INT8_CHUNK_ELEMENTS = 1 << 21
"""Float32 elements dequantized at a time when converting to int8 (8 MiB: the
temporaries stay in cache, and no weight-sized float copy is ever made; Gemma 3's
262k x 640 table converts in 0.5 s instead of 2.3-5.4 s)."""


def _int8_rows(
    parts: list[GGUFWeight | torch.Tensor], dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Int8 codes and one ``dtype`` scale per row, converted a few rows at a time."""
    cols = parts[0].shape[1]
    total = sum(p.shape[0] for p in parts)
    w8 = torch.empty(total, cols, dtype=torch.int8)
    scale = torch.empty(total, dtype=dtype)
    step = max(1, INT8_CHUNK_ELEMENTS // cols)
    at = 0
    for part in parts:
        for start in range(0, part.shape[0], step):
            n = min(step, part.shape[0] - start)
            if isinstance(part, GGUFWeight):
                w = part.narrow_rows(start, n).dequantize()
            else:
                w = part[start : start + n].to(torch.float32, copy=True)  # divided in place
            # Codes for the scale as stored (rounded to ``dtype``), so code * scale is
            # the nearest value the kernel can compute, not off by the scale's rounding.
            s = (w.abs().amax(dim=1).clamp(min=1e-12) / 127.0).to(dtype)
            scale[at : at + n] = s
            w8[at : at + n] = w.div_(s.float()[:, None]).round_().clamp_(-127, 127)
            at += n
    return w8, scale


EXPAND_BAND_BYTES = 4 << 20
"""Bytes of expanded weight a large batch's GEMM makes at a time (`expanded_mm`).
Expanded whole, the largest weight (64 MiB for a 1B model's bfloat16 gate/up)
stayed resident after a prefill as allocator cache.  The bands cost a little:
Llama-3.2-1B shapes at 256 tokens (2-core EPYC Zen 4, medians of 4-5 best-of-3,
noisy), whole against 4 MiB bands: gate/up 44.4 / 48.0 ms, down 23.2 / 25.0, qkv
and o within noise; a whole 128-token prefill showed no difference beyond the
machine's spread (`benchmarks/tree_ab.py`)."""


def expanded_mm(
    flat: torch.Tensor, kind: int, qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``flat @ W.T`` on a dense GEMM in ``dtype``, a ``Q4`` or ``INT8`` weight
    expanded a band of output rows at a time (`EXPAND_BAND_BYTES`), each band's
    products written into their columns of the output: the same dot products as
    with the whole weight (bit for bit on a Zen 4's oneDNN).  Other forms are
    expanded whole."""
    flat = flat.to(dtype)
    if kind not in (Q4, INT8):
        return F.linear(flat, dequantize_weight(kind, qweight, scales, dtype))
    rows_out = qweight.shape[0]  # Q4: [N, bytes a row], stacked or not; INT8: [N, K]
    cols = lowbit_cpu.q4_inputs(qweight, scales) if kind == Q4 else qweight.shape[1]
    band = max(64, EXPAND_BAND_BYTES // (cols * flat.element_size()) // 64 * 64)
    if band >= rows_out:
        return F.linear(flat, dequantize_weight(kind, qweight, scales, dtype))
    out = flat.new_empty(flat.shape[0], rows_out)
    for row0 in range(0, rows_out, band):
        n = min(band, rows_out - row0)
        if kind == Q4:
            w = torch.ops.minivllm_cpu.q4_dequantize(qweight, scales, cols, dtype, row0, n)
        else:
            w = dequantize_weight(kind, qweight[row0 : row0 + n], scales[row0 : row0 + n], dtype)
        torch.mm(flat, w.t(), out=out[:, row0 : row0 + n])
    return out


def dequantize_weight(
    kind: int, qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The dense ``[out, in]`` weight in ``dtype``."""
    if kind == INT8_TILES:
        return lowbit_cpu.unpack_q8_tiles(qweight).to(dtype) * scales.to(dtype)[:, None]
    if kind == INT8 and grouped_int8(scales):
        return scaled_rows(qweight, scales).to(dtype)
    if kind == INT8:
        return qweight.to(dtype) * scales.to(dtype)[:, None]
    if kind == Q4:
        cols = lowbit_cpu.q4_inputs(qweight, scales)
        return torch.ops.minivllm_cpu.q4_dequantize(qweight, scales, cols, dtype)
    groups, rows, _ = scales.shape
    cols = groups * GROUP
    packed = qweight.view(rows // _N_BLOCK, cols, _N_BLOCK // 2)
    # [row block, col, 64 rows]: low nibbles are rows 0..31 of the block, high 32..63.
    q = torch.cat([packed & 0x0F, packed >> 4], dim=2).to(scales.dtype) - 8.0
    q = q.view(rows // _N_BLOCK, groups, GROUP, _N_BLOCK)
    sz = scales.view(groups, rows // _N_BLOCK, _N_BLOCK, 2).transpose(0, 1).unsqueeze(2)
    w = q * sz[..., 0] + sz[..., 1]
    return w.permute(0, 3, 1, 2).reshape(rows, cols).to(dtype)


INT8_INT_MM_TOKENS = (16, LOWBIT_MAX_TOKENS)
"""Row counts at which an int8 linear runs on `int8_act_mm` (``torch._int_mm``)
instead of the weight-only kernel, whose cost grows with every row: measured on
the default model's shapes (2-core Sapphire Rapids, best of 25), at 32 rows the
weight-only kernel takes ~2x the float32 GEMM and `int8_act_mm` ~1x; from 8 to
16 rows they cross; past 64 rows the expanded bfloat16 GEMM wins."""


def int8_act_mm(flat: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Float32 ``flat @ W.T`` for int8 ``qweight`` with per-row ``scales``, computed
    int8 x int8 (``torch._int_mm``: oneDNN, AMX/VNNI) on activations quantized per
    row as two int8 terms (the row, then what its rounding left): activation error
    ~1/127 of one int8 quantization (below a bfloat16 cast's), for one call with
    twice the rows."""
    flat = flat.float()
    rows = flat.shape[0]
    hi_scale = flat.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
    hi = torch.round(flat / hi_scale)
    rest = flat - hi * hi_scale
    lo_scale = rest.abs().amax(dim=1, keepdim=True).clamp(min=1e-30) / 127.0
    lo = torch.round(rest / lo_scale)
    xq = torch.cat([hi, lo]).to(torch.int8)
    acc = torch._int_mm(xq, qweight.t())
    if native_kernels():
        # One pass instead of a float copy and four: at 32 rows of Gemma 3's 262k
        # vocabulary 2.4 ms a step instead of 26 ms (2-core EPYC, with the block
        # cache), with the same roundings.
        return torch.ops.minivllm_cpu.int8_mm_scale(acc, hi_scale, lo_scale, scales)
    both = acc.float()
    out = both[:rows].mul_(hi_scale).add_(both[rows:].mul_(lo_scale))
    return out.mul_(scales.float())


def lowbit_linear_impl(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    kind: int,
) -> torch.Tensor:
    """``x @ W.T + bias`` for a weight quantized by `quantize_parts`."""
    flat = x.reshape(-1, x.shape[-1])
    rows = flat.shape[0]
    low, high = INT8_INT_MM_TOKENS
    if kind == INT8_TILES:  # an LM head's tiles
        return _as_output(tiled_head_mm(flat, qweight, scales), x, bias)
    if envs.batch_invariant():
        return _as_output(_row_independent_mm(flat, qweight, scales, kind), x, bias)
    if kind == Q4:
        if rows <= Q4_MAX_TOKENS or not _bf16_in_hardware():
            out = torch.ops.minivllm_cpu.q4_gemm(flat, qweight, scales)
        else:
            out = expanded_mm(flat, kind, qweight, scales, KERNEL_DTYPE)
    elif (
        kind == INT8
        and _q8_native(qweight)
        and (
            rows < low
            or (
                rows <= high
                and (grouped_int8(scales) or not cpu_has_fast_int8_matmul() or q8_on_amx())
            )
        )
    ):
        # Without VNNI/AMX minivllm's AVX2 kernel stays ahead of torch's weight-only
        # one up to 64 rows (the default model's LM head, an AVX2 EPYC, best of 5:
        # 29 against 47 ms at 32 rows), and one kernel for 1-64 rows keeps a row's
        # result the same whatever the batch.  Q8_0's group scales only it reads.
        out = torch.ops.minivllm_cpu.q8_gemm(flat, qweight, scales)
    elif kind == INT8 and low <= rows <= high and cpu_has_fast_int8_matmul():
        # Without VNNI/AMX this GEMM is 10-20x slower than torch's weight-only
        # kernel below (an AVX2 EPYC, 16-64 rows), so only where the CPU has them.
        out = int8_act_mm(flat, qweight, scales)
    elif rows > (LOWBIT_MAX_TOKENS if kind == INT8 else INT4_MAX_TOKENS):
        # Expanded for this call, in bfloat16 where the CPU has it, float32 elsewhere:
        # emulated bfloat16 GEMMs are slow (an AVX2 EPYC, Gemma 3's 128-token
        # prefill: 15.6 ms per int8 [640 x 2048] weight in bfloat16).
        dtype = scales.dtype if _bf16_in_hardware() else torch.float32
        out = expanded_mm(flat, kind, qweight, scales, dtype)
    else:
        if flat.dtype != scales.dtype:
            flat = flat.to(scales.dtype)
        if kind == INT4:
            out = torch._weight_int4pack_mm_for_cpu(flat.contiguous(), qweight, GROUP, scales)
        else:
            out = torch._weight_int8pack_mm(flat.contiguous(), qweight, scales)
    return _as_output(out, x, bias)


@functools.cache
def _bf16_in_hardware() -> bool:
    """Whether a large ``Q4`` batch expands the weight to bfloat16 for a dense GEMM
    (AMX / AVX512-BF16).  Elsewhere bfloat16 is emulated and the int4 kernel stays
    faster at every row count (an AVX2 EPYC, 128-512 rows, default model's MLP
    shapes: 0.15-0.21x the expanded GEMM's time), and a prompt then computes the
    same whether it is prefilled alone or with others."""
    return cpu_has_native_bf16()


def _row_independent_mm(
    flat: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, kind: int
) -> torch.Tensor:
    """``flat @ W.T`` on the one kernel of ``kind`` whose result for a row does not
    depend on the other rows (``VLLM_BATCH_INVARIANT=1``), whatever their number:
    `lowbit_cpu`'s kernels quantize and compute each row alone; torch's weight-only
    kernels take every row through the same loop."""
    if kind == Q4:
        return torch.ops.minivllm_cpu.q4_gemm(flat, qweight, scales)
    if kind == INT8 and _q8_native(qweight):  # VNNI at any row count: not AMX's roundings
        return torch.ops.minivllm_cpu.q8_gemm(flat, qweight, scales, False)
    flat = flat.to(scales.dtype).contiguous()
    if kind == INT4:
        return torch._weight_int4pack_mm_for_cpu(flat, qweight, GROUP, scales)
    return torch._weight_int8pack_mm(flat, qweight, scales)


def _as_output(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The ``[rows, out]`` GEMM result in ``x``'s dtype and leading shape, plus ``bias``."""
    out = out.to(x.dtype)
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], out.shape[-1])


def _q8_native(qweight: torch.Tensor) -> bool:
    return qweight.shape[1] % lowbit_cpu.Q8_GROUP == 0 and native_kernels()


def _lowbit_linear_fake(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    kind: int,
) -> torch.Tensor:
    rows = scales.shape[1] if kind == INT4 else qweight.shape[0]
    return x.new_empty(*x.shape[:-1], rows)


lowbit_linear_op = register_op("lowbit_linear", lowbit_linear_impl, _lowbit_linear_fake)
"""``minivllm::lowbit_linear``: opaque to Dynamo/Inductor (it picks a path per row count)."""


def lowbit_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None,
    kind: int,
) -> torch.Tensor:
    """`lowbit_linear_impl` in eager mode; while Dynamo traces, the opaque
    ``minivllm::lowbit_linear`` op, which picks its kernel by row count at run
    time (the CPU decode graph, which never has more than `Q4_MAX_TOKENS` rows,
    calls the int4 kernel directly instead: `q4_kernel_linear`)."""
    if not torch.compiler.is_compiling():
        return lowbit_linear_impl(x, qweight, scales, bias, kind)
    return lowbit_linear_op(x, qweight, scales, bias, kind)


def q4_kernel_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ W.T + bias`` for a ``Q4`` weight as one ``minivllm_cpu::q4_gemm`` call,
    for at most `Q4_MAX_TOKENS` rows.  Traced into a graph, it saves the Python
    dispatch of ``minivllm::lowbit_linear``, ~20 us a call, 120 calls a step on
    the default model."""
    out = torch.ops.minivllm_cpu.q4_gemm(x.reshape(-1, x.shape[-1]), qweight, scales)
    return _as_output(out, x, bias)


INT_MM_MIN_TOKENS = 16
"""From this many rows an int8 LM head computes its approximate logits int8 x int8
(one int8 term a token) on CPUs with VNNI but no AMX (`coarse_head_kernel`, else
``torch._int_mm``); below it the weight-only kernel runs."""


def coarse_head_kernel() -> bool:
    """Whether ``minivllm_cpu::q8_gemm_coarse`` serves the int8 head's batches here:
    minivllm's kernels on their AVX-512 VNNI path (not lowered by a test), no AMX.
    One int8 term a token per 256 inputs (`torch._int_mm`'s form takes two): ~1%
    error on the approximate logits, half the products.  2-core Zen 4, ms at
    16 / 32 / 64 rows, against the int16-code kernel and ``torch._int_mm`` on two
    terms: Gemma 3's 262144 x 640 head 27 / 59 / 120 against 44 / 95 / 167 and
    36 / 84 / 151; a 49152 x 2048 head 9 / 16 / 28 against 18 / 38 / 66 and
    20 / 29 / 46.  A head whose rows fill 16-row tiles is held as `INT8_TILES`
    instead (`tiled_head_kernel`); this row-major form serves the others."""
    return native_kernels() and lowbit_cpu.isa() == 2 and not lowbit_cpu.amx()


def tiled_head_kernel() -> bool:
    """Whether a GGUF LM head converted to int8 is held as `INT8_TILES` and every
    batch of it runs ``minivllm_cpu::q8_tiled_gemm`` (where `coarse_head_kernel`
    holds: AVX-512 VNNI, no AMX; `tiled_head_mm`).  16 rows a vector, so no
    horizontal sums (Gemma 3's 640-input rows spent most of the coarse kernel's time
    on them).  2-core Zen 4, ``python benchmarks/q8_kernel.py``, Gemma 3's 262144 x 640
    head: one row (two terms) 5.5 ms against 5.4 on the int16-code kernel, 32 rows
    (one term) 18.2 against 33.9 on the coarse one."""
    return coarse_head_kernel()


def tiled_head_mm(flat: torch.Tensor, tiles: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Approximate logits from an `INT8_TILES` head: under `INT_MM_MIN_TOKENS` rows
    (a step at memory speed, so the products cost nothing) with two int8 terms a
    token, about as close to the exact product as the int16-code kernel; from there
    with one, like the coarse kernel (~1-2% of a row's logits, half the products).
    Either way a token's logits do not depend on the tokens beside it as long as the
    term count is the same; ``VLLM_BATCH_INVARIANT=1`` takes two at every size."""
    two = flat.shape[0] < INT_MM_MIN_TOKENS or envs.batch_invariant()
    return torch.ops.minivllm_cpu.q8_tiled_gemm(flat, tiles, scales, 2 if two else 1)


def lowbit_logits_impl(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, kind: int
) -> torch.Tensor:
    """Approximate float32 logits of a low-bit LM head (`refine_top_logits` then
    makes each row's top ones exact).

    An int8 head at `INT_MM_MIN_TOKENS` rows or more, on a CPU with VNNI but no AMX
    (`cpu_has_fast_int8_matmul`, `q8_on_amx`), quantizes the activations too and
    multiplies int8 x int8: one term a token on minivllm's kernel
    (`coarse_head_kernel`), else two on ``torch._int_mm`` (oneDNN's VNNI int8).
    Only the logits outside each row's refined top ones keep the coarser rounding.
    With AMX minivllm's int8 kernel runs it on tiles instead (about 2x
    ``torch._int_mm``).  The refinement recomputes the top logits whichever kernel
    ran (set by how many rows the batch has); the others differ between the paths by
    their rounding.  Fewer rows, int4 heads and ``VLLM_BATCH_INVARIANT=1`` use
    `lowbit_linear`.  An `INT8_TILES` head runs its one kernel at every row count
    (`tiled_head_mm`: two int8 terms under `INT_MM_MIN_TOKENS` rows, one from there).
    """
    flat = x.reshape(-1, x.shape[-1])
    if kind == INT8_TILES:
        out = tiled_head_mm(flat, qweight, scales)
        return out.view(*x.shape[:-1], out.shape[-1])
    if (
        kind != INT8
        or grouped_int8(scales)
        or flat.shape[0] < INT_MM_MIN_TOKENS
        or not cpu_has_fast_int8_matmul()
        or q8_on_amx()
        or envs.batch_invariant()
    ):
        return lowbit_linear_impl(x, qweight, scales, None, kind).float()
    if coarse_head_kernel() and flat.shape[1] % 64 == 0:
        out = torch.ops.minivllm_cpu.q8_gemm_coarse(flat, qweight, scales)
    else:
        out = int8_act_mm(flat, qweight, scales)
    return out.view(*x.shape[:-1], out.shape[-1])


def _lowbit_logits_fake(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, kind: int
) -> torch.Tensor:
    rows = {INT4: scales.shape[1], INT8_TILES: scales.shape[0]}.get(kind, qweight.shape[0])
    return x.new_empty(*x.shape[:-1], rows, dtype=torch.float32)


lowbit_logits_op = register_op("lowbit_logits", lowbit_logits_impl, _lowbit_logits_fake)


lowbit_logits = eager_or_op(lowbit_logits_op, lowbit_logits_impl)


REFINE_TOP = 16
"""Logits per row that `refine_top_logits` recomputes exactly."""


def _top_indices(logits: torch.Tensor, k: int, chunk: int = 64) -> torch.Tensor:
    """Column indices of each row's ``k`` largest values (unordered), in two steps:
    the ``k`` chunks with the largest maxima hold them all, so only those chunks'
    elements are ranked (3-5x faster than one ``topk`` over a 49k vocabulary).  On
    CPU with minivllm's kernels, both steps are one C++ pass a row
    (``minivllm_cpu::top_logit_indices``, ~8x faster again)."""
    rows, cols = logits.shape
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and native_kernels():
        return torch.ops.minivllm_cpu.top_logit_indices(logits, k)
    if cols % chunk or cols // chunk < k:
        return logits.topk(k, dim=-1, sorted=False).indices
    chunks = logits.view(rows, cols // chunk, chunk)
    best = chunks.amax(-1).topk(k, dim=-1, sorted=False).indices
    cand = chunks.gather(1, best[..., None].expand(rows, k, chunk)).view(rows, k * chunk)
    j = cand.topk(k, dim=-1, sorted=False).indices
    return best.gather(1, j // chunk) * chunk + j % chunk


PLAIN_TABLE = -1
"""``qtype`` of `refine_top_logits` for a table of plain rows: float, or int8 codes
with one scale per row or per 32 inputs (not a GGUF type: those are 0 and up)."""


def refine_top_logits_impl(
    x: torch.Tensor,
    logits: torch.Tensor,
    table: torch.Tensor,
    qtype: int,
    scales: torch.Tensor | None,
) -> None:
    """Recompute, in place, each row's `REFINE_TOP` largest ``logits`` in float32
    from the exact weights ``table``; the rest stay as given.  ``table`` holds raw
    GGUF rows of type ``qtype``, or (``qtype`` `PLAIN_TABLE`) float rows, or int8
    rows whose ``scales`` (one a row, or Q8_0's one per 32 inputs) give the values.

    The low-bit LM head gives bfloat16 logits (and an int8 head re-quantizes the
    file's values), which alone cost ~4% top-1 agreement with the float32 model
    on the default model (``benchmarks/gguf_accuracy.py``: a logit near 16 is
    rounded to a step of 0.06, so close candidates swap).  Those errors are far
    smaller than the gap to the 16th candidate, so the top tokens, where
    sampling, greedy decoding and log-probabilities look, come out exact.
    """
    dim = x.shape[-1]
    flat = logits.view(-1, logits.shape[-1])
    k = min(REFINE_TOP, flat.shape[-1])
    top = _top_indices(flat, k).reshape(-1)
    if qtype == PLAIN_TABLE:
        picked = table.index_select(0, top)
        rows = picked.float() if scales is None else scaled_rows(picked, scales[top])
    else:
        rows = gather_rows(table, top, qtype, dim)
    exact = torch.bmm(rows.view(-1, k, dim), x.reshape(-1, dim, 1).float()).squeeze(-1)
    flat.scatter_(1, top.view(-1, k), exact)


def _refine_top_logits_fake(
    x: torch.Tensor,
    logits: torch.Tensor,
    table: torch.Tensor,
    qtype: int,
    scales: torch.Tensor | None,
) -> None:
    return None


refine_top_logits_op = register_op(
    "refine_top_logits",
    refine_top_logits_impl,
    _refine_top_logits_fake,
    mutates_args=("logits",),
)


refine_top_logits = eager_or_op(refine_top_logits_op, refine_top_logits_impl)


__all__ = [
    "INT4_MAX_TOKENS",
    "LOWBIT_MAX_TOKENS",
    "REFINE_TOP",
    "INT_MM_MIN_TOKENS",
    "INT8_TILES",
    "PLAIN_TABLE",
    "dequantize_weight",
    "lowbit_linear",
    "q4_kernel_linear",
    "lowbit_logits",
    "q8_0_native",
    "grouped_int8",
    "quantize_parts",
    "refine_top_logits",
    "tiled_head_kernel",
]
