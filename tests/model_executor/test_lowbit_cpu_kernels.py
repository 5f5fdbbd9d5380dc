"""minivllm's own CPU low-bit kernels (`lowbit_cpu`): every code path this CPU has
computes exactly "activations quantized per group (two int8 terms; one int16 term
for int8 weights on AVX2), times the weight"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mx_helpers import residual_cut

from minivllm import envs
from minivllm.kernels import lowbit_cpu

pytestmark = pytest.mark.skipif(not lowbit_cpu.available(), reason="no C++ compiler here")


def _one_term(x: torch.Tensor, group: int) -> torch.Tensor:
    g = x.view(x.shape[0], -1, group)
    scale = g.abs().amax(-1, keepdim=True) / 127
    codes = torch.round(g / torch.where(scale > 0, scale, 1))
    return (codes * scale).view_as(x)


def _sum_squares(v: torch.Tensor) -> torch.Tensor:
    """Sums of squares over the last dimension (a multiple of 16) in the kernels' order:
    16 running lanes, lane j taking inputs j, j + 16, ...; then halved pairwise."""
    lanes = torch.zeros(*v.shape[:-1], 16)
    for chunk in v.unflatten(-1, (-1, 16)).unbind(-2):
        lanes = lanes + chunk * chunk
    for half in (8, 4, 2, 1):
        lanes = lanes[..., :half] + lanes[..., half : 2 * half]
    return lanes[..., 0]


def _second_term_groups(x: torch.Tensor, group: int, cut: float) -> torch.Tensor:
    """Which groups of each token get the second term: those whose remainder's energy
    (after the first term) is above ``cut`` times the token's mean energy per group.
    Summed in float32 in the kernels' order (`_sum_squares` a group, the groups one
    after another), so that a group near the line falls on the same side."""
    rows, k = x.shape
    groups = k // group
    left = _sum_squares((x - _one_term(x, group)).view(rows, groups, group))
    per_group = _sum_squares(x.view(rows, groups, group))
    energy = torch.zeros(rows)
    for g in range(groups):
        energy = energy + per_group[:, g]
    line = torch.tensor(cut, dtype=torch.float32) * energy / groups
    return left > line[:, None]


def _quantized(x: torch.Tensor, group: int, cut: float | None = None) -> torch.Tensor:
    """``x`` as the kernels see it: int8 codes times one scale per ``group`` inputs,
    plus the same for what that rounding left where it matters (`_second_term_groups`,
    at the kernels' ``residual_cut`` unless ``cut`` is given)."""
    cut = lowbit_cpu.residual_cut() if cut is None else cut
    hi = _one_term(x, group)
    keep = _second_term_groups(x, group, cut).repeat_interleave(group, -1)
    return hi + _one_term(x - hi, group) * keep


@pytest.fixture(params=[0.0, lowbit_cpu.FAST_RESIDUAL_CUT], ids=["every-group", "cut"])
def cut(request: pytest.FixtureRequest):
    """The kernels' residual cut for one test: a second term in every group (the
    default), or the measured opt-in cut (about half the groups of these inputs)."""
    with residual_cut(request.param):
        yield request.param


def _near_float(
    got: torch.Tensor, x: torch.Tensor, dense: torch.Tensor, group: int, cut: float
) -> bool:
    """Where every group has its second term, ``got`` is within ~1/127 of one term's
    ~1e-2 of the float product ``x @ dense.T``.  With a cut (the caller has matched
    ``got`` to the cut's own reference), the inputs instead must put groups on both
    sides of the line, or that reference would be one of the two without a cut."""
    if cut == 0:
        exact = x @ dense.T
        return bool((got - exact).norm() / exact.norm() < 1e-3)
    keep = _second_term_groups(x, group, cut)
    return bool(keep.any() and not keep.all())


AMX = 3
"""The fixture's name for the AVX-512 path with q4 batches on AMX tiles."""


@pytest.fixture(params=[AMX, 2, 1, 0], ids=["amx", "avx512", "avx2", "portable"])
def isa(request: pytest.FixtureRequest):
    best, amx = lowbit_cpu.isa(), lowbit_cpu.amx()
    if request.param == AMX and not lowbit_cpu.amx(1):
        pytest.skip("this CPU (or its kernel) offers no AMX")
    if min(request.param, 2) > best:
        pytest.skip("this CPU lacks that instruction set")
    lowbit_cpu.isa(min(request.param, 2))
    lowbit_cpu.amx(int(request.param == AMX))
    yield request.param
    lowbit_cpu.isa(best)
    lowbit_cpu.amx(int(amx))


def _q4_weight(n: int, k: int, levels: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n + k)
    q = torch.randint(0, levels, (n, k), generator=gen)
    scale = torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3
    mins = -torch.rand(n, k // 32, generator=gen) * 0.15
    return q, scale.half().float(), mins.half().float()  # values the float16 tiles hold


def _packed(form: str, n: int, k: int, bits: int):
    """A random weight in one of the kernels' scale forms: ``(codes, scales, dense,
    mins)``, ``dense [n, k]`` exactly the values the form holds and ``mins [n, k]``
    each weight's min (the value of code 0).  pair: float16 scale and min per 32
    (Q4_1, Q5_1); offset: float16 d per 32 and min -8 d / -16 d (Q4_0, Q5_0); super:
    float16 d, dmin per 256 and 6-bit sc, m per 32, scale d sc and min -dmin m (Q4_K,
    Q5_K); six: 6-bit codes, float16 d per 256 and int8 sc per 16, d sc (q - 32) (Q6_K)."""
    q, scale, mins = _q4_weight(n, k, 2**bits)
    gen = torch.Generator().manual_seed(7 * n + k)
    if form == "six":
        d = (torch.rand(n, k // 256, generator=gen) * 1e-4 + 1e-5).half()
        sc = torch.randint(-128, 128, (n, k // 16), generator=gen, dtype=torch.int8)
        codes, scales = lowbit_cpu.pack_q6(q, d, sc)
        per16 = (d.float().repeat_interleave(16, 1) * sc).repeat_interleave(16, 1)
        return codes, scales, (q - 32).float() * per16, -32 * per16
    if form == "pair":
        codes, scales = lowbit_cpu.pack_q4(q, scale, mins)
    elif form == "offset":
        scale = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().float()
        codes, scales = lowbit_cpu.pack_q4_offset(q, scale.half(), five=bits == 5)
        mins = scale * -(2.0 ** (bits - 1))
    else:
        d = (torch.rand(n, k // 256, generator=gen) * 1e-3 + 1e-4).half()
        dmin = (torch.rand(n, k // 256, generator=gen) * 3e-3).half()
        sc = torch.randint(0, 64, (n, k // 32), generator=gen)
        m = torch.randint(0, 64, (n, k // 32), generator=gen)
        codes, scales = lowbit_cpu.pack_q4_super(q, d, dmin, sc, m)
        scale = d.float().repeat_interleave(8, 1) * sc
        mins = -(dmin.float().repeat_interleave(8, 1) * m)
    dense = (q.float().view(n, -1, 32) * scale[..., None] + mins[..., None]).view(n, k)
    return codes, scales, dense, mins.repeat_interleave(32, 1)


FORMS = [(f, b) for f in ("pair", "offset", "super") for b in (4, 5)] + [("six", 6)]


@pytest.mark.parametrize(("form", "bits"), FORMS)
def test_q4_gemm_matches_quantized_reference(isa: int, cut: float, bits: int, form: str) -> None:
    # 5 bits: codes up to 31, the fifth bits in a plane after the tiles (Q5_0/1/K);
    # 6 bits (Q6_K): a plane of sixth bits after that.
    n, k = 48, (96 if form in ("pair", "offset") else 512)
    codes, scale_min, dense, mins = _packed(form, n, k, bits)
    assert codes.numel() == n * k * bits // 8  # the file's bits per weight
    # The file's bytes for the scales too, per 256 weights: 16 bytes (pair: Q4_1's
    # two float16 per 32), 16 (offset: Q4_0's one), 16 (super: Q4_K's 12 bytes and two
    # float16), 18 (six: Q6_K's 16 int8 and a float16).
    assert scale_min.nbytes * 256 == n * k * {"pair": 32, "six": 18}.get(form, 16)
    assert lowbit_cpu.q4_inputs(codes.view(n, -1), scale_min) == k
    assert lowbit_cpu.q4_outputs(k, scale_min) == n
    torch.testing.assert_close(
        torch.ops.minivllm_cpu.q4_dequantize(codes, scale_min, k, torch.float32),
        dense,
        rtol=0,
        atol=0,
    )
    # What a prefill chunk past Q4_MAX_TOKENS multiplies: the same values in
    # bfloat16, rounded as torch rounds (written directly where the CPU has it).
    assert torch.equal(
        torch.ops.minivllm_cpu.q4_dequantize(codes, scale_min, k, torch.bfloat16),
        dense.to(torch.bfloat16),
    )
    # blocks of 4 tokens (AVX-512; 2 on AVX2) with remainders of 2 and 1; from 8 tokens
    # AMX, in blocks of 8 (a partial one)
    gen = torch.Generator().manual_seed(n * k + bits)
    for rows in (1, 3, 4, 6, 8, 17, 64):
        x = torch.randn(rows, k, generator=gen) * torch.linspace(0.1, 3, k)  # groups' ranges
        got = torch.ops.minivllm_cpu.q4_gemm(x, codes, scale_min)
        # The mins multiply the exact sums of their inputs; the codes the quantized inputs.
        xq = _quantized(x, 32)
        want = xq @ (dense - mins).T + x @ mins.T
        # Only float32 rounding apart: the kernels sum the same terms in another order
        # (super: d * sc per 256 scaled after the group sums), which moves a result by
        # at most a few dozen ulps of the terms' absolute sum; one code off moves it by
        # about 1/k of that sum, some 250 times the bound at k = 512.
        terms = xq.abs() @ (dense - mins).abs().T + x.abs() @ mins.abs().T
        assert ((got - want).abs() <= 64 * torch.finfo(torch.float32).eps * terms).all()
        # Two int8 terms: close to the float product (one term alone is ~1e-2 off).
        assert _near_float(got, x, dense, 32, cut)
        # A token's result does not depend on its batch (each token tile sums in the
        # same order): what batch-invariant decoding relies on.
        for r in {0, rows - 1}:
            alone = torch.ops.minivllm_cpu.q4_gemm(x[r : r + 1], codes, scale_min)
            assert torch.equal(got[r : r + 1], alone), (rows, r)


def test_stacked_weight_computes_each_segment_as_alone(isa: int) -> None:
    # A weight stacked from parts of different forms (a Q4_K q and k with a Q6_K v)
    # gives each row what its part alone gives, bit for bit, and its dense values.
    k = 512
    parts = [
        _packed(f, n, k, b) for f, n, b in (("super", 32, 4), ("six", 16, 6), ("offset", 48, 5))
    ]
    codes, scales = lowbit_cpu.pack_q4_stack([p[:2] for p in parts], k)
    assert scales.dtype == torch.int32 and codes.shape[0] == scales.shape[0] == 96
    assert lowbit_cpu.q4_inputs(codes, scales) == k and lowbit_cpu.q4_outputs(k, scales) == 96
    dense = torch.cat([p[2] for p in parts])
    assert torch.equal(torch.ops.minivllm_cpu.q4_dequantize(codes, scales, k, torch.float32), dense)
    gen = torch.Generator().manual_seed(k)
    for rows in (1, 6, 17):
        x = torch.randn(rows, k, generator=gen)
        got = torch.ops.minivllm_cpu.q4_gemm(x, codes, scales)
        alone = [torch.ops.minivllm_cpu.q4_gemm(x, *p[:2]) for p in parts]
        assert torch.equal(got, torch.cat(alone, dim=1))
    # Bands of whole 16-row tiles (what a large batch expands at a time), across the
    # segments' borders: the weight's own rows, in float32 and bfloat16.
    for row0, rows in ((0, 16), (16, 64), (32, 16), (48, 48), (80, 16)):
        for dtype in (torch.float32, torch.bfloat16):
            band = torch.ops.minivllm_cpu.q4_dequantize(codes, scales, k, dtype, row0, rows)
            assert torch.equal(band, dense[row0 : row0 + rows].to(dtype)), (row0, rows)
    for row0, rows in ((8, 16), (0, 24), (80, 32), (-16, 16)):
        with pytest.raises(RuntimeError, match="whole 16-row tiles"):
            torch.ops.minivllm_cpu.q4_dequantize(codes, scales, k, torch.float32, row0, rows)
    # A header that claims more bytes than the tensors hold is refused, not read.
    bad = scales.clone()
    bad.view(-1)[4 + 3] = codes.numel() + 1  # segment 0's code bytes
    with pytest.raises(RuntimeError, match="outside its tensors"):
        torch.ops.minivllm_cpu.q4_gemm(torch.randn(1, k), codes, bad)


def test_the_second_term_goes_where_the_remainder_carries_weight(isa: int) -> None:
    """A token's second int8 term is kept in the groups whose remainder holds more than
    ``residual_cut`` of its mean energy per group: a group of large inputs among small
    ones keeps it, the small ones do not, an all-zero token has none (and gives 0).
    Cut 0 is two terms everywhere, a huge cut one term everywhere, on every code path."""
    n, k = 32, 256
    codes, scale_min, dense, mins = _packed("pair", n, k, 4)
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, k, generator=gen) * 0.05
    x[0, 64:96] = torch.randn(32, generator=gen) * 4  # group 2 of token 0: large inputs
    x[1] = 0
    keep = _second_term_groups(x, 32, lowbit_cpu.FAST_RESIDUAL_CUT)
    assert keep[0].tolist() == [False, False, True] + [False] * 5
    assert not keep[1].any()
    assert keep[2].any() and not keep[2].all()  # like inputs: about half the groups

    def want(seen: torch.Tensor) -> torch.Tensor:
        return seen @ (dense - mins).T + x @ mins.T

    for cut, seen in (
        (lowbit_cpu.FAST_RESIDUAL_CUT, _quantized(x, 32, lowbit_cpu.FAST_RESIDUAL_CUT)),
        (0.0, _quantized(x, 32, 0.0)),
        (1e30, _one_term(x, 32)),
    ):
        with residual_cut(cut):
            assert lowbit_cpu.residual_cut() == pytest.approx(cut)  # -1 reads it back
            got = torch.ops.minivllm_cpu.q4_gemm(x, codes, scale_min)
        terms = seen.abs() @ (dense - mins).abs().T + x.abs() @ mins.abs().T
        bound = 64 * torch.finfo(torch.float32).eps * terms
        assert ((got - want(seen)).abs() <= bound).all(), cut
        assert torch.equal(got[1], torch.zeros(n))


def test_the_residual_cut_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """``MINIVLLM_CPU_RESIDUAL_CUT`` sets the kernels' cut when they load; a value that
    is not a number >= 0 is refused with the fix."""
    code = (
        "from minivllm.kernels import lowbit_cpu; lowbit_cpu.available(); "
        "print(lowbit_cpu.residual_cut())"
    )
    env = {**os.environ, "MINIVLLM_CPU_RESIDUAL_CUT": "3e-5"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) == pytest.approx(3e-5)
    monkeypatch.delenv("MINIVLLM_CPU_RESIDUAL_CUT", raising=False)
    assert envs.cpu_residual_cut() == lowbit_cpu.DEFAULT_RESIDUAL_CUT == 0.0
    for bad in ("-1", "nan", "inf", "lots"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("MINIVLLM_CPU_RESIDUAL_CUT", bad)
            with pytest.raises(ValueError, match="MINIVLLM_CPU_RESIDUAL_CUT"):
                envs.cpu_residual_cut()


@pytest.mark.parametrize("form", ["pair", "offset", "super"])
@pytest.mark.parametrize("bits", [4, 5])
def test_q4_gemm_on_amx_gives_the_vnni_kernels_bits(bits: int, form: str) -> None:
    """AMX tiles compute the same integer sums and scale them with the VNNI kernel's
    operations in its order: the same bits for every row, so a request's values do not
    depend on whether its batch had 12 tokens or more (batch invariance); q5 weights
    (a fifth bits' plane) too."""
    if lowbit_cpu.isa() < 2 or not lowbit_cpu.amx():
        pytest.skip("this CPU (or its kernel) offers no AMX")
    n, k = 64, 512
    codes, scale_min = _packed(form, n, k, bits)[:2]
    x = torch.randn(41, k) * torch.linspace(0.1, 3, k)
    try:
        for rows in (12, 13, 16, 23, 41):
            on_amx = torch.ops.minivllm_cpu.q4_gemm(x[:rows], codes, scale_min)
            lowbit_cpu.amx(0)
            on_vnni = torch.ops.minivllm_cpu.q4_gemm(x[:rows], codes, scale_min)
            lowbit_cpu.amx(1)
            assert torch.equal(on_amx, on_vnni)
            assert torch.equal(on_amx[:1], torch.ops.minivllm_cpu.q4_gemm(x[:1], codes, scale_min))
    finally:
        lowbit_cpu.amx(1)


def _int16_codes(x: torch.Tensor, group: int) -> torch.Tensor:
    """``x`` as the AVX2 q8 kernel sees it: one int16 code per input, times
    max |x| / 32767 per ``group`` inputs (codes round x * (1 / scale), as the kernel)."""
    g = x.view(x.shape[0], -1, group)
    scale = g.abs().amax(-1, keepdim=True) / 32767
    inv = torch.where(scale > 0, 1 / scale, 0)
    return (torch.round(g * inv) * scale).view_as(x)


def _q8_act_group(k: int) -> int:
    """Inputs per activation scale of the q8 kernels' two int8 terms on AMX: 256 / 128
    where they divide the inputs, else 64."""
    return 256 if k % 256 == 0 else 128 if k % 128 == 0 else 64


def _q8_seen(isa: int, k: int, rows: int):
    """``x`` as the q8 kernel of ``isa`` sees ``rows`` tokens of ``k`` inputs: AMX
    (from 3 tokens) two int8 terms per 256 / 128 / 64 inputs, the portable kernel two
    int8 terms per 64, AVX2 and AVX-512 one int16 code per input, scaled per 64."""
    if isa == AMX and rows >= 3:
        return lambda x: _quantized(x, _q8_act_group(k))
    if isa == 0:
        return lambda x: _quantized(x, 64)
    return lambda x: _int16_codes(x, 64)


@pytest.mark.parametrize("k", [192, 384, 512])
def test_q8_gemm_matches_quantized_reference(isa: int, cut: float, k: int) -> None:
    n = 43  # blocks of four rows (their sums taken together) and a tail of three
    gen = torch.Generator().manual_seed(0)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scale = torch.rand(n, generator=gen) * 0.01
    dense = w.float() * scale[:, None]
    # token tiles of 8, 4, 2 and 1 and their remainders
    for rows in (1, 2, 5, 9, 15, 32):
        seen = _q8_seen(isa, k, rows)
        x = torch.randn(rows, k, generator=gen) * torch.linspace(0.1, 3, k)
        x[:, 7] *= 40  # one large input sets its group's scale
        got = torch.ops.minivllm_cpu.q8_gemm(x, w, scale)
        torch.testing.assert_close(got, seen(x) @ dense.T, rtol=1e-5, atol=1e-4)
        assert _near_float(got, x, dense, 64, cut)
        # bfloat16 row scales (the model's form) are read as their float values.
        got16 = torch.ops.minivllm_cpu.q8_gemm(x, w, scale.bfloat16())
        want16 = seen(x) @ (w.float() * scale.bfloat16().float()[:, None]).T
        torch.testing.assert_close(got16, want16, rtol=1e-5, atol=1e-4)
        # A token's outputs do not depend on the tokens beside it (batch invariance):
        # on AMX (from 3 rows) only with amx=False, the row-independent path's call.
        fixed = torch.ops.minivllm_cpu.q8_gemm(x, w, scale, False)
        if isa != AMX or rows < 3:
            assert torch.equal(fixed, got)
        for r in (0, rows - 1):
            alone = torch.ops.minivllm_cpu.q8_gemm(x[r : r + 1], w, scale)
            assert torch.equal(fixed[r : r + 1], alone)


@pytest.mark.parametrize("k", [576, 640, 2048])
def test_q8_gemm_coarse_takes_one_int8_term_per_token(k: int) -> None:
    """The LM head's coarse kernel (AVX-512 VNNI): x as one int8 term per 256 / 128 /
    64 inputs, nothing of what that rounding left; a token's outputs the same alone
    as in any batch."""
    if lowbit_cpu.isa() < 2:
        pytest.skip("the coarse kernel is AVX-512 VNNI only")
    n = 43
    gen = torch.Generator().manual_seed(3)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scale = torch.rand(n, generator=gen) * 0.01
    dense = w.float() * scale[:, None]
    for rows in (1, 3, 6, 17):
        x = torch.randn(rows, k, generator=gen) * torch.linspace(0.1, 3, k)
        x[:, 9] *= 30
        got = torch.ops.minivllm_cpu.q8_gemm_coarse(x, w, scale)
        one_term = _one_term(x, _q8_act_group(k))
        torch.testing.assert_close(got, one_term @ dense.T, rtol=1e-5, atol=1e-4)
        # coarser than the two-term / int16 forms, yet ~1% of the product
        err = (got - x @ dense.T).norm() / (x @ dense.T).norm()
        assert 1e-3 < err < 3e-2
        for r in range(rows):
            alone = torch.ops.minivllm_cpu.q8_gemm_coarse(x[r : r + 1], w, scale)
            assert torch.equal(got[r : r + 1], alone)


def test_q8_gemm_on_amx_reads_whole_tiles_and_leaves_the_rest() -> None:
    """The AMX q8 kernel computes whole 16-row weight tiles; the rows after the last
    whole tile (and every row of a weight under 16 rows) run on the VNNI kernel, so
    each output row must equal the reference whatever the split."""
    if lowbit_cpu.isa() < 2 or not lowbit_cpu.amx():
        pytest.skip("this CPU (or its kernel) offers no AMX")
    gen = torch.Generator().manual_seed(2)
    for n, k, rows in ((7, 128, 12), (16, 64, 3), (33, 640, 64), (50, 1024, 17)):
        w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        scale = torch.rand(n, generator=gen) * 0.01
        x = torch.randn(rows, k, generator=gen)
        got = torch.ops.minivllm_cpu.q8_gemm(x, w, scale)
        want = _quantized(x, _q8_act_group(k)) @ (w.float() * scale[:, None]).T
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_q8_gemm_reads_q8_0_scales_per_32_inputs(isa: int) -> None:
    # Q8_0 as stored: the file's codes with a float16 scale per 32 inputs, on one
    # int16 code per input (AVX2, AVX-512) or two int8 terms (portable).
    n, k = 36, 256
    gen = torch.Generator().manual_seed(1)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scale = (torch.rand(n, k // 32, generator=gen) * 0.01 + 1e-4).half()
    scale[3, 2] = 0  # an all-zero block of the file
    dense = (w.float().view(n, -1, 32) * scale.float()[..., None]).view(n, k)
    seen = _quantized if isa == 0 else _int16_codes
    for rows in (1, 3, 8, 17, 64):
        x = torch.randn(rows, k, generator=gen) * torch.linspace(0.1, 3, k)
        x[:, 40] *= 50
        got = torch.ops.minivllm_cpu.q8_gemm(x, w, scale)
        torch.testing.assert_close(got, seen(x, 64) @ dense.T, rtol=1e-5, atol=1e-4)
        # The per-32 scales matter: one scale a row would give other outputs.
        flat = torch.ops.minivllm_cpu.q8_gemm(x, w, scale.float().mean(1))
        assert (flat - got).abs().max() > 1e-2
        for r in (0, rows - 1):
            alone = torch.ops.minivllm_cpu.q8_gemm(x[r : r + 1], w, scale)
            assert torch.equal(got[r : r + 1], alone)
    with pytest.raises(RuntimeError, match="scale"):
        torch.ops.minivllm_cpu.q8_gemm(x, w, scale.float())  # per-32 scales are float16


def test_shape_errors_are_refused() -> None:
    q, scale, mins = _q4_weight(32, 64)
    codes, scale_min = lowbit_cpu.pack_q4(q, scale, mins)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.minivllm_cpu.q4_gemm(torch.randn(1, 40), codes, scale_min)
    with pytest.raises(RuntimeError, match="int8"):
        torch.ops.minivllm_cpu.q8_gemm(torch.randn(1, 64), torch.zeros(4, 64), torch.ones(4))


def test_kernels_trace_opaquely() -> None:
    # Dynamo/Inductor see the ops through their fake shapes and call them as they are.
    q, scale, mins = _q4_weight(32, 64)
    codes, scale_min = lowbit_cpu.pack_q4(q, scale, mins)
    w8 = torch.randint(-127, 128, (16, 64), dtype=torch.int8)
    s8 = torch.rand(16)

    def f(x: torch.Tensor) -> torch.Tensor:
        h = torch.ops.minivllm_cpu.q4_gemm(x, codes, scale_min)
        return torch.ops.minivllm_cpu.q8_gemm(torch.cat([h, h], 1).relu(), w8, s8) * 2

    x = torch.randn(3, 64)
    torch.testing.assert_close(torch.compile(f, backend="aot_eager", dynamic=True)(x), f(x))


def test_a_failing_compiler_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = tmp_path / "cxx"
    compiler.write_text("#!/bin/sh\necho 'no room left on this disk' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    target = tmp_path / "kernels" / "lowbit.so"
    with pytest.raises(RuntimeError, match="(?s)kernels failed.*no room left"):
        lowbit_cpu._build(target)
    assert not target.exists() and list(target.parent.iterdir()) == []  # nothing half-built


def test_a_start_up_builds_in_the_background_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`start_building` returns at once with the compiler running on a thread; loading
    waits for that build (no second one), and a build error reaches the loader."""
    import threading
    import time

    target = tmp_path / "lowbit.so"
    calls: list[str] = []
    release = threading.Event()

    def slow_build(path: Path) -> None:
        calls.append(threading.current_thread().name)
        release.wait(5)
        path.write_bytes(b"built")

    monkeypatch.setattr(lowbit_cpu, "_state", {})
    monkeypatch.setattr(lowbit_cpu, "_library_path", lambda: target)
    monkeypatch.setattr(lowbit_cpu, "_build", slow_build)
    started = time.perf_counter()
    lowbit_cpu.start_building()
    lowbit_cpu.start_building()  # a second call joins the running build
    assert time.perf_counter() - started < 1.0 and not target.exists()
    release.set()
    lowbit_cpu._wait_for_build(target)
    assert target.read_bytes() == b"built" and calls == ["minivllm-kernel-build"]
    lowbit_cpu.start_building()  # the library exists: nothing to do
    assert "build" not in lowbit_cpu._state and len(calls) == 1

    def failing_build(path: Path) -> None:
        raise RuntimeError("compiling minivllm's CPU kernels failed: no room left")

    target.unlink()
    monkeypatch.setattr(lowbit_cpu, "_build", failing_build)
    lowbit_cpu.start_building()
    with pytest.raises(RuntimeError, match="no room left"):
        lowbit_cpu._wait_for_build(target)


@pytest.mark.parametrize("rows, cols", [(3, 5000), (32, 8192)])
def test_int8_mm_scale_rounds_as_the_torch_ops(rows: int, cols: int) -> None:
    """The one-pass epilogue of the two-term int8 product gives the float32 values of
    the separate torch ops, bit for bit (no fused multiply-add on any ISA path)."""
    gen = torch.Generator().manual_seed(11)
    acc = torch.randint(-(2**24), 2**24, (2 * rows, cols), dtype=torch.int32, generator=gen)
    hi = torch.rand(rows, 1, generator=gen) * 1e-3
    lo = torch.rand(rows, 1, generator=gen) * 1e-6
    scale = torch.rand(cols, generator=gen).to(torch.bfloat16)
    both = acc.float()
    expected = both[:rows].mul_(hi).add_(both[rows:].mul_(lo)).mul_(scale.float())
    got = torch.ops.minivllm_cpu.int8_mm_scale(acc, hi, lo, scale)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_int8_act_mm_uses_the_epilogue_and_matches_float() -> None:
    from minivllm.model_executor.layers.quantized_linear import int8_act_mm

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(20, 256, generator=gen)
    w8 = torch.randint(-127, 128, (3000, 256), dtype=torch.int8, generator=gen)
    scales = (torch.rand(3000, generator=gen) / 100).to(torch.bfloat16)
    reference = x @ (w8.float() * scales.float()[:, None]).t()
    got = int8_act_mm(x, w8, scales)
    torch.testing.assert_close(got, reference, rtol=2e-4, atol=2e-3)


def test_block_cache_reuses_large_blocks_within_its_limit() -> None:
    """Once installed (as every CPU worker does), a freed block of 16 MiB or more is
    handed to the next tensor of its size instead of a fresh mapping; blocks past the
    limit go back to the system; small tensors and tensor contents are unaffected."""

    mib = 1 << 20
    lowbit_cpu.install_block_cache(0)  # gives back what earlier tests left cached
    assert lowbit_cpu.install_block_cache(64 * mib)
    try:
        first = torch.full((20 * mib // 4,), 7.0)
        address = first.data_ptr()
        before = lowbit_cpu.block_cache_stats()
        del first
        second = torch.empty(20 * mib // 4)
        after = lowbit_cpu.block_cache_stats()
        assert second.data_ptr() == address and after["reused"] == before["reused"] + 1
        second.fill_(3.0)
        assert float(second.sum()) == 3.0 * second.numel()
        del second
        # Five 22 MiB blocks (24 MiB rounded) freed together: the 64 MiB limit keeps two.
        blocks = [torch.ones(22 * mib, dtype=torch.uint8) for _ in range(5)]
        del blocks
        assert lowbit_cpu.block_cache_stats()["cached_bytes"] <= 64 * mib
        # A new size freed into a full cache pushes out the oldest blocks of other sizes,
        # and is the one the next tensor of its size gets.
        third = torch.empty(40 * mib, dtype=torch.uint8)
        address = third.data_ptr()
        del third
        stats = lowbit_cpu.block_cache_stats()
        assert stats["cached_bytes"] <= 64 * mib
        fourth = torch.empty(40 * mib, dtype=torch.uint8)
        assert fourth.data_ptr() == address
        assert lowbit_cpu.block_cache_stats()["reused"] == stats["reused"] + 1
        del fourth
        lowbit_cpu.install_block_cache(30 * mib)  # a lower limit gives back what is over
        assert lowbit_cpu.block_cache_stats()["cached_bytes"] <= 30 * mib
        small = torch.arange(1000)
        assert int(small.sum()) == 999 * 1000 // 2
    finally:
        lowbit_cpu.install_block_cache(envs.cpu_block_cache_bytes())


@pytest.mark.parametrize("k", [576, 640, 2048])
def test_q8_tiled_gemm_matches_one_and_two_term_references(cut: float, k: int) -> None:
    """The tiled LM head kernel (AVX-512 VNNI): x as one int8 term per 256 / 128 / 64
    inputs, or two (x and what its rounding left), against the int8 codes the tiles
    hold; every block of term rows (8, 4, 2, 1; four tiles at once under 4 rows)
    gives a token the logits it gets alone."""
    if lowbit_cpu.isa() < 2:
        pytest.skip("the tiled head kernel is AVX-512 VNNI only")
    n = 96  # six tiles: four at once and a tail of two under 4 term rows
    gen = torch.Generator().manual_seed(5)
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    tiles = lowbit_cpu.pack_q8_tiles(w.clone())
    assert torch.equal(lowbit_cpu.unpack_q8_tiles(tiles), w)
    assert tiles[0, 1, 4 * 3 + 2] == int(w[3, 4 + 2]) + 128  # row 3, input 6
    scale = torch.rand(n, generator=gen) * 0.01
    dense = w.float() * scale[:, None]
    group = _q8_act_group(k)
    for rows in (1, 2, 3, 5, 15, 17):
        x = torch.randn(rows, k, generator=gen) * torch.linspace(0.1, 3, k)
        x[:, 9] *= 30
        exact = x @ dense.T
        for terms, seen in ((1, _one_term(x, group)), (2, _quantized(x, group))):
            got = torch.ops.minivllm_cpu.q8_tiled_gemm(x, tiles, scale, terms)
            # float32 sums in another order than the reference's: within 64 ulps of
            # the terms' absolute sum (one code off moves a result by ~1/k of it)
            bound = 64 * torch.finfo(torch.float32).eps * (seen.abs() @ dense.abs().T)
            assert ((got - seen @ dense.T).abs() <= bound).all(), (terms, rows)
            err = ((got - exact).norm() / exact.norm()).item()
            # one term ~1% of the product; two ~1/127 of that where every group has both
            if terms == 1:
                assert 1e-3 < err < 3e-2, err
            else:
                assert err < 3e-4 if cut == 0 else _near_float(got, x, dense, group, cut)
            for r in range(rows):
                alone = torch.ops.minivllm_cpu.q8_tiled_gemm(x[r : r + 1], tiles, scale, terms)
                assert torch.equal(got[r : r + 1], alone)
