"""Attention metadata at fixed addresses, for FULL CUDA graphs.

A FULL graph records the attention kernels together with the addresses of the
tensors they read.  Each replay must therefore find the step's query offsets,
sequence lengths, block tables and slot mapping in the same tensors it was captured
with: `GraphAttentionBuffers` owns those tensors (sized for the largest batch), copies
a step's metadata into them, and hands out the metadata view the graph was built on.
A backend that supports full graphs creates them (`make_graph_buffers`).
"""

from __future__ import annotations

import torch

from minivllm.attention.metadata import AttentionMetadata


class GraphAttentionBuffers:
    """Persistent metadata tensors of a backend's full CUDA graphs."""

    def __init__(
        self, max_num_reqs: int, max_blocks_per_req: int, max_num_tokens: int, device: torch.device
    ) -> None:
        self.query_start_loc = torch.zeros(max_num_reqs + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(
            max_num_reqs, max_blocks_per_req, dtype=torch.int32, device=device
        )
        self.slot_mapping = torch.full((max_num_tokens,), -1, dtype=torch.long, device=device)

    def metadata(self, num_tokens: int) -> AttentionMetadata:
        """The view a graph of ``num_tokens`` rows reads; every row counts as actual
        (the kernels skip padding rows by their slot, -1)."""
        return AttentionMetadata(
            num_actual_tokens=num_tokens,
            max_query_len=num_tokens,
            max_seq_len=0,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_tables=self.block_tables,
            slot_mapping=self.slot_mapping[:num_tokens],
        )

    def fill(self, attn_metadata: AttentionMetadata | None, num_tokens: int) -> None:
        """Copy the step's metadata in; rows past it (and everything, for None) become
        padding that writes and reads nothing."""
        self.slot_mapping[:num_tokens].fill_(-1)
        self.seq_lens.zero_()
        self.query_start_loc.zero_()
        if attn_metadata is None:
            return
        n = attn_metadata.slot_mapping.shape[0]
        r = attn_metadata.seq_lens.shape[0]
        self.slot_mapping[:n].copy_(attn_metadata.slot_mapping)
        self.seq_lens[:r].copy_(attn_metadata.seq_lens)
        self.query_start_loc[: r + 1].copy_(attn_metadata.query_start_loc)
        self.query_start_loc[r + 1 :].fill_(attn_metadata.num_actual_tokens)
        self.block_tables[:r, : attn_metadata.block_tables.shape[1]].copy_(
            attn_metadata.block_tables
        )


__all__ = ["GraphAttentionBuffers"]
