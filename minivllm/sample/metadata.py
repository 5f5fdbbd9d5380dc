"""Per-step sampling inputs, gathered from the requests of a batch into tensors.

The model runner keeps one `RequestSamplingState` per request (its params, its
token ids and, for a seeded request, its own `torch.Generator`) and builds a
`SamplingMetadata` each step from the states of the rows it samples, in batch
order.  Everything a knob does not need is left as None so the sampler can skip
that work for the common batch (no penalties, no top-k, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from minivllm.sampling_params import SAMPLING_EPS, SamplingParams


class SamplingState(Protocol):
    """What `SamplingMetadata.build` reads from a request; the worker's own per-request
    state (e.g. ``CachedRequestState``) satisfies it as well as `RequestSamplingState`."""

    sampling_params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None


def make_request_generator(
    params: SamplingParams, device: torch.device | str = "cpu"
) -> torch.Generator | None:
    """The request's own RNG: only seeded requests that really sample get one."""
    if params.seed is None or params.temperature < SAMPLING_EPS:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(params.seed)
    return generator


@dataclass
class RequestSamplingState:
    """The sampling state the model runner keeps for one request across steps."""

    sampling_params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    """Tokens generated so far; the runner appends each sampled token."""
    generator: torch.Generator | None = None
    """The request's own RNG (seeded requests only); it advances only when this
    request samples, so its tokens do not depend on what else is in the batch."""

    @classmethod
    def create(
        cls,
        params: SamplingParams,
        prompt_token_ids: Sequence[int],
        device: torch.device | str = "cpu",
        output_token_ids: Sequence[int] = (),
    ) -> RequestSamplingState:
        generator = make_request_generator(params, device)
        return cls(params, list(prompt_token_ids), list(output_token_ids), generator)


def _padded(rows: Sequence[Sequence[int]], pad: int, device: torch.device) -> torch.Tensor:
    """A [num_rows, longest] int64 tensor, short rows padded with ``pad``."""
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), pad, dtype=torch.int64)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
    return out.to(device, non_blocking=True)


