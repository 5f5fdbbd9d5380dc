"""Logprob tensors: top-k per row plus the chosen token's logprob and rank."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

PROMPT_LOGPROBS_ROWS = 256
"""Prompt positions whose logits are held at once (256 x a 150k vocabulary in float32
is ~150 MB): a 7000-token prompt chunk would otherwise hold gigabytes of logits."""

# (token_id, logprob, rank, {top_token_id: logprob}) -- the per-token entry form of
# ModelRunnerOutput.logprobs / prompt_logprobs.
LogprobEntry = tuple[int, float, int, dict[int, float]]


class LogprobsTensors(NamedTuple):
    """Column 0 is the chosen (sampled or target) token, columns 1.. the top-k."""

    logprob_token_ids: torch.Tensor
    """[num_rows, k + 1] int64."""
    logprobs: torch.Tensor
    """[num_rows, k + 1] float32."""
    selected_token_ranks: torch.Tensor
    """[num_rows] int64, 1-based rank of the chosen token."""

    def to_entries(
        self, num_logprobs: Sequence[int | None] | None = None
    ) -> list[LogprobEntry | None]:
        """One entry per row, each row's top-k trimmed to what it asked for.

        With ``num_logprobs`` (e.g. `SamplingMetadata.num_logprobs`), a row whose value
        is None did not ask for logprobs and gets None; without it every row keeps
        all its top-k columns.
        """
        ids = self.logprob_token_ids.tolist()
        values = self.logprobs.tolist()
        ranks = self.selected_token_ranks.tolist()
        entries: list[LogprobEntry | None] = []
        for i, (row_ids, row_values, rank) in enumerate(zip(ids, values, ranks, strict=True)):
            keep = len(row_ids) - 1
            if num_logprobs is not None:
                wanted = num_logprobs[i]
                if wanted is None:
                    entries.append(None)
                    continue
                keep = min(keep, wanted)
            top = dict(zip(row_ids[1 : keep + 1], row_values[1 : keep + 1], strict=True))
            entries.append((row_ids[0], row_values[0], rank, top))
        return entries


def compute_logprobs(logits: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(dim=-1, dtype=torch.float32)


def gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> LogprobsTensors:
    """Top ``num_logprobs`` of each row, plus the logprob and rank of ``token_ids``."""
    assert logprobs.dim() == 2 and token_ids.shape == logprobs.shape[:1]
    num_logprobs = min(num_logprobs, logprobs.shape[-1])
    top_values, top_ids = torch.topk(logprobs, num_logprobs, dim=-1)
    chosen = token_ids.to(torch.int64).unsqueeze(-1)
    chosen_values = logprobs.gather(-1, chosen)
    # Rank = how many tokens are at least as likely (ties share the worse rank).
    ranks = (logprobs >= chosen_values).sum(dim=-1)
    return LogprobsTensors(
        torch.cat((chosen, top_ids), dim=1),
        torch.cat((chosen_values, top_values), dim=1),
        ranks,
    )


def compute_prompt_logprobs(
    logits: torch.Tensor, target_token_ids: torch.Tensor, num_logprobs: int
) -> LogprobsTensors:
    """Logprobs of each prompt position's next token.

    ``logits[i]`` is the model's output at prompt position i and
    ``target_token_ids[i]`` the prompt token at position i + 1.  ``num_logprobs``
    -1 means the whole vocabulary, 0 only the target token.
    """
    vocab_size = logits.shape[-1]
    k = vocab_size if num_logprobs == -1 else num_logprobs
    return gather_logprobs(compute_logprobs(logits.float()), k, target_token_ids)


def prompt_logprob_entries(
    hidden: torch.Tensor,
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    target_token_ids: torch.Tensor,
    num_logprobs: int,
    rows_per_slice: int | None = None,
) -> list[LogprobEntry | None]:
    """`compute_prompt_logprobs` over ``hidden`` a slice of positions at a time, so
    only one slice's logits exist at once; one entry per position.

    ``hidden[i]`` is the final hidden state at prompt position i, ``compute_logits``
    turns hidden states into logits; ``rows_per_slice`` defaults to
    `PROMPT_LOGPROBS_ROWS`.
    """
    rows_per_slice = rows_per_slice or PROMPT_LOGPROBS_ROWS
    entries: list[LogprobEntry | None] = []
    for start in range(0, hidden.shape[0], rows_per_slice):
        logits = compute_logits(hidden[start : start + rows_per_slice])
        targets = target_token_ids[start : start + rows_per_slice]
        entries += compute_prompt_logprobs(logits, targets, num_logprobs).to_entries()
    return entries
