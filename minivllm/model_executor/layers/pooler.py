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


def pool(pooling_type: str, rows: torch.Tensor) -> torch.Tensor:
    """Pool the hidden states ``rows`` [n, H] of one whole prompt (float32)."""
    rows = rows.float()
    if pooling_type == "LAST":
        return rows[-1]
    if pooling_type == "CLS":
        return rows[0]
    if pooling_type == "MEAN":
        return rows.mean(dim=0)
    assert pooling_type == "ALL", pooling_type
    return rows


def rows_to_keep(pooling_type: str, start: int, num_rows: int, last_chunk: bool) -> slice:
    """Which rows of a prompt chunk starting at token ``start`` the pooler needs."""
    if pooling_type in ("MEAN", "ALL"):
        return slice(0, num_rows)
    if pooling_type == "CLS":
        return slice(0, 1 if start == 0 else 0)
    return slice(num_rows - 1, num_rows) if last_chunk else slice(0, 0)


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
