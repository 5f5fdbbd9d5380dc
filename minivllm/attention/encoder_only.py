"""Bidirectional attention for encoder-only models (BERT): every token of a prompt
sees every other token of the same prompt, and nothing else.

Encoder prompts run whole in one step (the pooling rules turn chunked prefill and
prefix caching off for them), so a step's keys and values are all there is: no KV
cache is read or written.  Plain torch, so it runs on every device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.attention.metadata import AttentionMetadata

ENCODER_ONLY = "encoder_only"
"""`Attention.attn_type` of bidirectional layers (vLLM's ``AttentionType.ENCODER_ONLY``)."""


def encoder_only_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_metadata: AttentionMetadata | None,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Fill ``out`` [T, nh, hd] with attention within each prompt of the flat batch.

    Without metadata (start-up runs) the batch is one prompt."""
    t = query.shape[0]
    starts = [0, t]
    if attn_metadata is not None:
        starts = attn_metadata.query_start_loc_cpu or attn_metadata.query_start_loc.tolist()
    gqa = key.shape[1] != query.shape[1]
    for begin, end in zip(starts[:-1], starts[1:], strict=True):
        if end <= begin:
            continue
        res = F.scaled_dot_product_attention(
            query[begin:end].transpose(0, 1)[None],
            key[begin:end].transpose(0, 1)[None],
            value[begin:end].transpose(0, 1)[None],
            scale=scale,
            enable_gqa=gqa,
        )
        out[begin:end].copy_(res[0].transpose(0, 1))
