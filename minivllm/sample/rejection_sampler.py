"""Verification of draft tokens (speculative decoding), greedy and random.

The target model scores a request's last token and its ``k`` drafts in one forward,
which gives ``k + 1`` rows of logits.  Row ``t`` goes through the same pipeline as
the sampler's single row (constraints, penalties over the outputs so far plus the
drafts before ``t``, temperature, min-p, top-k/top-p), and yields the token the
target picks at that position: the argmax for greedy requests, and for random ones
a draw by the exponential race, ``argmax(p / E)`` with ``E ~ Exp(1)`` per
vocabulary entry (a draw from ``p``, as the sampler's inverse-CDF draw is; the
race keeps one noise per position that a sampling drafter can share).  Drafts are accepted while each equals the
target's pick; the pick at the first mismatch (or after the last draft, a bonus
token) ends the step.

This is rejection sampling with the draft and the target sharing their randomness:
a draft ``d`` is accepted with probability ``p(d)`` when the drafter is
deterministic (n-gram lookup, greedy drafting), exactly the standard rule
``min(1, p(d) / q(d))`` for a one-hot ``q``, and a rejected position yields a draw
from ``p`` without ``d``, the standard residual.  A draft model that samples draws
its draft at position ``m`` with the same noise ``E_m`` as the target's pick there,
so the pair is coupled (accepted whenever both races pick the same token).  Either
way every emitted token is exactly the token sampling from the target alone would
give with the same noise, so the output distribution is the target's.

The noise of a seeded request at output position ``m`` comes from a generator keyed
by ``(seed, m)``, so its tokens depend on its seed and prompt only: not on the
batch, the step boundaries, how many drafts were verified, or a preemption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minivllm.sample.logprobs import compute_logprobs, gather_logprobs
from minivllm.sample.metadata import SamplingMetadata, SamplingState
from minivllm.sample.sampler import (
    Sampler,
    apply_min_p,
    apply_penalties,
    apply_top_k_top_p,
    mark_invalid,
)
from minivllm.sampling_params import SAMPLING_EPS, SamplingParams

_MASK64 = (1 << 63) - 1


def position_generator(
    seed: int | None, position: int, device: torch.device | str = "cpu", salt: int = 0
) -> torch.Generator | None:
    """The generator for a seeded request's draws at output ``position`` (None unseeded)."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    mixed = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + salt) & _MASK64
    generator.manual_seed(mixed)
    return generator


@dataclass
class _Row:
    """One verification row seen as a request (satisfies `SamplingState`)."""

    sampling_params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None = None


@dataclass
class VerifyOutput:
    """Per request: the tokens it gains this step, and their logprob entries (or None)."""

    token_ids: list[list[int]]
    logprobs: list[list[object] | None]


