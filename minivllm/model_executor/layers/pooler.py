"""Pooling: a prompt's hidden states -> one output, and what follows the model's head.

`pool` reduces the rows of one prompt (LAST, CLS, MEAN, ALL); the model's
``pooling_head`` (identity for embedders, the score head for classifiers) runs on
the pooled rows of a step; `finish_pooled` applies the per-request options
(Matryoshka truncation, L2 normalization, the classifier's activation).  The
pooling math is sentence-transformers' (MEAN: the average over all prompt tokens,
in float32; CLS: the first token; LAST: the last).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from minivllm.pooling_params import PoolingParams


def chunk_rows(pooling_type: str, rows: torch.Tensor, start: int, last_chunk: bool) -> torch.Tensor:
    """What a prompt chunk of hidden ``rows`` [n, H] starting at token ``start`` keeps
    for `pool` (float32): MEAN its row sum [1, H], ALL every row, CLS its first row
    when it starts the prompt, LAST its last row when it ends it; else no row."""
    if pooling_type == "MEAN":
        return rows.float().sum(dim=0, keepdim=True)
    if pooling_type == "ALL":
        return rows.float()
    if pooling_type == "CLS":
        return rows[:1].float() if start == 0 else rows[:0]
    return rows[-1:].float() if last_chunk else rows[:0]


def pool(pooling_type: str, kept: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Pool a whole prompt of ``num_tokens`` tokens from what its chunks kept
    (`chunk_rows`, concatenated)."""
    if pooling_type == "MEAN":
        return kept.sum(dim=0) / num_tokens
    if pooling_type == "ALL":
        return kept
    return kept[0]


def finish_pooled(
    data: torch.Tensor, params: PoolingParams, convert_type: str, logit_bias: float | None
) -> torch.Tensor:
    """The request's output from the model's pooled output: an embedding truncated
    to ``dimensions`` then normalized, or a classifier's probabilities."""
    if convert_type == "classify":
        if logit_bias is not None:
            data = data - logit_bias
        if params.use_activation:
            data = torch.sigmoid(data) if data.shape[-1] == 1 else data.softmax(dim=-1)
        return data
    if params.dimensions is not None:
        data = data[..., : params.dimensions]
    if params.normalize:
        data = F.normalize(data, p=2, dim=-1)
    return data
