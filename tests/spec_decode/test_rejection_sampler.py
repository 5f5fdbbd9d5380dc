"""Verification keeps the target's distribution: chi-square tests over many draws.

Synthetic target distributions (8 tokens) stand in for the model: each test verifies
thousands of identical requests in one call and compares the emitted tokens with the
target.  The draft token is chosen so that accepting it blindly would skew the result
by far more than the test's bound (checked too, so the test can fail).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from minivllm.sample.rejection_sampler import verify
from minivllm.sampling_params import SamplingParams

VOCAB = 8
NUM_REQS = 6000
CHI2_999_DF7 = 24.32
"""The 0.999 quantile of the chi-square distribution with 7 degrees of freedom."""


@dataclass
class State:
    sampling_params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=lambda: [1])
    output_token_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def target_logits(seed: int, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=g) * 1.5


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_one_hot_drafts_keep_the_target_distribution(temperature: float) -> None:
    torch.manual_seed(0)
    logits = target_logits(1, 3)  # rows for positions 0, 1 and the bonus position 2
    probs = (logits / temperature).softmax(-1)
    # Draft the least likely token first (blind acceptance would be badly wrong), then
    # the most likely one at position 1.
    drafts = [int(probs[0].argmin()), int(probs[1].argmax())]
    params = SamplingParams(temperature=temperature)
    states = [State(params) for _ in range(NUM_REQS)]
    out = verify(logits.repeat(NUM_REQS, 1), states, [drafts] * NUM_REQS, VOCAB)

    first = torch.tensor([t[0] for t in out.token_ids])
    counts0 = torch.bincount(first, minlength=VOCAB).float()
    assert chi_square(counts0, probs[0]) < CHI2_999_DF7
    # Negative control: always emitting the draft would fail by a wide margin.
    blind = torch.zeros(VOCAB)
    blind[drafts[0]] = NUM_REQS
    assert chi_square(blind + 1, probs[0]) > 100 * CHI2_999_DF7
    # Given that the first draft was accepted, the next token follows row 1.
    second = torch.tensor([t[1] for t in out.token_ids if t[0] == drafts[0] and len(t) > 1])
    assert len(second) > 50
    counts1 = torch.bincount(second, minlength=VOCAB).float()
    assert chi_square(counts1, probs[1]) < CHI2_999_DF7
    # A step never emits more than the drafts + 1, and stops at the first mismatch.
    for tokens in out.token_ids:
        assert 1 <= len(tokens) <= 3
        assert tokens[:-1] == drafts[: len(tokens) - 1]


def test_sampled_drafts_with_shared_noise_keep_the_target_distribution() -> None:
    torch.manual_seed(1)
    logits = target_logits(2, 2)
    probs = logits.softmax(-1)
    q = target_logits(3, 1).softmax(-1)[0]  # the drafter's (different) distribution
    noise = torch.empty(NUM_REQS, 1, VOCAB).exponential_()
    drafts = [[int((q / noise[i, 0]).argmax())] for i in range(NUM_REQS)]
    states = [State(SamplingParams(temperature=1.0)) for _ in range(NUM_REQS)]
    out = verify(logits.repeat(NUM_REQS, 1), states, drafts, VOCAB, list(noise))
    first = torch.tensor([t[0] for t in out.token_ids])
    counts = torch.bincount(first, minlength=VOCAB).float()
    assert chi_square(counts, probs[0]) < CHI2_999_DF7
    # The drafts themselves follow q, which is far from the target.
    draft_counts = torch.bincount(torch.tensor(drafts).flatten(), minlength=VOCAB).float()
    assert chi_square(draft_counts, probs[0]) > 10 * CHI2_999_DF7
    accepted = sum(len(t) == 2 for t in out.token_ids) / NUM_REQS
    assert 0.05 < accepted < 0.95


def test_greedy_rows_accept_exactly_the_argmax_prefix() -> None:
    logits = target_logits(4, 4)
    best = logits.argmax(-1).tolist()
    greedy = SamplingParams(temperature=0.0)
    cases = [
        (best[:3], best),  # all accepted, plus the bonus
        ([best[0], (best[1] + 1) % VOCAB, best[2]], best[:2]),  # second draft rejected
        ([(best[0] + 1) % VOCAB, best[1], best[2]], best[:1]),
    ]
    for drafts, expected in cases:
        out = verify(logits, [State(greedy)], [drafts], VOCAB)
        assert out.token_ids == [expected]


def test_seeded_rows_do_not_depend_on_the_drafts_verified() -> None:
    # The token at each output position depends on the seed and the position only:
    # verifying 0, 1 or 2 drafts first gives the same tokens.
    logits = target_logits(5, 3)
    params = SamplingParams(temperature=1.0, seed=1234)
    alone = verify(logits[:1], [State(params)], [[]], VOCAB).token_ids[0]
    with_drafts = verify(logits, [State(params)], [[alone[0], 3]], VOCAB).token_ids[0]
    assert with_drafts[0] == alone[0]
    again = verify(logits, [State(params)], [[alone[0], 3]], VOCAB).token_ids[0]
    assert again == with_drafts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_nan_row_ends_with_the_invalid_marker_not_a_token(temperature: float) -> None:
    from minivllm.sample.sampler import INVALID_TOKEN_ID

    logits = target_logits(3, 5)  # rows 0-1: the first request, rows 2-4: the second
    drafts = [int(logits[0].argmax()), 0]
    logits[2] = float("nan")  # the second request's first position: no distribution
    params = SamplingParams(temperature=temperature)
    out = verify(logits, [State(params), State(params)], [drafts[:1], drafts], VOCAB)
    # The healthy request is verified as usual: the greedy draft is accepted, or the
    # first pick is a real token.
    assert all(0 <= t < VOCAB for t in out.token_ids[0])
    # The NaN position ends the other request's step with the marker (no draft of it
    # is accepted past a row that has no distribution).
    assert out.token_ids[1] == [INVALID_TOKEN_ID]