def target_probs(
    logits: torch.Tensor, meta: SamplingMetadata
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(argmax per row, probabilities per row or None when every row is greedy) after
    the sampler's processing; ``logits`` is left untouched."""
    x = logits.to(torch.float32, copy=True)
    x = Sampler.apply_constraints(x, meta)
    if not meta.no_penalties:
        x = apply_penalties(x, meta)
    # A row with no distribution (NaN / +inf, or nothing allowed) gets the sampler's
    # negative marker, whichever way the row would be picked.
    argmax = mark_invalid(x.argmax(dim=-1), x)
    if meta.all_greedy:
        return argmax, None
    assert meta.temperature is not None
    x.div_(meta.temperature.unsqueeze(1))
    if meta.min_p is not None:
        apply_min_p(x, meta.min_p)
    x = apply_top_k_top_p(x, meta.top_k, meta.top_p)
    return argmax, x.softmax(dim=-1)


def position_noise(
    seed: int, position: int, vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The ``Exp(1)`` noise of a seeded request at output ``position`` ([vocab])."""
    generator = position_generator(seed, position, device)
    return torch.empty(vocab_size, device=device).exponential_(generator=generator)


def verify(
    logits: torch.Tensor,
    states: Sequence[SamplingState],
    drafts: Sequence[list[int]],
    vocab_size: int,
    draft_noise: Sequence[torch.Tensor | None] | None = None,
) -> VerifyOutput:
    """Verify each request's drafts; ``logits`` has ``1 + len(drafts[i])`` rows per
    request, in order.  ``draft_noise[i]`` (``[len(drafts[i]), vocab]`` or None) is the
    noise an unseeded request's drafter sampled its drafts with, reused here."""
    device = logits.device
    rows: list[_Row] = []
    for state, req_drafts in zip(states, drafts, strict=True):
        outputs = list(state.output_token_ids)
        for t in range(len(req_drafts) + 1):
            rows.append(
                _Row(state.sampling_params, state.prompt_token_ids, outputs + req_drafts[:t])
            )
    meta = SamplingMetadata.build(rows, vocab_size, device)
    assert logits.shape[0] == len(rows), "one logits row per verified position"
    raw_logprobs = compute_logprobs(logits) if meta.max_num_logprobs is not None else None
    argmax, probs = target_probs(logits, meta)
    picks = argmax
    if probs is not None:
        noise = _noise(states, drafts, probs, draft_noise)
        race = (probs / noise).argmax(-1)
        picks = torch.where(_random_rows(states, drafts, device) & (argmax >= 0), race, argmax)
    pick_list = picks.tolist()

    token_ids: list[list[int]] = []
    start = 0
    for req_drafts in drafts:
        token_ids.append(_accept(pick_list[start : start + len(req_drafts) + 1], req_drafts))
        start += len(req_drafts) + 1

    logprobs: list[list[object] | None] = [None] * len(states)
    if raw_logprobs is not None:
        assert meta.max_num_logprobs is not None
        tensors = gather_logprobs(raw_logprobs, meta.max_num_logprobs, picks)
        entries = tensors.to_entries(meta.num_logprobs)
        start = 0
        for i, (req_drafts, out) in enumerate(zip(drafts, token_ids, strict=True)):
            if meta.num_logprobs[start] is not None:
                logprobs[i] = list(entries[start : start + len(out)])
            start += len(req_drafts) + 1
    return VerifyOutput(token_ids, logprobs)


def _random_rows(
    states: Sequence[SamplingState], drafts: Sequence[list[int]], device: torch.device
) -> torch.Tensor:
    flags = [
        state.sampling_params.temperature >= SAMPLING_EPS
        for state, req_drafts in zip(states, drafts, strict=True)
        for _ in range(len(req_drafts) + 1)
    ]
    return torch.tensor(flags, dtype=torch.bool, device=device)


def _noise(
    states: Sequence[SamplingState],
    drafts: Sequence[list[int]],
    probs: torch.Tensor,
    draft_noise: Sequence[torch.Tensor | None] | None,
) -> torch.Tensor:
    """``Exp(1)`` noise per row: keyed by position for seeded requests, the drafter's
    own for drafts it sampled, fresh otherwise."""
    noise = torch.empty_like(probs).exponential_()
    vocab_size = probs.shape[1]
    start = 0
    for i, (state, req_drafts) in enumerate(zip(states, drafts, strict=True)):
        params = state.sampling_params
        num_rows = len(req_drafts) + 1
        if params.temperature >= SAMPLING_EPS:
            if params.seed is not None:
                first = len(state.output_token_ids)
                for t in range(num_rows):
                    noise[start + t] = position_noise(
                        params.seed, first + t, vocab_size, probs.device
                    )
            elif draft_noise is not None and draft_noise[i] is not None:
                used = draft_noise[i]
                assert used is not None
                noise[start : start + used.shape[0]] = used
        start += num_rows
    return noise


def _accept(picks: list[int], drafts: list[int]) -> list[int]:
    """The target's picks up to the first one that differs from its draft."""
    for t, draft in enumerate(drafts):
        if picks[t] != draft:
            return picks[: t + 1]
    return picks[: len(drafts) + 1]
