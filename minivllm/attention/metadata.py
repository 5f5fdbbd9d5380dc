"""Per-step attention metadata, built by the model runner and read by attention layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    """Describes the flat batch of one forward pass over a paged KV cache.

    Tokens of all requests are concatenated: request ``i`` owns query tokens
    ``query_start_loc[i]:query_start_loc[i+1]``.  Its context (cached tokens
    plus the new ones) is ``seq_lens[i]`` tokens long, stored in the blocks
    listed in ``block_tables[i]``.
    """

    num_actual_tokens: int
    """Tokens really in the batch (a padded batch may carry more rows)."""
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    """int32 [num_reqs + 1], cumulative query lengths, starting at 0."""
    seq_lens: torch.Tensor
    """int32 [num_reqs], context length per request including this step's tokens."""
    block_tables: torch.Tensor
    """int32 [num_reqs, max_num_blocks_per_req]; unused entries are 0."""
    slot_mapping: torch.Tensor
    """int64 [num_tokens], flat slot (block_id * block_size + offset) where each token's
    K/V are written; -1 for padding tokens (not written)."""
    query_start_loc_cpu: list[int] | None = None
    seq_lens_cpu: list[int] | None = None
    group_metadata: tuple[AttentionMetadata, ...] | None = None
    """With several KV cache groups (sliding-window models): the metadata of each
    group, index 0 being this object; layers of group ``g`` read entry ``g`` (its own
    block tables and slots).  None with one group."""
    backend_plan: dict[str, Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """Values a backend derives from this metadata once per step (index tensors,
    masks) and then reuses in every layer; keyed by backend name."""

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def is_uniform_decode(self) -> bool:
        return self.max_query_len == 1


def metadata_for_layer(attn_metadata: AttentionMetadata, layer: Any) -> AttentionMetadata:
    """The metadata of the KV cache group ``layer`` belongs to."""
    # getattr: layers never bound to a grouped cache (tests) have no kv_group.
    group = getattr(layer, "kv_group", 0)
    if attn_metadata.group_metadata is None or group == 0:
        return attn_metadata
    return attn_metadata.group_metadata[group]
