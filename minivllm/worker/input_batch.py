"""Per-request state the worker keeps across steps, and the flat inputs of one step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from minivllm.attention.metadata import AttentionMetadata
from minivllm.pooling_params import TOKEN_TYPE_SHIFT
from minivllm.reasoning import ReasoningMarkers, ThinkingGate
from minivllm.sample.metadata import make_request_generator
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.output import NewRequestData
from minivllm.structured_output.reasoning_gate import step_matcher
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
    thinking_gate: ThinkingGate | None = None
    """A reasoning model's request with a grammar or a thinking budget: where it stands
    relative to its reasoning (see `minivllm.structured_output.reasoning_gate`)."""
    lora_request: Any = None
    """The request's LoRA adapter, or None (the base model)."""
    token_type_start: int | None = None
    """A cross-encoder pair: tokens from here on have token type 1 (`TOKEN_TYPE_SHIFT`)."""

    @classmethod
    def from_new(
        cls, data: NewRequestData, device: torch.device, markers: ReasoningMarkers | None = None
    ) -> CachedRequestState:
        gate = _start_gate(data, markers)
        return cls(
            req_id=data.req_id,
            prompt_token_ids=list(data.prompt_token_ids),
            sampling_params=data.sampling_params,
            block_ids=list(data.block_ids),
            num_computed_tokens=data.num_computed_tokens,
            output_token_ids=list(data.output_token_ids),
            generator=make_request_generator(data.sampling_params, device),
            grammar_matcher=_start_matcher(data, gate),
            thinking_gate=gate,
            lora_request=data.lora_request,
            token_type_start=data.pooling_params and data.pooling_params.token_type_start,
        )

    def step_matcher(self) -> Any:
        """What constrains this request's next token (a grammar matcher, the forced
        end-of-reasoning token, or None)."""
        return step_matcher(self.thinking_gate, self.grammar_matcher)

    def observe_reasoning(self, token_id: int) -> None:
        """Advance the reasoning gate over a sampled token (after the matchers)."""
        if self.thinking_gate is not None:
            self.thinking_gate.observe(token_id)

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


def _start_gate(data: NewRequestData, markers: ReasoningMarkers | None) -> ThinkingGate | None:
    """The reasoning gate of a request that needs one (a grammar or a thinking budget on
    a reasoning model), at the start of its output; None otherwise."""
    budget = data.sampling_params.thinking_token_budget
    if markers is None or (data.grammar is None and budget is None):
        return None
    return ThinkingGate(markers, data.prompt_token_ids, budget)


def _start_matcher(data: NewRequestData, gate: ThinkingGate | None) -> GrammarMatcher | None:
    """A fresh matcher; the tokens generated before a preemption are replayed through it
    (those its gate let through) and through the gate."""
    matcher: GrammarMatcher | None = None
    if data.grammar is not None:
        matcher = data.grammar.new_matcher()
    for token_id in data.output_token_ids:
        current = step_matcher(gate, matcher)
        if current is not None and not current.accept_token(token_id):
            raise ValueError(f"token {token_id} of the output breaks the request's grammar")
        if gate is not None:
            gate.observe(token_id)
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


