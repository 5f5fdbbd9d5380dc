"""A low-bit (``Q4``) linear gives each row the same bits whatever else is in the
batch: by default on CPUs without bfloat16 hardware (the int4 kernel at every row
count, where it is also the faster one), and everywhere under
``VLLM_BATCH_INVARIANT=1``.  Engine-level checks: tests/engine/test_batch_invariance.py."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers import quantized_linear as ql


def q4_weight(n: int = 64, k: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32)
    scale = torch.rand(n, k // 32) * 0.05
    codes, scale_min = lowbit_cpu.pack_q4(q, scale, -8.0 * scale)
    return codes.view(n, k // 2), scale_min.view(n, -1)


@pytest.mark.parametrize(
    ("bf16_hardware", "invariant"), [(False, False), (True, True), (False, True)]
)
def test_q4_rows_do_not_depend_on_the_batch(
    monkeypatch: pytest.MonkeyPatch, bf16_hardware: bool, invariant: bool
) -> None:
    assert lowbit_cpu.available(), "minivllm's C++ kernels did not build here"
    monkeypatch.setattr(ql, "_bf16_in_hardware", lambda: bf16_hardware)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1" if invariant else "0")
    qweight, scales = q4_weight()
    x = torch.randn(100, 96)  # more rows than `Q4_MAX_TOKENS`
    batched = ql.lowbit_linear(x, qweight, scales, None, ql.Q4)
    alone = torch.cat(
        [ql.lowbit_linear(x[i : i + 1], qweight, scales, None, ql.Q4) for i in range(3)]
    )
    assert torch.equal(batched[:3], alone)
    # And the values are the weight's: close to a float32 GEMM on the dequantized weight.
    dense = x @ ql.dequantize_weight(ql.Q4, qweight, scales).T
    torch.testing.assert_close(batched, dense, rtol=0.02, atol=0.02)


def test_with_bf16_hardware_by_default_large_batches_expand_the_weight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default keeps the faster dense GEMM where bfloat16 runs in hardware; its
    rounding differs from the kernel's, which is why invariance there is opt-in."""
    monkeypatch.setattr(ql, "_bf16_in_hardware", lambda: True)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    qweight, scales = q4_weight()
    x = torch.randn(100, 96)
    batched = ql.lowbit_linear(x, qweight, scales, None, ql.Q4)
    assert not torch.equal(batched[:1], ql.lowbit_linear(x[:1], qweight, scales, None, ql.Q4))
