"""The pooling side of the model runner: a step's hidden states -> pooled outputs.

A pooling request runs its prompt (chunked or whole) and nothing else: when its
last prompt token has been computed the runner pools the rows it kept, runs the
model's ``pooling_head`` on them and returns the result in
`ModelRunnerOutput.pooler_output`; the scheduler then finishes the request and
frees its blocks at once.  Nothing is sampled.  A chunked prompt keeps the rows its
pooling type needs between steps (MEAN: the chunk's row sum; ALL: every row;
CLS: the first; LAST: none until the last chunk).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from minivllm.model_executor.layers.pooler import chunk_rows, pool

if TYPE_CHECKING:
    from minivllm.worker.input_batch import CachedRequestState, StepInputs


class PoolingRunner:
    """Keeps the partial rows of chunked prompts and pools finished ones."""

    def __init__(self, model: torch.nn.Module, pooling_type: str) -> None:
        self.model = model
        self.pooling_type = pooling_type
        self.partial: dict[str, list[torch.Tensor]] = {}
        """Rows kept from earlier chunks of unfinished prompts."""

    @staticmethod
    def _chunk_sums(hidden: torch.Tensor, num_scheduled: list[int]) -> torch.Tensor:
        """Float32 row sums [num_reqs, H] of every request's chunk, in one pass (a sum
        per request costs more in thread wake-ups than in arithmetic)."""
        counts = torch.tensor(num_scheduled, device=hidden.device)
        segment = torch.repeat_interleave(
            torch.arange(len(num_scheduled), device=hidden.device), counts
        )
        rows = hidden[: segment.shape[0]].float()
        sums = rows.new_zeros(len(num_scheduled), hidden.shape[1])
        return sums.index_add_(0, segment, rows)

    def forget(self, req_id: str) -> None:
        self.partial.pop(req_id, None)

    def pool_step(
        self,
        hidden: torch.Tensor,
        inputs: StepInputs,
        states: dict[str, CachedRequestState],
    ) -> dict[str, Any]:
        """``{req_id: float32 CPU tensor}`` for the prompts that finished this step."""
        finished: list[str] = []
        pooled: list[torch.Tensor] = []
        offset = 0
        sums = (
            self._chunk_sums(hidden, inputs.num_scheduled) if self.pooling_type == "MEAN" else None
        )
        for i, (req_id, n) in enumerate(zip(inputs.req_ids, inputs.num_scheduled, strict=True)):
            state = states[req_id]
            start = state.num_computed_tokens
            last_chunk = start + n >= len(state.prompt_token_ids)
            if sums is not None:
                rows = sums[i : i + 1]
            else:
                rows = chunk_rows(self.pooling_type, hidden[offset : offset + n], start, last_chunk)
            offset += n
            if not last_chunk:
                if rows.shape[0]:
                    self.partial.setdefault(req_id, []).append(rows)
                continue
            earlier = self.partial.pop(req_id, [])
            kept = torch.cat([*earlier, rows]) if earlier else rows
            finished.append(req_id)
            pooled.append(pool(self.pooling_type, kept, len(state.prompt_token_ids)))
        if not finished:
            return {}
        if self.pooling_type == "ALL":
            heads = [self.model.pooling_head(p) for p in pooled]
        else:
            heads = list(self.model.pooling_head(torch.stack(pooled)))
        return {r: h.float().cpu() for r, h in zip(finished, heads, strict=True)}