@dataclass
class SamplingMetadata:
    """Sampling inputs for one step; row i is the i-th request of the batch."""

    temperature: torch.Tensor | None
    """[num_reqs] float32, 1.0 on greedy rows; None when all rows are greedy."""
    all_greedy: bool
    all_random: bool
    random_rows: torch.Tensor | None
    """[num_reqs] bool, True on rows that sample randomly; None unless the batch mixes
    greedy and random rows."""
    top_p: torch.Tensor | None
    """[num_reqs] float32 (1.0 = off); None when no row uses top-p."""
    top_k: torch.Tensor | None
    """[num_reqs] int64 (vocab_size = off); None when no row uses top-k."""
    min_p: torch.Tensor | None
    """[num_reqs] float32 (0 = off); None when no row uses min-p."""
    generators: dict[int, torch.Generator]
    """Row index -> the generator of a seeded request."""
    max_num_logprobs: int | None
    """Largest top-k of logprobs any row wants (-1 resolved to the vocab size); None if none."""
    num_logprobs: list[int | None]
    """Per row: how many top logprobs it asked for (resolved like max_num_logprobs)."""

    no_penalties: bool = True
    prompt_token_ids: torch.Tensor | None = None
    """[num_reqs, max_prompt_len] int64 padded with vocab_size (penalties only)."""
    output_token_ids: torch.Tensor | None = None
    """[num_reqs, max_output_len] int64 padded with vocab_size (penalties only)."""
    presence_penalties: torch.Tensor | None = None
    frequency_penalties: torch.Tensor | None = None
    repetition_penalties: torch.Tensor | None = None

    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """(rows, token ids, biases) to add, or None."""
    min_tokens_mask: tuple[torch.Tensor, torch.Tensor] | None = None
    """(rows, token ids) of stop tokens banned because a row is below min_tokens."""
    disallowed_mask: torch.Tensor | None = None
    """[num_reqs, vocab] bool, True where allowed_token_ids forbids the token."""
    grammar_bitmask: tuple[torch.Tensor | None, torch.Tensor] | None = None
    """(rows, [len(rows), ceil(vocab / 32)] int32 bitmask) of the rows a grammar
    constrains (rows None: every row), bit set = token allowed; set by the model runner
    from the requests' grammar matchers."""

    @property
    def is_plain_greedy(self) -> bool:
        """Every row takes the argmax of its raw logits: greedy, and nothing (logprobs,
        penalties, allowed tokens, min_tokens, logit bias, a grammar) reads or edits them."""
        return (
            self.all_greedy
            and self.max_num_logprobs is None
            and self.no_penalties
            and self.disallowed_mask is None
            and self.min_tokens_mask is None
            and self.logit_bias is None
            and self.grammar_bitmask is None
        )

    @classmethod
    def build(
        cls,
        states: Sequence[SamplingState],
        vocab_size: int,
        device: torch.device | str = "cpu",
    ) -> SamplingMetadata:
        """Gather the per-request states (in batch order) into one step's tensors."""
        device = torch.device(device)
        params = [s.sampling_params for s in states]
        greedy = [p.temperature < SAMPLING_EPS for p in params]

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32).to(device, non_blocking=True)

        temperature = None
        if not all(greedy):
            temperature = floats(
                [1.0 if g else p.temperature for g, p in zip(greedy, params, strict=True)]
            )
        top_p = top_k = min_p = None
        if any(p.top_p < 1.0 for p in params):
            top_p = floats([p.top_p for p in params])
        if any(0 < p.top_k < vocab_size for p in params):
            top_k = torch.tensor(
                [p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params],
                dtype=torch.int64,
            ).to(device, non_blocking=True)
        if any(p.min_p > 0.0 for p in params):
            min_p = floats([p.min_p for p in params])

        num_logprobs = [
            None if p.logprobs is None else (vocab_size if p.logprobs == -1 else p.logprobs)
            for p in params
        ]
        wanted = [n for n in num_logprobs if n is not None]
        meta = cls(
            temperature=temperature,
            all_greedy=all(greedy),
            all_random=not any(greedy),
            random_rows=(
                torch.tensor([not g for g in greedy]).to(device)
                if any(greedy) and not all(greedy)
                else None
            ),
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            generators={
                i: s.generator
                for i, (s, g) in enumerate(zip(states, greedy, strict=True))
                if s.generator is not None and not g
            },
            max_num_logprobs=min(max(wanted), vocab_size) if wanted else None,
            num_logprobs=num_logprobs,
        )
        meta._add_penalties(states, vocab_size, device)
        meta._add_token_constraints(states, vocab_size, device)
        return meta

    def _add_penalties(
        self, states: Sequence[SamplingState], vocab_size: int, device: torch.device
    ) -> None:
        params = [s.sampling_params for s in states]
        if all(
            p.presence_penalty == 0.0 and p.frequency_penalty == 0.0 and p.repetition_penalty == 1.0
            for p in params
        ):
            return
        self.no_penalties = False
        self.presence_penalties = torch.tensor(
            [p.presence_penalty for p in params], dtype=torch.float32
        ).to(device)
        self.frequency_penalties = torch.tensor(
            [p.frequency_penalty for p in params], dtype=torch.float32
        ).to(device)
        self.repetition_penalties = torch.tensor(
            [p.repetition_penalty for p in params], dtype=torch.float32
        ).to(device)
        # The prompt only feeds the repetition penalty; skip it when nobody uses one.
        if any(p.repetition_penalty != 1.0 for p in params):
            self.prompt_token_ids = _padded(
                [s.prompt_token_ids for s in states], vocab_size, device
            )
        self.output_token_ids = _padded([s.output_token_ids for s in states], vocab_size, device)

    def _add_token_constraints(
        self, states: Sequence[SamplingState], vocab_size: int, device: torch.device
    ) -> None:
        bias_rows: list[int] = []
        bias_ids: list[int] = []
        bias_values: list[float] = []
        ban_rows: list[int] = []
        ban_ids: list[int] = []
        disallowed: torch.Tensor | None = None
        for row, state in enumerate(states):
            p = state.sampling_params
            if p.logit_bias:
                for token_id, bias in p.logit_bias.items():
                    if 0 <= token_id < vocab_size:
                        bias_rows.append(row)
                        bias_ids.append(token_id)
                        bias_values.append(bias)
            if len(state.output_token_ids) < p.min_tokens:
                stop_ids = [t for t in p.all_stop_token_ids if 0 <= t < vocab_size]
                ban_rows.extend([row] * len(stop_ids))
                ban_ids.extend(stop_ids)
            if p.allowed_token_ids is not None:
                if disallowed is None:
                    disallowed = torch.zeros(len(states), vocab_size, dtype=torch.bool)
                disallowed[row] = True
                allowed = [t for t in p.allowed_token_ids if 0 <= t < vocab_size]
                disallowed[row, allowed] = False

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

        if bias_rows:
            self.logit_bias = (
                ints(bias_rows),
                ints(bias_ids),
                torch.tensor(bias_values, dtype=torch.float32).to(device),
            )
        if ban_rows:
            self.min_tokens_mask = (ints(ban_rows), ints(ban_ids))
        if disallowed is not None:
            self.disallowed_mask = disallowed.to(device, non_blocking=True)
