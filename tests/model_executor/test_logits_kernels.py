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


def _cdf_token(logits: torch.Tensor, t: float, u: float) -> int:
    """The float64 inversion the kernel approximates: the first token whose cumulative
    probability of softmax(logits / t) passes u."""
    p = torch.softmax(logits.double() / t, dim=-1)
    return int(torch.searchsorted(p.cumsum(-1), torch.tensor([u], dtype=torch.float64), right=True))


@pytest.mark.parametrize("vocab", [3000, 50])  # several CDF blocks with a tail; one block
@pytest.mark.parametrize("t", [1.0, 0.7])
def test_sample_rows_inverts_the_softmax_cdf(vocab: int, t: float) -> None:
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(1, vocab, generator=gen) * 3
    us = torch.linspace(0.0005, 0.9995, 400, dtype=torch.float64)
    rows = torch.zeros(400, dtype=torch.long)
    got = torch.ops.minivllm_cpu.sample_rows(
        logits, rows, torch.full((400,), t), us, INVALID_TOKEN_ID, NO_ALLOWED_TOKEN_ID
    )
    want = [_cdf_token(logits[0], t, float(u)) for u in us]
    # Only a u within rounding of a token boundary may land on the neighbour.
    assert sum(g != w for g, w in zip(got.tolist(), want, strict=True)) <= 2


def test_sample_rows_never_draws_a_masked_token_and_marks_bad_rows() -> None:
    logits = torch.full((5, 4096), -INF)
    logits[0, 17] = logits[0, 4000] = 0.0  # two tokens left, far apart
    logits[1, :] = 1.0
    logits[1, 2048] = float("nan")
    logits[2, 3] = INF
    logits[4, 4095] = -200.0  # the only finite value, tiny once exponentiated elsewhere
    rows = torch.tensor([0, 0, 0, 1, 2, 3, 4])
    u = torch.tensor([0.0, 0.49, 0.999999, 0.5, 0.5, 0.5, 0.9], dtype=torch.float64)
    got = torch.ops.minivllm_cpu.sample_rows(
        logits, rows, torch.ones(7), u, INVALID_TOKEN_ID, NO_ALLOWED_TOKEN_ID
    ).tolist()
    assert got[:3] == [17, 17, 4000]
    assert got[3:] == [INVALID_TOKEN_ID, INVALID_TOKEN_ID, NO_ALLOWED_TOKEN_ID, 4095]


def test_kernel_sampler_draws_the_distribution_of_the_torch_path() -> None:
    """Rows at a temperature alone go through the kernel, a top-k row through torch;
    draws from both match the softmax they sample from."""
    from minivllm.sample.metadata import SamplingMetadata
    from minivllm.sample.sampler import Sampler

    vocab, draws = 1500, 4000
    logits = torch.zeros(1, vocab)
    logits[0, :4] = torch.tensor([2.0, 1.0, 0.0, -1.0])
    logits[0, 4:] = -INF
    batch = logits.expand(draws, vocab).contiguous()
    temperature = torch.full((draws,), 0.8)
    top_k = torch.full((draws,), vocab, dtype=torch.long)
    top_k[draws // 2 :] = 3  # half the rows keep their 3 best tokens: the torch path
    meta = SamplingMetadata(
        temperature=temperature, all_greedy=False, all_random=True, random_rows=None,
        top_p=None, top_k=top_k, min_p=None, generators={}, max_num_logprobs=None,
        num_logprobs=[None] * draws,
    )  # fmt: skip
    torch.manual_seed(0)
    tokens = Sampler()(batch, meta).sampled_token_ids
    p = torch.softmax(logits[0, :4] / 0.8, dim=-1)
    plain = torch.bincount(tokens[: draws // 2], minlength=4)[:4].float() / (draws // 2)
    assert torch.allclose(plain, p, atol=0.03)
    p3 = torch.softmax(logits[0, :3] / 0.8, dim=-1)
    topk = torch.bincount(tokens[draws // 2 :], minlength=4)[:4].float() / (draws // 2)
    assert topk[3] == 0 and torch.allclose(topk[:3], p3, atol=0.03)
