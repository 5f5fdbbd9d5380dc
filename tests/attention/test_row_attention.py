"""Batch-invariant attention (``VLLM_BATCH_INVARIANT=1``) on the C++ decode kernel:
every query row, prefill or decode, as a request of its own over exactly its keys.
Checked against the per-row SDPA path (an independent computation) on a step that
mixes a decode row, a prefill chunk after a cached prefix and a whole prompt, with
and without a sliding window, and for each row alone against the same row in the
step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minivllm.attention.backends.row_attention import native_row_attention, row_attention
from minivllm.attention.metadata import AttentionMetadata
from minivllm.kernels import lowbit_cpu

pytestmark = pytest.mark.skipif(
    not lowbit_cpu.available(), reason="minivllm's C++ kernels are not built here"
)

BLOCK, NKV, HEADS, HD = 4, 2, 4, 16
# (context length, new tokens): a decode row, a chunk after 6 cached tokens, a prompt
REQUESTS = [(11, 1), (9, 3), (5, 5)]


def _step(dtype: torch.dtype, window: int | None):
    gen = torch.Generator().manual_seed(7)
    blocks = 16
    cache = torch.randn(2, blocks, BLOCK, NKV, HD, generator=gen).to(dtype)
    perm = torch.randperm(blocks - 1, generator=gen) + 1  # scattered blocks, 0 unused
    width = 4
    tables = perm[: len(REQUESTS) * width].view(len(REQUESTS), width).to(torch.int32)
    qsl = [0]
    for _, new in REQUESTS:
        qsl.append(qsl[-1] + new)
    seq_lens = [n for n, _ in REQUESTS]
    meta = AttentionMetadata(
        num_actual_tokens=qsl[-1],
        max_query_len=max(new for _, new in REQUESTS),
        max_seq_len=max(seq_lens),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.zeros(qsl[-1], dtype=torch.long),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )
    layer = SimpleNamespace(
        kv_cache=cache,
        scale=HD**-0.5,
        sliding_window=window,
        k_scale=torch.tensor(1.0),
        v_scale=torch.tensor(1.0),
    )
    # two padding rows after the step's tokens, as a padded graph has
    query = torch.randn(qsl[-1] + 2, HEADS, HD, generator=gen)
    return layer, meta, query


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 3])
def test_native_rows_match_per_row_sdpa(dtype: torch.dtype, window: int | None) -> None:
    layer, meta, query = _step(dtype, window)
    cache_before = layer.kv_cache.clone()
    got = torch.full_like(query, 7.0)
    assert native_row_attention(layer, query, meta, got)
    assert torch.equal(layer.kv_cache, cache_before)  # the rewrite of each row's K/V is a no-op
    want = torch.full_like(query, 7.0)
    row_attention(layer, query, meta, want)
    n = meta.num_actual_tokens
    torch.testing.assert_close(got[:n], want[:n], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[n:], want[n:])  # padding rows untouched


def test_a_row_alone_gives_the_same_bits() -> None:
    """The decode step of a token and the same token inside a prefill chunk read the
    same keys: their outputs must be equal to the bit (what preemption relies on)."""
    layer, meta, query = _step(torch.float32, None)
    full = torch.zeros_like(query)
    native_row_attention(layer, query, meta, full)
    # request 1's last row (position 8) as a one-token decode step of its own
    one = AttentionMetadata(
        num_actual_tokens=1,
        max_query_len=1,
        max_seq_len=9,
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        seq_lens=torch.tensor([9], dtype=torch.int32),
        block_tables=meta.block_tables[1:2],
        slot_mapping=torch.zeros(1, dtype=torch.long),
    )
    alone = torch.zeros(1, HEADS, HD)
    native_row_attention(layer, query[3:4], one, alone)
    assert torch.equal(alone[0], full[3])
