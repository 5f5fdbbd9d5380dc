"""oneDNN-packed linear weights on CPU: same results as F.linear, eager and compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm.model_executor.layers import cpu_gemm
from minivllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear
from minivllm.model_executor.layers.vocab_embedding import LogitsProcessor, ParallelLMHead

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


class TwoLayerMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = MergedColumnParallelLinear(48, [40, 40], bias=True)
        self.down = RowParallelLinear(40, 48)
        self.lm_head = ParallelLMHead(100, 48)
        self.logits = LogitsProcessor(100)
        gen = torch.Generator().manual_seed(0)
        for p in self.parameters():
            p.data.copy_(torch.randn(p.shape, generator=gen) * 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.logits(self.lm_head, x + self.down(F.silu(gate) * up))


@pytest.fixture
def spy(monkeypatch):
    """Records, per GEMM, whether it ran through a packed weight."""
    seen: list[bool] = []
    real = cpu_gemm.packed_copy

    def packed_copy(weight):
        packed = real(weight)
        seen.append(packed is not None)
        return packed

    monkeypatch.setattr(cpu_gemm, "packed_copy", packed_copy)
    return seen


@pytest.mark.parametrize("rows", [1, 5, 32, 100])
def test_packed_linear_matches_f_linear(rows):
    layer = MergedColumnParallelLinear(48, [24, 40], bias=True)
    torch.nn.init.normal_(layer.weight)
    torch.nn.init.normal_(layer.bias)
    x = torch.randn(rows, 48)
    expected = F.linear(x, layer.weight, layer.bias)
    assert cpu_gemm.pack_linear_weights(layer, torch.device("cpu"), torch.float32) == 1
    assert layer.use_packed_gemm and cpu_gemm.packed_copy(layer.weight) is not None
    torch.testing.assert_close(layer(x), expected, atol=1e-4, rtol=1e-4)
    # Leading dims and non-contiguous inputs are flattened for oneDNN.
    x3 = torch.randn(3, 48, rows).transpose(1, 2)
    torch.testing.assert_close(
        layer(x3), F.linear(x3, layer.weight, layer.bias), atol=1e-4, rtol=1e-4
    )


def test_pack_model_eager_and_compiled_use_packed_weights(spy):
    model = TwoLayerMLP()
    x = torch.randn(7, 48)
    with torch.inference_mode():
        expected = model(x)
        # up, down and the LM head; the LM head's weight is packed like the others.
        assert cpu_gemm.pack_linear_weights(model, torch.device("cpu"), torch.float32) == 3
        torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)
        assert spy == [True] * 3
        spy.clear()
        compiled = torch.compile(model, backend="inductor", dynamic=True, fullgraph=True)
        for n in (7, 3):
            torch.testing.assert_close(compiled(x[:n]), expected[:n], atol=1e-4, rtol=1e-4)
    # The compiled graph calls the op, which found the packed weights every time.
    assert len(spy) == 6 and all(spy)


def test_changed_weight_falls_back_to_f_linear(spy):
    layer = RowParallelLinear(16, 8)
    torch.nn.init.normal_(layer.weight)
    cpu_gemm.pack_linear_weights(layer, torch.device("cpu"), torch.float32)
    layer.weight.data = torch.randn(8, 16)  # what module.to(...) does to a parameter
    x = torch.randn(4, 16)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight))
    assert spy == [False]


def test_packing_only_where_supported(monkeypatch):
    cpu = torch.device("cpu")
    assert cpu_gemm.packed_gemm_supported(cpu, torch.float32)
    assert not cpu_gemm.packed_gemm_supported(cpu, torch.float16)
    assert not cpu_gemm.packed_gemm_supported(torch.device("meta"), torch.float32)
    layer = RowParallelLinear(16, 8)
    assert cpu_gemm.pack_linear_weights(layer, cpu, torch.float16) == 0
    monkeypatch.setenv("MINIVLLM_CPU_PACKED_GEMM", "0")
    assert not cpu_gemm.packed_gemm_supported(cpu, torch.float32)
    assert cpu_gemm.pack_linear_weights(layer, cpu, torch.float32) == 0
    assert not layer.use_packed_gemm
