"""Sampler: order of operations, each knob against a plain reference, seeded reproducibility."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.sample.logprobs import compute_prompt_logprobs, prompt_logprob_entries
from minivllm.sample.metadata import RequestSamplingState, SamplingMetadata
from minivllm.sample.sampler import (
    INVALID_TOKEN_ID,
    NO_ALLOWED_TOKEN_ID,
    Sampler,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    random_sample,
)
from minivllm.sampling_params import SamplingParams

VOCAB = 32


def _run(
    params: list[SamplingParams],
    logits: torch.Tensor,
    prompts: list[list[int]] | None = None,
    outputs: list[list[int]] | None = None,
):
    states = [
        RequestSamplingState.create(
            p, prompts[i] if prompts else [0], output_token_ids=outputs[i] if outputs else ()
        )
        for i, p in enumerate(params)
    ]
    meta = SamplingMetadata.build(states, logits.shape[1])
    return Sampler()(logits.clone(), meta), meta


def test_greedy_is_argmax_and_leaves_input_alone() -> None:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    states = [RequestSamplingState.create(SamplingParams(temperature=0), [1]) for _ in range(4)]
    out = Sampler()(logits, SamplingMetadata.build(states, VOCAB))
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.sampled_token_ids.dtype == torch.int64 and out.logprobs is None
    assert torch.equal(logits, before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_greedy_fast_path_matches_the_general_path(dtype: torch.dtype) -> None:
    # Few distinct values, so rows have ties: both paths must pick the first of them.
    gen = torch.Generator().manual_seed(3)
    logits = torch.randint(0, 4, (8, VOCAB), generator=gen).to(dtype)
    states = [RequestSamplingState.create(SamplingParams(temperature=0), [1]) for _ in range(8)]
    meta = SamplingMetadata.build(states, VOCAB)
    assert meta.is_plain_greedy
    fast = Sampler()(logits, meta).sampled_token_ids
    general = Sampler.sample(logits.to(torch.float32, copy=True), meta)
    assert torch.equal(fast, general)
    # Anything that reads or edits the logits takes the general path.
    for params in (
        SamplingParams(temperature=0, logprobs=2),
        SamplingParams(temperature=0, logit_bias={3: 1.0}),
        SamplingParams(temperature=0, presence_penalty=0.5),
        SamplingParams(temperature=0, allowed_token_ids=[1, 2]),
        SamplingParams(temperature=0.7),
    ):
        state = RequestSamplingState.create(params, [1])
        assert not SamplingMetadata.build([state], VOCAB).is_plain_greedy


def test_mixed_batch_greedy_rows_stay_greedy() -> None:
    logits = torch.randn(6, VOCAB, generator=torch.Generator().manual_seed(1))
    params = [SamplingParams(temperature=0 if i % 2 else 1.5) for i in range(6)]
    out, _ = _run(params, logits)
    for i in range(1, 6, 2):
        assert out.sampled_token_ids[i] == logits[i].argmax()


def test_logprobs_come_from_raw_logits() -> None:
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(2))
    params = [
        SamplingParams(temperature=0.5, logprobs=3, repetition_penalty=1.5, logit_bias={4: 9.0}),
        SamplingParams(temperature=0, logprobs=1, presence_penalty=1.0),
    ]
    out, meta = _run(params, logits, prompts=[[4, 5], [6]], outputs=[[7], [8]])
    raw = logits.log_softmax(-1)
    lp = out.logprobs
    assert lp is not None and lp.logprob_token_ids.shape == (2, 4)
    assert torch.equal(lp.logprob_token_ids[:, 0], out.sampled_token_ids)
    for row in range(2):
        token = int(out.sampled_token_ids[row])
        assert lp.logprobs[row, 0] == pytest.approx(float(raw[row, token]))
        assert int(lp.selected_token_ranks[row]) == int((raw[row] >= raw[row, token]).sum())
        top = raw[row].topk(3)
        assert torch.equal(lp.logprob_token_ids[row, 1:], top.indices)
        assert torch.allclose(lp.logprobs[row, 1:], top.values)
    entries = lp.to_entries(meta.num_logprobs)
    assert entries[0] is not None and len(entries[0][3]) == 3
    assert entries[1] is not None and len(entries[1][3]) == 1  # trimmed to its own ask
    assert lp.to_entries([None, 2])[0] is None


def test_logprobs_full_vocab() -> None:
    logits = torch.randn(1, VOCAB)
    out, meta = _run([SamplingParams(logprobs=-1)], logits)
    assert meta.max_num_logprobs == VOCAB
    assert out.logprobs is not None and out.logprobs.logprobs.shape == (1, VOCAB + 1)


def test_penalties_match_reference() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])
    p = SamplingParams(
        temperature=0, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25
    )
    states = [RequestSamplingState.create(p, [0, 1], output_token_ids=[3, 3, 4])]
    meta = SamplingMetadata.build(states, 6)
    got = Sampler.apply_constraints(logits.clone(), meta)
    got = apply_penalties(got, meta)
    expected = logits.clone()
    for t in (0, 1, 3, 4):  # seen in prompt or output -> repetition penalty
        v = expected[0, t]
        expected[0, t] = v / 2.0 if v > 0 else v * 2.0
    expected[0, 3] -= 0.5 * 2 + 0.25
    expected[0, 4] -= 0.5 * 1 + 0.25
    assert torch.allclose(got, expected)


def test_logit_bias_min_tokens_allowed_ids() -> None:
    logits = torch.zeros(3, VOCAB)
    logits[:, 2] = 5.0  # token 2 plays EOS and is the favourite
    biased = SamplingParams(temperature=0, logit_bias={9: 10.0})
    min_tok = SamplingParams(temperature=0, min_tokens=2)
    min_tok.update_from_tokenizer(2)
    allowed = SamplingParams(temperature=1.0, allowed_token_ids=[11, 12])
    out, _ = _run([biased, min_tok, allowed], logits, outputs=[[], [5], []])
    assert out.sampled_token_ids[0] == 9
    assert out.sampled_token_ids[1] != 2  # one output token < min_tokens: EOS banned
    assert int(out.sampled_token_ids[2]) in (11, 12)
    out, _ = _run([min_tok], logits[:1], outputs=[[5, 6]])
    assert out.sampled_token_ids[0] == 2  # min_tokens reached: EOS allowed again


def _reference_top_k_top_p(row: list[float], k: int, p: float) -> set[int]:
    order = sorted(range(len(row)), key=lambda i: -row[i])
    kept = order[:k] if k < len(row) else order
    kth = row[kept[-1]]
    kept = [i for i in order if row[i] >= kth]  # ties at the k-th value survive
    z = sum(math.exp(row[i]) for i in kept)
    probs = {i: math.exp(row[i]) / z for i in kept}
    # Ascending walk: drop tokens while the dropped mass stays <= 1 - p.
    result = set(kept)
    mass = 0.0
    for i in sorted(kept, key=lambda j: row[j])[:-1]:
        mass += probs[i]
        if mass <= 1 - p + 1e-6:
            result.discard(i)
        else:
            break
    return result


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-40, 40), min_size=8, max_size=8, unique=True),
    st.integers(1, 8),
    st.sampled_from([1.0, 0.95, 0.7, 0.3, 0.05]),
)
def test_top_k_top_p_against_reference(values: list[int], k: int, p: float) -> None:
    row = [v / 10 for v in values]
    logits = torch.tensor([row])
    kept = apply_top_k_top_p(logits.clone(), torch.tensor([k]), torch.tensor([p]))
    assert {i for i in range(8) if kept[0, i] > -math.inf} == _reference_top_k_top_p(row, k, p)
    only_k = apply_top_k_top_p(logits.clone(), torch.tensor([k]), None)
    assert {i for i in range(8) if only_k[0, i] > -math.inf} == _reference_top_k_top_p(row, k, 1.0)


def test_top_k_disabled_rows_untouched() -> None:
    logits = torch.randn(2, 10)
    out = apply_top_k_top_p(logits.clone(), torch.tensor([10, 3]), None)
    assert torch.equal(out[0], logits[0]) and int((out[1] > -math.inf).sum()) == 3


def test_min_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_min_p(probs.log(), torch.tensor([0.2]))
    assert (out[0] > -math.inf).tolist() == [True, True, True, False]


def test_random_sampling_follows_distribution() -> None:
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.25, 0.15, 0.1])
    n = 20000
    logits = probs.log().expand(n, 4).contiguous()
    out, _ = _run([SamplingParams()] * n, logits)
    freq = torch.bincount(out.sampled_token_ids, minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.015)


def test_truncation_is_respected_when_sampling() -> None:
    torch.manual_seed(0)
    logits = torch.linspace(0, 1, VOCAB).expand(500, VOCAB).contiguous()
    out, _ = _run([SamplingParams(temperature=5.0, top_k=3)] * 500, logits)
    assert set(out.sampled_token_ids.tolist()) == {VOCAB - 1, VOCAB - 2, VOCAB - 3}


def _seeded_tokens(batch: list[SamplingParams], row: int, steps: int = 5) -> list[int]:
    """Sample ``steps`` times from a batch and return ``row``'s tokens."""
    states = [RequestSamplingState.create(p, [1, 2]) for p in batch]
    logits = torch.zeros(len(batch), 1000)  # uniform: every token equally likely
    tokens = []
    for _ in range(steps):
        out = Sampler()(logits.clone(), SamplingMetadata.build(states, 1000))
        for state, token in zip(states, out.sampled_token_ids.tolist(), strict=True):
            state.output_token_ids.append(token)
        tokens.append(int(out.sampled_token_ids[row]))
    return tokens


