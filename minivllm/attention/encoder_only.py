"""Bidirectional attention for encoder-only models (BERT): every token of a prompt
sees every other token of the same prompt, and nothing else.

Encoder prompts run whole in one step (the pooling rules turn chunked prefill and
prefix caching off for them), so a step's keys and values are all there is: no KV
cache is read or written.  Plain torch, so it runs on every device.

The prompts of a step are sorted by length and cut into groups of at most
`GROUP_SIZE`; each group is padded to its longest prompt and runs as one SDPA call
with a key-padding mask.  One call per prompt leaves most of the threads idle on
short prompts (measured 3x slower on a 2-core CPU for 32-256-token inputs), while
one call for the whole step pads every prompt to the longest; sorted groups keep
the padding small.  The grouping depends only on the step's metadata, so it is
worked out once per step and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivllm.attention.metadata import AttentionMetadata
from minivllm.math_utils import round_up

ENCODER_ONLY = "encoder_only"
"""`Attention.attn_type` of bidirectional layers (vLLM's ``AttentionType.ENCODER_ONLY``)."""

KERNEL_STARTS = "encoder_only_starts"
"""`AttentionMetadata.backend_plan` key of the prompts' first rows for the CPU kernel."""
GROUP_SIZE = 16
"""Most prompts padded into one SDPA call."""
PAD_MULTIPLE = 16
"""A group's padded length is rounded up to a multiple of this: torch's CPU flash
attention runs lengths of whole 16-row blocks faster (bfloat16, 16 prompts x 12 heads
x 32 dims on a 2-core Sapphire Rapids: 141 rows 4.3 ms, 144 rows 3.3 ms; 250 rows
10.1 ms, 256 rows 7.1 ms)."""


@dataclass
class PaddedGroup:
    """Prompts of similar length attended in one padded SDPA call."""

    rows: torch.Tensor
    """int64 [num_prompts * max_len]: for each padded slot, the token row it holds
    (padding slots repeat a row of the group; their keys are masked out)."""
    token_slots: torch.Tensor
    """int64 [num_tokens of the group]: the padded slot of each token, in row order."""
    token_rows: torch.Tensor
    """int64 [num_tokens of the group]: the rows those tokens came from."""
    num_prompts: int
    max_len: int
    key_mask: torch.Tensor | None
    """bool [num_prompts, 1, 1, max_len]; None when no prompt is padded."""


def plan_groups(starts: list[int], device: torch.device) -> list[PaddedGroup]:
    """The padded groups of a flat batch whose prompt ``i`` is rows
    ``starts[i]:starts[i + 1]``."""
    spans = sorted(
        ((b, e) for b, e in zip(starts[:-1], starts[1:], strict=True) if e > b),
        key=lambda s: s[1] - s[0],
    )
    groups = []
    for g in range(0, len(spans), GROUP_SIZE):
        members = spans[g : g + GROUP_SIZE]
        max_len = round_up(max(e - b for b, e in members), PAD_MULTIPLE)
        rows, slots, token_rows, lens = [], [], [], []
        for i, (b, e) in enumerate(members):
            n = e - b
            rows.extend(range(b, e))
            rows.extend([b] * (max_len - n))
            slots.extend(range(i * max_len, i * max_len + n))
            token_rows.extend(range(b, e))
            lens.append(n)
        mask = None
        if min(lens) < max_len:
            lens_t = torch.tensor(lens, device=device)[:, None]
            mask = (torch.arange(max_len, device=device)[None, :] < lens_t)[:, None, None, :]
        groups.append(
            PaddedGroup(
                torch.tensor(rows, device=device),
                torch.tensor(slots, device=device),
                torch.tensor(token_rows, device=device),
                len(members),
                max_len,
                mask,
            )
        )
    return groups


def _starts(attn_metadata: AttentionMetadata) -> list[int]:
    """The first row of each prompt of the step, and the row count last."""
    return attn_metadata.query_start_loc_cpu or attn_metadata.query_start_loc.tolist()


def _groups_of(
    attn_metadata: AttentionMetadata | None, t: int, device: torch.device
) -> list[PaddedGroup]:
    if attn_metadata is None:  # start-up runs: the batch is one prompt
        return plan_groups([0, t], device)
    groups = attn_metadata.backend_plan.get(ENCODER_ONLY)
    if groups is None:
        groups = attn_metadata.backend_plan[ENCODER_ONLY] = plan_groups(
            _starts(attn_metadata), device
        )
    return groups


def _starts_of(attn_metadata: AttentionMetadata | None, t: int) -> torch.Tensor:
    if attn_metadata is None:
        return torch.tensor([0, t])
    starts = attn_metadata.backend_plan.get(KERNEL_STARTS)
    if starts is None:
        starts = attn_metadata.backend_plan[KERNEL_STARTS] = torch.tensor(_starts(attn_metadata))
    return starts


def _use_kernel(query: torch.Tensor) -> bool:
    if query.device.type != "cpu" or query.dtype not in (torch.float32, torch.bfloat16):
        return False
    from minivllm.kernels import lowbit_cpu

    return lowbit_cpu.available()


def encoder_only_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_metadata: AttentionMetadata | None,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Fill ``out`` [T, nh, hd] with attention within each prompt of the flat batch:
    on CPU minivllm's unpadded kernel (``encoder_attention_cpu.cpp``: about twice
    torch's flash attention at head size 32-64), elsewhere padded SDPA groups."""
    if _use_kernel(query):
        starts = _starts_of(attn_metadata, query.shape[0])
        out.copy_(torch.ops.minivllm_cpu.encoder_attention(query, key, value, starts, scale))
        return
    gqa = key.shape[1] != query.shape[1]
    for group in _groups_of(attn_metadata, query.shape[0], query.device):
        res = F.scaled_dot_product_attention(
            _padded(query, group),
            _padded(key, group),
            _padded(value, group),
            attn_mask=group.key_mask,
            scale=scale,
            enable_gqa=gqa,
        )
        flat = res.transpose(1, 2).reshape(group.num_prompts * group.max_len, *out.shape[1:])
        out.index_copy_(0, group.token_rows, flat.index_select(0, group.token_slots))


def _padded(x: torch.Tensor, group: PaddedGroup) -> torch.Tensor:
    """Rows [T, heads, hd] -> the group's padded [num_prompts, heads, max_len, hd]."""
    rows = x.index_select(0, group.rows)
    return rows.view(group.num_prompts, group.max_len, *x.shape[1:]).transpose(1, 2)
