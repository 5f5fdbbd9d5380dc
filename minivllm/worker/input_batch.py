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
    """Group after group (see `minivllm.kv_cache.groups`), each part of equal length."""
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

    def append_block_ids(self, new_ids: list[int], num_groups: int) -> None:
        """Add a step's new blocks (group after group) to each group's table."""
        if num_groups == 1:
            self.block_ids.extend(new_ids)
            return
        old, new = self.group_block_ids(num_groups), split_groups(new_ids, num_groups)
        self.block_ids = [b for o, n in zip(old, new, strict=True) for b in o + n]

    def truncate_block_ids(self, keep: int, num_groups: int) -> None:
        """Keep the first ``keep`` blocks of each group's table (rejected drafts' tail)."""
        groups = self.group_block_ids(num_groups)
        self.block_ids = [b for ids in groups for b in ids[:keep]]

    def group_block_ids(self, num_groups: int) -> list[list[int]]:
        return split_groups(self.block_ids, num_groups)

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


def split_groups(ids: list[int], num_groups: int) -> list[list[int]]:
    """A flat group-after-group id list cut into its ``num_groups`` equal parts."""
    size, rest = divmod(len(ids), num_groups)
    assert rest == 0, f"{len(ids)} block ids do not split into {num_groups} groups"
    return [ids[g * size : (g + 1) * size] for g in range(num_groups)]


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
    sample_drafts: list[list[int]] = field(default_factory=list)
    """Per sampling request (parallel to sample_req_ids): the draft tokens it verifies
    this step; its logits rows are then the last ``1 + len(drafts)`` of its tokens."""


def build_step_inputs(
    states: dict[str, CachedRequestState],
    req_ids: list[str],
    num_scheduled_tokens: dict[str, int],
    block_size: int,
    device: torch.device,
    spec_tokens: dict[str, list[int]] | None = None,
    num_kv_groups: int = 1,
) -> StepInputs:
    """Flatten the scheduled tokens of ``req_ids`` into one batch over the paged cache;
    ``spec_tokens`` are draft tokens that follow a request's own tokens.

    With several KV cache groups each group gets its own block tables and slots
    (``attn_metadata.group_metadata``); the other fields are shared."""
    num_reqs = len(req_ids)
    counts = [num_scheduled_tokens[r] for r in req_ids]
    total = sum(counts)
    input_ids = np.empty(total, dtype=np.int64)
    positions = np.empty(total, dtype=np.int64)
    slot_mapping = np.empty((num_kv_groups, total), dtype=np.int64)
    query_start_loc = np.zeros(num_reqs + 1, dtype=np.int32)
    seq_lens = np.empty(num_reqs, dtype=np.int32)
    max_blocks = max((len(states[r].block_ids) for r in req_ids), default=1) // num_kv_groups
    block_tables = np.zeros((num_kv_groups, num_reqs, max(max_blocks, 1)), dtype=np.int32)
    logits_rows: list[int] = []
    sample_req_ids: list[str] = []
    sample_drafts: list[list[int]] = []

    offset = 0
    for i, req_id in enumerate(req_ids):
        state = states[req_id]
        n = counts[i]
        start = state.num_computed_tokens
        end = start + n
        drafts = (spec_tokens or {}).get(req_id, [])
        nd = len(drafts)
        input_ids[offset : offset + n - nd] = state.token_slice(start, end - nd)
        input_ids[offset + n - nd : offset + n] = drafts
        pos = np.arange(start, end, dtype=np.int64)
        positions[offset : offset + n] = pos
        for g, ids in enumerate(state.group_block_ids(num_kv_groups)):
            blocks = np.asarray(ids, dtype=np.int64)
            slot_mapping[g, offset : offset + n] = (
                blocks[pos // block_size] * block_size + pos % block_size
            )
            block_tables[g, i, : len(ids)] = ids
        seq_lens[i] = end
        query_start_loc[i + 1] = query_start_loc[i] + n
        if end - nd >= state.num_tokens:
            logits_rows.extend(range(offset + n - 1 - nd, offset + n))
            sample_req_ids.append(req_id)
            sample_drafts.append(list(drafts))
        offset += n

    qsl_t = torch.from_numpy(query_start_loc).to(device)
    seq_lens_t = torch.from_numpy(seq_lens).to(device)
    groups = [
        AttentionMetadata(
            num_actual_tokens=total,
            max_query_len=max(counts, default=0),
            max_seq_len=int(seq_lens.max()) if num_reqs else 0,
            query_start_loc=qsl_t,
            seq_lens=seq_lens_t,
            block_tables=torch.from_numpy(block_tables[g]).to(device),
            slot_mapping=torch.from_numpy(slot_mapping[g]).to(device),
            query_start_loc_cpu=query_start_loc.tolist(),
            seq_lens_cpu=seq_lens.tolist(),
        )
        for g in range(num_kv_groups)
    ]
    metadata = groups[0]
    if num_kv_groups > 1:
        metadata.group_metadata = tuple(groups)
    return StepInputs(
        input_ids=torch.from_numpy(input_ids).to(device),
        positions=torch.from_numpy(positions).to(device),
        attn_metadata=metadata,
        req_ids=list(req_ids),
        logits_indices=torch.tensor(logits_rows, dtype=torch.long, device=device),
        sample_req_ids=sample_req_ids,
        num_scheduled=counts,
        sample_drafts=sample_drafts,
    )