def test_seeded_request_independent_of_batch() -> None:
    seeded = SamplingParams(seed=1234)
    alone = _seeded_tokens([seeded], 0)
    torch.manual_seed(99)
    crowded = _seeded_tokens(
        [SamplingParams(), SamplingParams(seed=7), seeded, SamplingParams(temperature=0)], 2
    )
    assert alone == crowded
    assert _seeded_tokens([SamplingParams(seed=1235)], 0) != alone


def test_compute_prompt_logprobs() -> None:
    logits = torch.randn(3, VOCAB)
    targets = torch.tensor([4, 0, 31])
    lp = compute_prompt_logprobs(logits, targets, 2)
    raw = logits.log_softmax(-1)
    assert torch.equal(lp.logprob_token_ids[:, 0], targets)
    assert torch.allclose(lp.logprobs[:, 0], raw[torch.arange(3), targets])
    assert lp.logprobs.shape == (3, 3)
    assert compute_prompt_logprobs(logits, targets, 0).logprobs.shape == (3, 1)
    assert compute_prompt_logprobs(logits, targets, -1).logprobs.shape == (3, VOCAB + 1)


def test_prompt_logprobs_are_computed_a_slice_of_positions_at_a_time() -> None:
    hidden = torch.randn(10, 8, generator=torch.Generator().manual_seed(2))
    head = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(3))
    targets = torch.randint(0, VOCAB, (10,), generator=torch.Generator().manual_seed(4))
    seen_rows: list[int] = []

    def compute_logits(rows: torch.Tensor) -> torch.Tensor:
        seen_rows.append(rows.shape[0])
        return rows @ head

    sliced = prompt_logprob_entries(hidden, compute_logits, targets, 3, rows_per_slice=4)
    assert seen_rows == [4, 4, 2]  # never more than one slice of logits at once
    whole = compute_prompt_logprobs(hidden @ head, targets, 3).to_entries()
    assert len(sliced) == 10
    for got, want in zip(sliced, whole, strict=True):
        assert got is not None and want is not None
        assert got[0] == want[0] and got[2] == want[2] and set(got[3]) == set(want[3])
        assert got[1] == pytest.approx(want[1], abs=1e-5)


