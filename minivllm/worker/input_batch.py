"""Per-request state the worker keeps across steps, and the flat inputs of one step."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from minivllm.attention.metadata import AttentionMetadata
from minivllm.sample.metadata import make_request_generator
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.output import NewRequestData
from minivllm.structured_output.spec import GrammarMatcher


@dataclass
class CachedRequestState:
    """What the worker knows of one request between steps."""

    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    grammar_matcher: GrammarMatcher | None = None
    """The request's place in its grammar (structured outputs only)."""

    @classmethod
    def from_new(cls, data: NewRequestData, device: torch.device) -> CachedRequestState:
        return cls(
            req_id=data.req_id,
            prompt_token_ids=list(data.prompt_token_ids),
            sampling_params=data.sampling_params,
            block_ids=list(data.block_ids),
            num_computed_tokens=data.num_computed_tokens,
            output_token_ids=list(data.output_token_ids),
            generator=make_request_generator(data.sampling_params, device),
            grammar_matcher=_start_matcher(data),
        )

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        """Token ids ``[start, end)`` of prompt + outputs."""
        num_prompt = len(self.prompt_token_ids)
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]


def _start_matcher(data: NewRequestData) -> GrammarMatcher | None:
    """A fresh matcher, advanced over the tokens generated before a preemption."""
    if data.grammar is None:
        return None
    matcher: GrammarMatcher = data.grammar.new_matcher()
    for token_id in data.output_token_ids:
        if not matcher.accept_token(token_id):
            raise ValueError(f"token {token_id} of the output breaks the request's grammar")
    return matcher


@dataclass
class StepInputs:
    """The flat tensors of one forward pass, and which rows get sampled."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    req_ids: list[str]
    logits_indices: torch.Tensor
    """Index (into the flat tokens) of the last token of each request that samples."""
    sample_req_ids: list[str]
    """Requests whose context is complete after this step, so they sample a token."""
    num_scheduled: list[int]


def build_step_inputs(
    states: dict[str, CachedRequestState],
    req_ids: list[str],
    num_scheduled_tokens: dict[str, int],
    block_size: int,
    device: torch.device,
) -> StepInputs:
    """Flatten the scheduled tokens of ``req_ids`` into one batch over the paged cache."""
    num_reqs = len(req_ids)
    counts = [num_scheduled_tokens[r] for r in req_ids]
    total = sum(counts)
    input_ids = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    slot_mapping = np.empty(total, dtype=np.int64)
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    seq_lens = np.empty(num_reqs, dtype=np.int32)
    max_blocks = max((len(states[r].block_ids) for r in req_ids), default=1) or 1
    block_tables = np.zeros((num_reqs, max_blocks), dtype=np.int32)
    logits_rows: list[int] = []
    sample_req_ids: list[str] = []

    offset = 0
    for i, req_id in enumerate(req_ids):
        state = states[req_id]
        n = counts[i]
        start = state.num_computed_tokens
        end = start + n
        input_ids[offset : offset + n] = state.token_slice(start, end)
        pos = np.arange(start, end, dtype=np.int64)
        positions[offset : offset + n] = pos
        blocks = np.asarray(state.block_ids, dtype=np.int64)
        slot_mapping[offset : offset + n] = (
            blocks[pos // block_size] * block_size + pos % block_size
        )
        block_tables[i, : len(state.block_ids)] = state.block_ids
        seq_lens[i] = end
        query_start_loc[i + 1] = query_start_loc[i] + n
        if end >= state.num_tokens:
            logits_rows.append(offset + n - 1)
            sample_req_ids.append(req_id)
        offset += n

    metadata = AttentionMetadata(
        num_actual_tokens=total,
        max_query_len=max(counts, default=0),
        max_seq_len=int(seq_lens.max()) if num_reqs else 0,
        query_start_loc=torch.from_numpy(query_start_loc).to(device),
        seq_lens=torch.from_numpy(seq_lens).to(device),
        block_tables=torch.from_numpy(block_tables).to(device),
        slot_mapping=torch.from_numpy(slot_mapping).to(device),
        query_start_loc_cpu=query_start_loc.tolist(),
        seq_lens_cpu=seq_lens.tolist(),
    )
    return StepInputs(
        input_ids=torch.from_numpy(input_ids).to(device),
        positions=torch.from_numpy(positions).to(device),
        attn_metadata=metadata,
        req_ids=list(req_ids),
        logits_indices=torch.tensor(logits_rows, dtype=torch.long, device=device),
        sample_req_ids=sample_req_ids,
        num_scheduled=counts,
    )
