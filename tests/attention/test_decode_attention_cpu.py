"""minivllm's C++ decode attention (``minivllm_cpu::decode_attention``) against the
torch-op form of `decode_attention` it replaces in the CPU decode graph."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minivllm.attention.decode_graph import decode_attention
from minivllm.attention.forward_context import DecodeStep
from minivllm.kernels import lowbit_cpu

pytestmark = pytest.mark.skipif(not lowbit_cpu.available(), reason="no C++ compiler here")

BLOCK, BLOCKS, NKV = 4, 64, 2


@pytest.fixture(params=[2, 1, 0], ids=["avx512", "avx2", "portable"])
def isa(request):
    """Each code path of the kernel this CPU has (lowered with `lowbit_cpu.isa`)."""
    best = lowbit_cpu.isa()
    if request.param > best:
        pytest.skip("this CPU lacks that instruction set")
    lowbit_cpu.isa(request.param)
    yield request.param
    lowbit_cpu.isa(best)


def _layer(dtype: torch.dtype, window: int | None, hd: int, nh: int = 6) -> SimpleNamespace:
    gen = torch.Generator().manual_seed(1)
    cache = torch.randn(2, BLOCKS, BLOCK, NKV, hd, generator=gen).to(dtype)
    one = torch.ones(())
    return SimpleNamespace(
        kv_cache=cache, kv_group=0, num_heads=nh, scale=hd**-0.5, sliding_window=window,
        k_scale=one, v_scale=one,
    )  # fmt: skip


def _run(layer: SimpleNamespace, native: bool, lens: list[int]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(2)
    b, hd, nh = len(lens), layer.kv_cache.shape[-1], layer.num_heads
    query = torch.randn(b, nh * hd, generator=gen)
    key = torch.randn(b, NKV * hd, generator=gen)
    value = torch.randn(b, NKV * hd, generator=gen)
    # Request i owns blocks 1 + 5 i ..., shuffled so the table is not the identity.
    width = 5
    table = torch.stack([torch.randperm(width, generator=gen) + 1 + width * i for i in range(b)])
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    last = seq_lens.long() - 1
    slots = table.gather(1, (last // BLOCK)[:, None]).squeeze(1).long() * BLOCK + last % BLOCK
    step = DecodeStep(seq_lens, [table.to(torch.int32)], [slots])
    return decode_attention(layer, query, key, value, step, native)


# Head size 16: the AVX-512 form where the CPU has it; 24: the plain C++ loops.
@pytest.mark.parametrize("hd", [16, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("lens", [[1], [7, 20, 13], [3, 1, 19, 17, 9, 2, 11, 16, 8, 5]])
def test_native_decode_attention_matches_torch_ops(
    hd: int, dtype: torch.dtype, window: int | None, lens: list[int]
) -> None:
    ref_layer, native_layer = _layer(dtype, window, hd), _layer(dtype, window, hd)
    want = _run(ref_layer, False, lens)
    got = _run(native_layer, True, lens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The step's K/V rows were written in place, exactly as the torch ops write them.
    assert torch.equal(native_layer.kv_cache, ref_layer.kv_cache)


# Head sizes and query heads per KV head that take every register-blocked form:
# 64- and 16-column value chunks (AVX-512), 24- and 8-column ones (AVX2), groups of
# 4 (3) heads and what is left, keys four at a time and a tail.
@pytest.mark.parametrize("hd,nh", [(64, 8), (80, 14), (256, 2), (128, 4), (40, 6)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_decode_attention_forms(isa: int, hd: int, nh: int, dtype: torch.dtype) -> None:
    lens = [1, 4, 19, 13, 9]
    ref_layer, native_layer = _layer(dtype, None, hd, nh), _layer(dtype, None, hd, nh)
    want = _run(ref_layer, False, lens)
    got = _run(native_layer, True, lens)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    assert torch.equal(native_layer.kv_cache, ref_layer.kv_cache)


@pytest.mark.parametrize(
    "bad,match",
    [("block", "outside the cache's"), ("length", "do not fit"), ("slot", "slot")],
)
def test_native_decode_attention_refuses_tables_outside_the_cache(bad: str, match: str) -> None:
    # The kernels read and write through the block table unchecked: a table entry,
    # length or slot outside the cache is an error, not a read past the cache.
    layer = _layer(torch.float32, None, 16)
    b, hd = 2, 16
    query, key, value = torch.randn(b, 6 * hd), torch.randn(b, NKV * hd), torch.randn(b, NKV * hd)
    table = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    lens = torch.tensor([5, 6], dtype=torch.int32)
    slots = torch.tensor([2 * BLOCK, 4 * BLOCK + 1])
    if bad == "block":
        table[1, 1] = BLOCKS
    elif bad == "length":
        lens[0] = 2 * BLOCK + 1
    else:
        slots[1] = BLOCKS * BLOCK
    with pytest.raises(RuntimeError, match=match):
        torch.ops.minivllm_cpu.decode_attention(
            query, key, value, layer.kv_cache, table, lens, slots, hd**-0.5, 0
        )