def test_tiny_top_p_keeps_the_top_token() -> None:
    # 1 - 1e-9 rounds to 1.0 in float32, so every cumulative sum qualifies as "tail";
    # the most likely token must survive anyway.
    logits = torch.tensor([[0.1, 2.0, 0.3, 1.9]])
    out = apply_top_k_top_p(logits.clone(), None, torch.tensor([1e-9]))
    assert (out[0] > -math.inf).tolist() == [False, True, False, False]


@pytest.mark.gpu
def test_cuda_mixed_batch_and_seeded_rows() -> None:
    device = torch.device("cuda")

    def run(batch: list[SamplingParams], row: int) -> list[int]:
        states = [RequestSamplingState.create(p, [1, 2], device=device) for p in batch]
        tokens = []
        for _ in range(3):
            meta = SamplingMetadata.build(states, 1000, device)
            out = Sampler()(torch.zeros(len(batch), 1000, device=device), meta)
            assert out.sampled_token_ids.device.type == "cuda"
            for state, token in zip(states, out.sampled_token_ids.tolist(), strict=True):
                state.output_token_ids.append(token)
            tokens.append(int(out.sampled_token_ids[row]))
        return tokens

    seeded = SamplingParams(seed=5, top_p=0.9, repetition_penalty=1.1, logprobs=2)
    crowd = [SamplingParams(temperature=0), SamplingParams(top_k=4, min_p=0.1), seeded]
    assert run([seeded], 0) == run(crowd, 2)


