"""Verification of draft tokens (speculative decoding), greedy and by rejection sampling.

The target model scores a request's last token and its ``k`` drafts in one forward,
which gives ``k + 1`` rows of logits.  Row ``t`` goes through the same pipeline as
the sampler's single row (constraints, penalties over the outputs so far plus the
drafts before ``t``, temperature, min-p, top-k/top-p); then:

- greedy rows accept drafts while each equals the row's argmax, and add the argmax of
  the first mismatching row (or of the last row, a bonus token): exactly the tokens
  greedy decoding without drafts would produce;
- random rows accept draft ``d`` with probability ``min(1, p(d) / q(d))`` (``q`` is the
  drafter's distribution, one-hot for a deterministic drafter), and on rejection
  draw from ``max(p - q, 0)`` normalised; if every draft is accepted the last row's
  ``p`` gives a bonus token.  The tokens produced are distributed as sampling from
  the target alone (Leviathan et al., 2023; Chen et al., 2023).

A seeded request draws from a generator keyed by (seed, number of tokens it has
generated), so its output depends on its seed and prompt only: not on the batch, the
step boundaries or a preemption.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from minivllm.sample.logprobs import compute_logprobs, gather_logprobs
from minivllm.sample.metadata import SamplingMetadata, SamplingState
from minivllm.sample.sampler import Sampler, apply_min_p, apply_penalties, apply_top_k_top_p
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
    argmax = x.argmax(dim=-1)
    if meta.all_greedy:
        return argmax, None
    assert meta.temperature is not None
    x.div_(meta.temperature.unsqueeze(1))
    if meta.min_p is not None:
        apply_min_p(x, meta.min_p)
    x = apply_top_k_top_p(x, meta.top_k, meta.top_p)
    return argmax, x.softmax(dim=-1)


def verify(
    logits: torch.Tensor,
    states: Sequence[SamplingState],
    drafts: Sequence[list[int]],
    vocab_size: int,
    draft_probs: Sequence[torch.Tensor | None] | None = None,
) -> VerifyOutput:
    """Verify each request's drafts; ``logits`` has ``1 + len(drafts[i])`` rows per
    request, in order.  ``draft_probs[i]`` is ``[len(drafts[i]), vocab]`` (the
    drafter's distributions) or None for a deterministic drafter."""
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
    argmax_t, probs = target_probs(logits, meta)
    argmax = argmax_t.tolist()

    token_ids: list[list[int]] = []
    start = 0
    for i, (state, req_drafts) in enumerate(zip(states, drafts, strict=True)):
        params = state.sampling_params
        if params.temperature < SAMPLING_EPS:
            out = _verify_greedy(argmax[start : start + len(req_drafts) + 1], req_drafts)
        else:
            assert probs is not None
            q = draft_probs[i] if draft_probs is not None else None
            generator = position_generator(params.seed, len(state.output_token_ids), device)
            out = _verify_random(
                probs[start : start + len(req_drafts) + 1], req_drafts, q, generator
            )
        token_ids.append(out)
        start += len(req_drafts) + 1

    logprobs: list[list[object] | None] = [None] * len(states)
    if raw_logprobs is not None:
        assert meta.max_num_logprobs is not None
        chosen = list(argmax)
        start = 0
        for req_drafts, out in zip(drafts, token_ids, strict=True):
            chosen[start : start + len(out)] = out
            start += len(req_drafts) + 1
        tensors = gather_logprobs(
            raw_logprobs, meta.max_num_logprobs, torch.tensor(chosen, device=device)
        )
        entries = tensors.to_entries(meta.num_logprobs)
        start = 0
        for i, (req_drafts, out) in enumerate(zip(drafts, token_ids, strict=True)):
            if meta.num_logprobs[start] is not None:
                logprobs[i] = list(entries[start : start + len(out)])
            start += len(req_drafts) + 1
    return VerifyOutput(token_ids, logprobs)


def _verify_greedy(argmax: list[int], drafts: list[int]) -> list[int]:
    out: list[int] = []
    for t, draft in enumerate(drafts):
        out.append(argmax[t])
        if argmax[t] != draft:
            return out
    out.append(argmax[len(drafts)])
    return out


def _verify_random(
    probs: torch.Tensor,
    drafts: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> list[int]:
    """Rejection sampling over one request's rows (``probs``: ``[k + 1, vocab]``)."""
    k = len(drafts)
    uniforms = torch.rand(k, generator=generator, device=probs.device).tolist() if k else []
    out: list[int] = []
    for t, draft in enumerate(drafts):
        p = probs[t]
        q_draft = 1.0 if draft_probs is None else float(draft_probs[t, draft])
        if uniforms[t] * q_draft < float(p[draft]):
            out.append(draft)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[draft] = 0.0
        else:
            residual = (p - draft_probs[t]).clamp_min_(0.0)
        if float(residual.sum()) <= 0.0:
            residual = p  # p == q: any draw from p is exact
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    out.append(int(torch.multinomial(probs[k], 1, generator=generator)))
    return out
