"""minivllm's CPU encoder attention kernel against float64 SDPA, prompt by prompt:
ragged lengths (tails of 1-3 rows and 1-3 key vectors), an empty prompt, grouped
KV heads, head sizes the vector path takes and one it does not, both dtypes, and
the portable loops forced."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm.kernels import lowbit_cpu

pytestmark = pytest.mark.skipif(not lowbit_cpu.available(), reason="no C++ compiler")


def _reference(q, k, v, starts, scale):
    out = torch.zeros(q.shape, dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for b, e in zip(starts[:-1], starts[1:], strict=True):
        if e == b:
            continue
        qq, kk, vv = (x[b:e].double().transpose(0, 1) for x in (q, k, v))
        kk, vv = kk.repeat_interleave(group, 0), vv.repeat_interleave(group, 0)
        out[b:e] = F.scaled_dot_product_attention(qq, kk, vv, scale=scale).transpose(0, 1)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(12, 12, 32), (8, 2, 64), (4, 4, 24)])
@pytest.mark.parametrize("portable", [False, True])
def test_matches_sdpa_per_prompt(dtype, heads, kv_heads, head_dim, portable) -> None:
    torch.manual_seed(0)
    lengths = [1, 5, 0, 17, 66, 130, 3]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    t = starts[-1]
    q = torch.randn(t, heads, head_dim).to(dtype)
    k = torch.randn(t, kv_heads, head_dim).to(dtype)
    v = torch.randn(t, kv_heads, head_dim).to(dtype)
    scale = head_dim**-0.5
    got = torch.ops.minivllm_cpu.encoder_attention(q, k, v, torch.tensor(starts), scale, portable)
    assert got.dtype == dtype and got.shape == q.shape
    expected = _reference(q, k, v, starts, scale)
    atol = 1e-5 if dtype == torch.float32 else 1e-2  # bfloat16: the output's own rounding
    torch.testing.assert_close(got.double(), expected, atol=atol, rtol=0)


def test_bad_starts_are_refused() -> None:
    q = torch.randn(4, 2, 16)
    with pytest.raises(RuntimeError, match="outside the batch"):
        torch.ops.minivllm_cpu.encoder_attention(q, q, q, torch.tensor([0, 9]), 1.0)
    with pytest.raises(RuntimeError, match="must not decrease"):
        torch.ops.minivllm_cpu.encoder_attention(q, q, q, torch.tensor([0, 3, 1, 4]), 1.0)
