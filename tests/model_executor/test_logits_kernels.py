"""minivllm's C++ scans over the logits (`logits_cpu.cpp`) against torch: the top-k
candidates the low-bit LM head refines, and the greedy tokens with the sampler's
marks for rows without a distribution."""

from __future__ import annotations

import pytest
import torch

from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.quantized_linear import _top_indices
from minivllm.sample.sampler import (
    INVALID_TOKEN_ID,
    NO_ALLOWED_TOKEN_ID,
    greedy_tokens,
    mark_invalid,
)

pytestmark = pytest.mark.skipif(not lowbit_cpu.available(), reason="no C++ compiler")

INF = float("inf")


@pytest.mark.parametrize("vocab", [49152, 1000, 70, 16])  # whole chunks, a tail, k > chunks
@pytest.mark.parametrize("k", [1, 16])
def test_top_logit_indices_are_the_k_largest(vocab: int, k: int) -> None:
    gen = torch.Generator().manual_seed(vocab + k)
    logits = torch.randn(5, vocab, generator=gen) * 4
    logits[1, -1] = 100.0  # the largest value in the last (partial) chunk
    if vocab >= 64 + 2 * k:
        logits[2, :64] = -INF  # a whole chunk of -inf (leaving k distinct values above it)
    got = torch.ops.minivllm_cpu.top_logit_indices(logits, k)
    assert got.shape == (5, k) and got.dtype == torch.long
    want = logits.topk(k, dim=-1).indices
    for row in range(5):
        assert len(set(got[row].tolist())) == k
        # Distinct random values: the same set of columns as torch.topk.
        assert sorted(got[row].tolist()) == sorted(want[row].tolist())
    assert got[1].tolist().count(vocab - 1) == 1


def test_top_logit_indices_take_nan_first_and_keep_ties_whole() -> None:
    logits = torch.zeros(3, 640)
    logits[0, 300] = float("nan")  # ranks above everything, as in torch.topk
    logits[1, 5] = 2.0
    logits[1, 600] = 2.0
    got = torch.ops.minivllm_cpu.top_logit_indices(logits, 2)
    assert 300 in got[0].tolist()
    assert sorted(got[1].tolist()) == [5, 600]
    assert len(set(got[2].tolist())) == 2  # all ties: any two distinct columns


def test_refinement_candidates_match_the_torch_path() -> None:
    """The LM head's refinement ranks the same columns with the kernel as with the two
    torch steps it replaces (the CPU path the engine takes)."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 262144 // 4, generator=gen)
    got = _top_indices(logits, 16)
    chunks = logits.view(4, -1, 64)
    best = chunks.amax(-1).topk(16, dim=-1).indices
    cand = chunks.gather(1, best[..., None].expand(4, 16, 64)).view(4, 16 * 64)
    j = cand.topk(16, dim=-1).indices
    want = best.gather(1, j // 64) * 64 + j % 64
    assert [sorted(r) for r in got.tolist()] == [sorted(r) for r in want.tolist()]


def test_greedy_tokens_match_argmax_and_mark_invalid_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 49157, generator=gen)
    logits[1, 7] = logits[1, 40000] = 50.0  # a tie: the first wins
    logits[2, 123] = float("nan")
    logits[3, 9] = INF
    logits[4] = -INF
    logits[5, :] = -INF
    logits[5, 49156] = -3.0  # the only finite value, in the tail
    logits[6, 300] = -0.0
    logits[6] = torch.where(logits[6] > 0, -1.0, logits[6])  # max is a (negative) zero
    logits[7, 0] = 9.0  # the first column
    got = greedy_tokens(logits)
    want = mark_invalid(logits.argmax(dim=-1), logits)
    assert got.tolist() == want.tolist()
    assert got[1] == 7 and got[2] == INVALID_TOKEN_ID and got[3] == INVALID_TOKEN_ID
    assert got[4] == NO_ALLOWED_TOKEN_ID and got[5] == 49156 and got[7] == 0


@pytest.mark.parametrize("rows", [1, 3, 64])
def test_greedy_tokens_on_many_rows_and_views(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    wide = torch.randn(rows, 2 * 1000, generator=gen)
    logits = wide[:, ::2]  # not contiguous: copied first
    got = torch.ops.minivllm_cpu.greedy_tokens(logits, INVALID_TOKEN_ID, NO_ALLOWED_TOKEN_ID)
    assert got.tolist() == logits.argmax(dim=-1).tolist()


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.minivllm_cpu.greedy_tokens(torch.zeros(2, 5, dtype=torch.float64), -1, -2)
    with pytest.raises(RuntimeError, match="k must be"):
        torch.ops.minivllm_cpu.top_logit_indices(torch.zeros(2, 5), 6)