@dataclass
class _FlatBatch:
    """The numpy arrays of one step, filled request by request (`_add_request`)."""

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    """[num_kv_groups, num_tokens]"""
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    """[num_kv_groups, num_reqs, max_blocks]"""
    logits_rows: list[int] = field(default_factory=list)
    sample_req_ids: list[str] = field(default_factory=list)
    sample_drafts: list[list[int]] = field(default_factory=list)

    @classmethod
    def allocate(
        cls, num_tokens: int, num_reqs: int, num_groups: int, max_blocks: int
    ) -> _FlatBatch:
        return cls(
            input_ids=np.empty(num_tokens, dtype=np.int64),
            positions=np.empty(num_tokens, dtype=np.int64),
            slot_mapping=np.empty((num_groups, num_tokens), dtype=np.int64),
            query_start_loc=np.zeros(num_reqs + 1, dtype=np.int32),
            seq_lens=np.empty(num_reqs, dtype=np.int32),
            block_tables=np.zeros((num_groups, num_reqs, max(max_blocks, 1)), dtype=np.int32),
        )


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
    counts = [num_scheduled_tokens[r] for r in req_ids]
    max_blocks = max((len(states[r].block_ids) for r in req_ids), default=1) // num_kv_groups
    batch = _FlatBatch.allocate(sum(counts), len(req_ids), num_kv_groups, max_blocks)
    offset = 0
    for i, req_id in enumerate(req_ids):
        drafts = (spec_tokens or {}).get(req_id, [])
        _add_request(batch, i, offset, states[req_id], counts[i], drafts, block_size)
        offset += counts[i]
    return StepInputs(
        input_ids=torch.from_numpy(batch.input_ids).to(device),
        positions=torch.from_numpy(batch.positions).to(device),
        attn_metadata=_attention_metadata(batch, max(counts, default=0), device),
        req_ids=list(req_ids),
        logits_indices=torch.tensor(batch.logits_rows, dtype=torch.long, device=device),
        sample_req_ids=batch.sample_req_ids,
        num_scheduled=counts,
        sample_drafts=batch.sample_drafts,
    )


def _add_request(
    batch: _FlatBatch,
    i: int,
    offset: int,
    state: CachedRequestState,
    n: int,
    drafts: list[int],
    block_size: int,
) -> None:
    """Request ``i``'s ``n`` scheduled tokens (its own, then ``drafts``) at rows
    ``offset:offset + n``: ids, positions, KV slots and block table per group, and
    its logits rows when its context is complete after this step."""
    start = state.num_computed_tokens
    end = start + n
    nd = len(drafts)
    batch.input_ids[offset : offset + n - nd] = state.token_slice(start, end - nd)
    batch.input_ids[offset + n - nd : offset + n] = drafts
    pos = np.arange(start, end, dtype=np.int64)
    batch.positions[offset : offset + n] = pos
    if state.token_type_start is not None:
        ids = batch.input_ids[offset : offset + n]
        ids[pos >= state.token_type_start] |= 1 << TOKEN_TYPE_SHIFT
    num_groups = batch.slot_mapping.shape[0]
    for g, ids in enumerate(state.group_block_ids(num_groups)):
        blocks = np.asarray(ids, dtype=np.int64)
        slots = blocks[pos // block_size] * block_size + pos % block_size
        batch.slot_mapping[g, offset : offset + n] = slots
        batch.block_tables[g, i, : len(ids)] = ids
    batch.seq_lens[i] = end
    batch.query_start_loc[i + 1] = batch.query_start_loc[i] + n
    if end - nd >= state.num_tokens:
        # The last own token and each draft: the rows that verify and sample.
        batch.logits_rows.extend(range(offset + n - 1 - nd, offset + n))
        batch.sample_req_ids.append(state.req_id)
        batch.sample_drafts.append(list(drafts))


def _attention_metadata(
    batch: _FlatBatch, max_query_len: int, device: torch.device
) -> AttentionMetadata:
    """The step's metadata: one per KV cache group, the first carrying them all
    (``group_metadata``) when there are several."""
    num_groups, num_reqs = batch.block_tables.shape[:2]
    qsl = torch.from_numpy(batch.query_start_loc).to(device)
    seq_lens = torch.from_numpy(batch.seq_lens).to(device)
    groups = [
        AttentionMetadata(
            num_actual_tokens=batch.input_ids.shape[0],
            max_query_len=max_query_len,
            max_seq_len=int(batch.seq_lens.max()) if num_reqs else 0,
            query_start_loc=qsl,
            seq_lens=seq_lens,
            block_tables=torch.from_numpy(batch.block_tables[g]).to(device),
            slot_mapping=torch.from_numpy(batch.slot_mapping[g]).to(device),
            query_start_loc_cpu=batch.query_start_loc.tolist(),
            seq_lens_cpu=batch.seq_lens.tolist(),
        )
        for g in range(num_groups)
    ]
    if num_groups > 1:
        groups[0].group_metadata = tuple(groups)
    return groups[0]