def test_metadata_skips_unused_knobs_and_accepts_worker_state() -> None:
    from types import SimpleNamespace

    worker_state = SimpleNamespace(
        sampling_params=SamplingParams(), prompt_token_ids=[1], output_token_ids=[], generator=None
    )
    meta = SamplingMetadata.build([worker_state], VOCAB)
    assert meta.top_k is None and meta.top_p is None and meta.min_p is None
    assert meta.no_penalties and meta.logit_bias is None and meta.disallowed_mask is None
    assert meta.max_num_logprobs is None and meta.all_random and not meta.all_greedy
    # A seeded but greedy request never consumes its generator.
    greedy_seeded = RequestSamplingState.create(SamplingParams(temperature=0, seed=3), [1])
    assert greedy_seeded.generator is None


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("logprobs", [None, 2])
def test_rows_with_non_finite_logits_are_marked_invalid(
    temperature: float, logprobs: int | None
) -> None:
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(5))
    logits[1, 3] = float("nan")
    logits[2] = float("-inf")  # every token masked out
    logits[3, 7] = float("inf")
    params = [SamplingParams(temperature=temperature, logprobs=logprobs) for _ in range(4)]
    out, _ = _run(params, logits)
    tokens = out.sampled_token_ids.tolist()
    assert tokens[1:] == [INVALID_TOKEN_ID, NO_ALLOWED_TOKEN_ID, INVALID_TOKEN_ID]
    assert 0 <= tokens[0] < VOCAB
    if temperature == 0.0:
        assert tokens[0] == int(logits[0].argmax())


def test_masking_every_allowed_token_is_invalid_not_the_last_token() -> None:
    # allowed_token_ids whose logits are -inf: nothing is left to sample.
    logits = torch.zeros(1, VOCAB)
    logits[0, :4] = float("-inf")
    out, _ = _run([SamplingParams(temperature=1.0, allowed_token_ids=[0, 1, 2, 3])], logits)
    assert out.sampled_token_ids.tolist() == [NO_ALLOWED_TOKEN_ID]


def _reference_draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The plain inverse CDF: a float64 cumsum of every row, first token past u * total."""
    cdf = probs.double().cumsum(dim=-1)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).view(-1)


@pytest.mark.parametrize("vocab", [5000, 262144])
def test_two_level_cdf_draws_what_the_full_cdf_draws(
    vocab: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large vocabularies (several CDF blocks, a short last one at 5000): the token of
    each row's uniform number is the one a float64 CDF of the whole row gives, for
    peaked, flat and sparse rows and uniforms at both ends; zeros are never drawn."""
    from minivllm.sample import sampler as sampler_module

    gen = torch.Generator().manual_seed(3)
    rows = 24
    logits = torch.randn(rows, vocab, generator=gen) * torch.linspace(0.5, 12.0, rows)[:, None]
    probs = logits.softmax(dim=-1)
    probs[::3, vocab // 2 :] = 0.0  # sparse rows: a zero tail, even whole zero blocks
    probs[1::4, ::7] = 0.0
    u = torch.rand(rows, 1, dtype=torch.float64, generator=gen)
    u[0], u[1], u[2], u[3] = 0.0, 1e-12, 1 - 2**-53, 1 - 1e-9
    queue = list(u.view(-1))
    monkeypatch.setattr(sampler_module, "draw_uniform", lambda g, d: queue.pop(0))
    picked = sampler_module.random_sample(probs, {row: None for row in range(rows)})
    assert torch.equal(picked, _reference_draw(probs, u))
    assert bool((probs.gather(1, picked[:, None]) > 0).all())


def test_two_level_cdf_follows_a_spread_distribution() -> None:
    """A distribution spread over many blocks is sampled in proportion (chi-square-like
    check on block masses), and a NaN row is marked invalid."""
    torch.manual_seed(0)
    vocab, n = 8192, 20000
    weights = torch.arange(1, 9, dtype=torch.float32).repeat_interleave(vocab // 8)
    probs = (weights / weights.sum()).expand(n, vocab).contiguous()
    picked = random_sample(probs, {})
    freq = torch.bincount(picked // (vocab // 8), minlength=8).float() / n
    expected = torch.arange(1, 9, dtype=torch.float32) / 36
    assert torch.allclose(freq, expected, atol=0.012)
    nan_row = probs[:2].clone()
    nan_row[1, 5] = float("nan")
    assert random_sample(nan_row, {}).tolist()[1] == INVALID_TOKEN_ID
