"""The sampler: from one row of logits per request to one token per request.

Steps, in vLLM v1's order:

0. Structured outputs: tokens a row's grammar forbids get -inf (in place, on the
   constrained rows only), before anything else, so logprobs see the mask too.
1. If any row wants logprobs, take them from the raw logits (vLLM's default
   ``raw_logprobs`` mode: before any penalty, bias or temperature).
2. Constraints that can change the argmax: allowed_token_ids, min_tokens (stop
   tokens banned), logit_bias.
3. Penalties: repetition (prompt + output tokens), frequency and presence
   (output tokens).
4. Greedy rows take the argmax here.
5. Random rows: temperature, min-p, top-k, top-p, then one draw per row by
   inverting the row's CDF with one uniform number.  A seeded row draws that
   number from its own generator, so its tokens depend only on its own history.

A row whose logits are no longer finite (NaN, +inf) gets the token id
`INVALID_TOKEN_ID`, and one whose every token is at -inf once masked gets
`NO_ALLOWED_TOKEN_ID`, instead of a draw: sampling it would return an arbitrary token
past every constraint, so the model runner fails that request alone.

Everything is batched; the only per-row Python loop is the seeded rows' draws.
A batch of plain greedy rows (no logprobs, penalties, constraints or grammar) skips
straight to the argmax of the logits as given: no float32 copy, no other pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from minivllm.kernels import lowbit_cpu
from minivllm.sample.logprobs import LogprobsTensors, compute_logprobs, gather_logprobs
from minivllm.sample.metadata import SamplingMetadata

INVALID_TOKEN_ID = -1
"""The sampled id of a row whose logits were NaN or +inf (see the module doc)."""
NO_ALLOWED_TOKEN_ID = -2
"""The sampled id of a row whose every logit was -inf (see the module doc)."""


@dataclass
class SamplerOutput:
    """The tokens chosen this step and, if requested, their logprobs."""

    sampled_token_ids: torch.Tensor
    """[num_reqs] int64; `INVALID_TOKEN_ID` on rows whose logits were not finite."""
    logprobs: LogprobsTensors | None
    """Top-k (k = the batch's max_num_logprobs) from the raw logits, or None."""


def apply_penalties(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """Repetition, frequency and presence penalties, in place; returns ``logits``."""
    assert meta.output_token_ids is not None
    num_reqs, vocab_size = logits.shape
    out_counts = _bin_counts(meta.output_token_ids, num_reqs, vocab_size)
    out_seen = out_counts > 0
    assert meta.repetition_penalties is not None
    if meta.prompt_token_ids is not None:
        seen = out_seen | (_bin_counts(meta.prompt_token_ids, num_reqs, vocab_size) > 0)
        penalty = torch.where(seen, meta.repetition_penalties.unsqueeze(1), 1.0)
        # Dividing a positive logit and multiplying a negative one both make it less likely.
        logits = torch.where(logits > 0, logits / penalty, logits * penalty)
    assert meta.frequency_penalties is not None and meta.presence_penalties is not None
    logits -= meta.frequency_penalties.unsqueeze(1) * out_counts
    logits -= meta.presence_penalties.unsqueeze(1) * out_seen
    return logits


def _bin_counts(token_ids: torch.Tensor, num_reqs: int, vocab_size: int) -> torch.Tensor:
    # One extra column swallows the padding id (vocab_size), then gets dropped.
    counts = torch.zeros(num_reqs, vocab_size + 1, dtype=torch.float32, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_grammar_bitmask(
    logits: torch.Tensor, rows: torch.Tensor | None, bitmask: torch.Tensor
) -> None:
    """Set to -inf, in place, the logits of tokens whose bit is 0 in ``bitmask``.

    ``bitmask`` is int32, 32 tokens per word (bit ``t % 32`` of word ``t // 32``), one
    row per entry of ``rows`` (None: one per logits row).  Columns past the bitmask
    (a vocabulary padded beyond the tokenizer's) are masked too.
    """
    vocab_size = logits.shape[-1]
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    banned = (bits == 0).flatten(1)
    if banned.shape[1] < vocab_size:
        banned = torch.nn.functional.pad(banned, (0, vocab_size - banned.shape[1]), value=True)
    banned = banned[:, :vocab_size]
    if rows is None:
        logits.masked_fill_(banned, float("-inf"))
    else:
        logits[rows] = logits[rows].masked_fill_(banned, float("-inf"))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the row's top probability."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill_(probs < threshold, float("-inf"))


def apply_top_k_top_p(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor | None
) -> torch.Tensor:
    """Keep each row's k most likely tokens and/or its top-p nucleus (in place).

    Rows with k == vocab_size or p == 1.0 are left alone.  Ties at the k-th value
    keep every tied token.
    """
    if k is None and p is None:
        return logits
    vocab_size = logits.shape[-1]
    if p is None:
        assert k is not None
        # Top-k alone needs only the k-th largest value, not a full sort.
        off = k >= vocab_size
        k_eff = k.masked_fill(off, 1)
        kth = logits.topk(int(k_eff.max()), dim=-1).values.gather(1, (k_eff - 1).unsqueeze(1))
        kth.masked_fill_(off.unsqueeze(1), float("-inf"))
        return logits.masked_fill_(logits < kth, float("-inf"))

    sorted_logits, order = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth = sorted_logits.gather(1, (vocab_size - k.clamp(max=vocab_size)).unsqueeze(1))
        sorted_logits.masked_fill_(sorted_logits < kth, float("-inf"))
    sorted_probs = sorted_logits.softmax(dim=-1)
    # Ascending order: drop the low tail whose mass is at most 1 - p, never the top token.
    tail = sorted_probs.cumsum(dim=-1) <= (1 - p).unsqueeze(1)
    tail[:, -1] = False
    sorted_logits.masked_fill_(tail, float("-inf"))
    return logits.scatter_(1, order, sorted_logits)


def draw_uniform(generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """The one float64 uniform number a seeded row draws per sampled token (the
    model runner replays these after a preemption)."""
    return torch.rand(1, dtype=torch.float64, device=device, generator=generator)


CDF_CHUNK = 1024
"""Tokens per block of the two-level CDF `random_sample` inverts."""


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    """One token per row, drawn from ``probs`` by inverting its CDF: the first token
    whose cumulative probability exceeds ``u * total``, u ~ U[0, 1).

    One random number per row: torch's CPU generator makes ~3-7 ns a number, so an
    exponential race over a 49k vocabulary (one number per token) cost ~1.1 ms a
    row, more than the rest of a batch-1 decode step's sampling and a tenth of its
    forward.  The CDF has two levels, so no float64 copy of the row is made: each
    block of `CDF_CHUNK` tokens is summed (float32, vectorised), the block sums are
    accumulated in float64 to pick the block, and only that block's own CDF is
    summed in float64 to pick the token (a full float64 cumsum took 54 ms for 32
    rows of Gemma 3's 262k vocabulary on 2 cores; this takes 0.8 ms).  Tokens of small
    probability keep their share within their block, and a token of probability 0
    is never drawn.
    """
    rows, vocab = probs.shape
    u = _uniforms(torch.arange(rows), generators, probs.device).view(rows, 1)
    chunk = min(CDF_CHUNK, vocab)
    whole = vocab // chunk * chunk
    sums = probs[:, :whole].reshape(rows, -1, chunk).sum(dim=-1)
    if whole < vocab:
        sums = torch.cat([sums, probs[:, whole:].sum(dim=-1, keepdim=True)], dim=1)
    cumulative = sums.double().cumsum(dim=-1)
    total = cumulative[:, -1:]
    target = u * total
    block = torch.searchsorted(cumulative, target, right=True).clamp_(max=sums.shape[1] - 1)
    before = cumulative.gather(1, (block - 1).clamp(min=0)).masked_fill_(block == 0, 0.0)
    columns = block * chunk + torch.arange(chunk, device=probs.device)
    inside = columns < vocab
    part = probs.gather(1, columns.clamp(max=vocab - 1)).masked_fill_(~inside, 0.0)
    cdf = before + part.double().cumsum(dim=-1)
    offset = torch.searchsorted(cdf, target, right=True)
    # Past the block's end (its float32 sum rounded above its float64 CDF): its last
    # token of positive probability.
    positive = torch.where(part > 0, torch.arange(chunk, device=probs.device), -1)
    offset = torch.where(offset >= chunk, positive.amax(dim=-1, keepdim=True), offset)
    picked = (block * chunk + offset.clamp_(min=0)).clamp_(max=vocab - 1)
    # A NaN row (or one with no finite logit left) has no distribution to draw from.
    valid = torch.isfinite(total) & (total > 0)
    return picked.masked_fill_(~valid, INVALID_TOKEN_ID).view(rows)


def mark_invalid(tokens: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``tokens`` with `NO_ALLOWED_TOKEN_ID` on the rows of ``logits`` with nothing above
    -inf and `INVALID_TOKEN_ID` on those with a NaN or +inf."""
    row_max = logits.amax(dim=-1)
    tokens = tokens.masked_fill(row_max == float("-inf"), NO_ALLOWED_TOKEN_ID)
    return tokens.masked_fill(row_max.isnan() | (row_max == float("inf")), INVALID_TOKEN_ID)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax (first of ties), marked as `mark_invalid` marks it.  On CPU
    with minivllm's kernels, one C++ pass a row (``minivllm_cpu::greedy_tokens``):
    torch's argmax and amax took ~80 us a row of a 49k vocabulary, ~2% of a
    batch-1 decode step of the default model."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and lowbit_cpu.available():
        return torch.ops.minivllm_cpu.greedy_tokens(logits, INVALID_TOKEN_ID, NO_ALLOWED_TOKEN_ID)
    return mark_invalid(logits.argmax(dim=-1), logits)


class Sampler(nn.Module):
    """Picks the next token of every request in the batch (see the module doc)."""

    def forward(self, logits: torch.Tensor, sampling_metadata: SamplingMetadata) -> SamplerOutput:
        meta = sampling_metadata
        if meta.is_plain_greedy:
            # Upcasting to float32 keeps every value, so the argmax (first of ties) is
            # the one the general path would take.
            return SamplerOutput(sampled_token_ids=greedy_tokens(logits), logprobs=None)
        if meta.grammar_bitmask is not None:
            apply_grammar_bitmask(logits, *meta.grammar_bitmask)
        # Raw logprobs come first: they describe the model, not the sampling knobs.
        raw_logprobs = None
        if meta.max_num_logprobs is not None:
            raw_logprobs = compute_logprobs(logits)

        kernel_rows = _kernel_rows(logits, meta)
        rest = None if kernel_rows is None else _torch_rows(meta, kernel_rows)
        edits = self.has_constraints(meta) or not meta.no_penalties
        if edits or rest is None or rest.numel():
            # What follows edits the logits in place, so work on a float32 copy.
            logits = logits.to(torch.float32, copy=True)
            logits = self.apply_constraints(logits, meta)
            if not meta.no_penalties:
                logits = apply_penalties(logits, meta)
        if kernel_rows is not None:
            assert rest is not None
            sampled = self.sample_with_kernels(logits, meta, kernel_rows, rest)
        else:
            # Checked before sample() edits the logits: greedy rows take their argmax there.
            checked = logits.amax(dim=-1, keepdim=True)
            sampled = mark_invalid(self.sample(logits, meta), checked)

        logprobs = None
        if raw_logprobs is not None:
            assert meta.max_num_logprobs is not None
            # An invalid row's logprobs are dropped with its request; any index will do.
            chosen = sampled.clamp(min=0)
            logprobs = gather_logprobs(raw_logprobs, meta.max_num_logprobs, chosen)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    @staticmethod
    def has_constraints(meta: SamplingMetadata) -> bool:
        """Whether `apply_constraints` changes anything."""
        return (
            meta.disallowed_mask is not None
            or meta.min_tokens_mask is not None
            or meta.logit_bias is not None
        )

    @staticmethod
    def apply_constraints(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """allowed_token_ids, min_tokens and logit_bias: the knobs that move the argmax."""
        if meta.disallowed_mask is not None:
            logits.masked_fill_(meta.disallowed_mask, float("-inf"))
        if meta.min_tokens_mask is not None:
            rows, token_ids = meta.min_tokens_mask
            logits[rows, token_ids] = float("-inf")
        if meta.logit_bias is not None:
            rows, token_ids, biases = meta.logit_bias
            logits.index_put_((rows, token_ids), biases, accumulate=True)
        return logits

    @staticmethod
    def sample(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """Greedy rows take the argmax, the rest a random draw; [num_reqs] int64."""
        greedy = None if meta.all_random else logits.argmax(dim=-1)
        if meta.all_greedy:
            assert greedy is not None
            return greedy
        assert meta.temperature is not None
        logits.div_(meta.temperature.unsqueeze(1))
        if meta.min_p is not None:
            apply_min_p(logits, meta.min_p)
        logits = apply_top_k_top_p(logits, meta.top_k, meta.top_p)
        sampled = random_sample(logits.softmax(dim=-1), meta.generators)
        if greedy is None:
            return sampled
        assert meta.random_rows is not None
        return torch.where(meta.random_rows, sampled, greedy)

    @classmethod
    def sample_with_kernels(
        cls,
        logits: torch.Tensor,
        meta: SamplingMetadata,
        kernel_rows: torch.Tensor,
        rest: torch.Tensor,
    ) -> torch.Tensor:
        """`sample` and `mark_invalid` with minivllm's CPU kernels: greedy rows and rows
        sampled at a temperature alone (``kernel_rows``) are each one C++ pass over
        their logits, read in place (at 32 rows of Gemma 3's 262k vocabulary, torch's
        copy, division, softmax and CDF passes took ~15 ms a step); rows that also use
        top-k, top-p or min-p (``rest``, `_torch_rows`) take `sample` on a copy of their
        rows.  Which path a row takes depends on its own parameters only, never on the
        rest of the batch."""
        tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        if not meta.all_random:
            assert meta.random_rows is not None  # a mixed batch (all-greedy ones go elsewhere)
            greedy = (~meta.random_rows).nonzero().view(-1)
            tokens[greedy] = greedy_tokens(logits.index_select(0, greedy))
        assert meta.temperature is not None
        fast = kernel_rows.nonzero().view(-1)
        if fast.numel():
            u = _uniforms(fast, meta.generators, logits.device)
            tokens[fast] = torch.ops.minivllm_cpu.sample_rows(
                logits, fast, meta.temperature[fast], u, INVALID_TOKEN_ID, NO_ALLOWED_TOKEN_ID
            )
        if rest.numel():
            tokens[rest] = cls._sample_subset(logits, meta, rest)
        return tokens

    @classmethod
    def _sample_subset(
        cls, logits: torch.Tensor, meta: SamplingMetadata, rows: torch.Tensor
    ) -> torch.Tensor:
        """`sample` on the random rows ``rows`` alone (their generators renumbered)."""
        assert meta.temperature is not None
        picked = rows.tolist()
        sub = logits.index_select(0, rows)
        checked = sub.amax(dim=-1, keepdim=True)
        sub_meta = dataclasses.replace(
            meta,
            temperature=meta.temperature[rows],
            all_greedy=False,
            all_random=True,
            random_rows=None,
            top_p=None if meta.top_p is None else meta.top_p[rows],
            top_k=None if meta.top_k is None else meta.top_k[rows],
            min_p=None if meta.min_p is None else meta.min_p[rows],
            generators={
                i: meta.generators[r] for i, r in enumerate(picked) if r in meta.generators
            },
        )
        return mark_invalid(cls.sample(sub, sub_meta), checked)


def _kernel_rows(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor | None:
    """[rows] bool: the random rows `Sampler.sample_with_kernels` draws in C++ (a
    temperature and nothing of top-k, top-p and min-p); None when the kernels do not
    apply here (not float32 on CPU, or not built) or every row is greedy."""
    if meta.all_greedy or meta.temperature is None:
        return None
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return None
    if not lowbit_cpu.available():
        return None
    vocab = logits.shape[-1]
    # An infinite temperature turns the logits NaN on the torch path (-inf / inf), which
    # fails the request; the kernel would quietly draw uniformly instead.
    plain = torch.isfinite(meta.temperature)
    if meta.random_rows is not None:
        plain &= meta.random_rows
    if meta.top_k is not None:
        plain &= meta.top_k >= vocab
    if meta.top_p is not None:
        plain &= meta.top_p >= 1.0
    if meta.min_p is not None:
        plain &= meta.min_p <= 0.0
    return plain


def _torch_rows(meta: SamplingMetadata, kernel_rows: torch.Tensor) -> torch.Tensor:
    """Indices of the random rows that `Sampler.sample_with_kernels` leaves to torch."""
    random_rows = meta.random_rows
    if random_rows is None:
        random_rows = torch.full_like(kernel_rows, meta.all_random)
    return (random_rows & ~kernel_rows).nonzero().view(-1)


def _uniforms(
    rows: torch.Tensor, generators: dict[int, torch.Generator], device: torch.device | str
) -> torch.Tensor:
    """One float64 uniform number per row of ``rows``, a seeded row's from its own
    generator (`draw_uniform`), the others from torch's global generator."""
    u = torch.empty(rows.numel(), dtype=torch.float64, device=device)
    picked = rows.tolist()
    if any(r not in generators for r in picked):
        u.uniform_()
    for i, r in enumerate(picked):
        if r in generators:
            u[i] = draw_uniform(generators[r], device)
    return u
