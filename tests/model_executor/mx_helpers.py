"""Test helpers: drive a model over a paged KV cache the way a model runner does;
set the low-bit kernels' residual cut for a block (`residual_cut`)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator

import torch
from torch import nn

from minivllm.attention.forward_context import set_forward_context
from minivllm.attention.layer import bind_kv_caches, get_attention_layers
from minivllm.attention.paged_kv import allocate_kv_caches, build_attention_metadata
from minivllm.kernels import lowbit_cpu


class PagedRunner:
    """Feeds flat batches to ``model`` and keeps per-request block tables.

    Blocks are handed out in a shuffled order so each request's blocks are
    scattered over the cache, as they are after real allocation/free churn.
    """

    def __init__(
        self,
        model: nn.Module,
        num_blocks: int = 64,
        block_size: int = 4,
        kv_dtype: torch.dtype | None = None,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.layers = get_attention_layers(model)
        first = next(iter(self.layers.values()))
        dtype = kv_dtype or next(model.parameters()).dtype
        caches = allocate_kv_caches(
            len(self.layers), num_blocks, block_size, first.num_kv_heads, first.head_size, dtype
        )
        bind_kv_caches(self.layers, caches)
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: dict[str, list[int]] = {}
        self.lens: dict[str, int] = {}

    def step(self, batch: list[tuple[str, list[int]]]) -> torch.Tensor:
        """Run new tokens of several requests in one flat forward; logits per token."""
        ids: list[int] = []
        positions: list[int] = []
        q_lens, s_lens, tables = [], [], []
        for req_id, new_ids in batch:
            start = self.lens.get(req_id, 0)
            end = start + len(new_ids)
            table = self.tables.setdefault(req_id, [])
            while len(table) * self.block_size < end:
                table.append(self.free.pop())
            self.lens[req_id] = end
            ids += new_ids
            positions += range(start, end)
            q_lens.append(len(new_ids))
            s_lens.append(end)
            tables.append(list(table))
        attn_metadata = build_attention_metadata(q_lens, s_lens, tables, self.block_size)
        with torch.no_grad(), set_forward_context(attn_metadata, self.layers):
            hidden = self.model(torch.tensor(ids), torch.tensor(positions))
            return self.model.compute_logits(hidden)


@contextlib.contextmanager
def residual_cut(cut: float) -> Iterator[None]:
    """The low-bit kernels' residual cut set to ``cut`` inside the block, and set back
    to what it was after (the setting is per process: a test must not leave it)."""
    before = lowbit_cpu.residual_cut()
    lowbit_cpu.residual_cut(cut)
    try:
        yield
    finally:
        lowbit_cpu.residual_cut(before)
