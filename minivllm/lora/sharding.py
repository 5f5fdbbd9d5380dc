"""LoRA under tensor parallelism: which part of an adapter a rank holds, and the one
collective the shrunk activations need.

`tensor_parallel.shard_model` records each split layer's checkpoint slices as
``tp_shards`` (by shard id); the LoRA layer around it shards an adapter the same way
(S-LoRA's scheme, as vLLM does):

| base | ``fully_sharded_loras=False`` | ``fully_sharded_loras=True`` |
| --- | --- | --- |
| column-parallel (QKV, gate/up, ...) | A whole; B: the rank's output rows of each slice (its heads, KV heads replicated like the base's) | A: the rank's ``max_lora_rank / tp`` rows; the shrunk activations all-gathered; B as on the left |
| row-parallel (o_proj, down_proj) | A: the rank's input columns; B whole; the partial delta joins the base's partial output before its all-reduce | A as on the left, the shrunk activations all-reduced; B: the rank's ``1 / tp`` of the output, added to that part of the partial output before the all-reduce |

Either way the all-reduce of a row-parallel layer sums every rank's share of the
delta once, so the result equals one process's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from minivllm.math_utils import cdiv
from minivllm.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)


def slice_shard_ids(base: LinearBase) -> list[Any]:
    """The shard id of each projection stacked in ``base`` (q/k/v, gate/up, or one)."""
    if isinstance(base, QKVParallelLinear):
        return ["q", "k", "v"]
    if isinstance(base, MergedColumnParallelLinear):
        return list(range(len(base.output_sizes)))
    return [None]


@dataclass
class LoRASharding:
    """How one LoRA layer's adapters split over the tensor-parallel ranks."""

    tp: Any
    """The base layer's `GroupCoordinator` (more than one rank)."""
    row_parallel: bool
    fully_sharded: bool
    shards: dict[Any, Any]
    """The base's ``tp_shards``: shard id -> `ShardSpec` of this rank."""
    shard_ids: list[Any]
    out_start: int = 0
    out_size: int = 0
    """Fully sharded row-parallel layers: this rank's columns of the output's delta."""

    @property
    def shards_rank(self) -> bool:
        """A holds ``1 / tp`` of each adapter's rank (fully sharded, column-parallel)."""
        return self.fully_sharded and not self.row_parallel

    def a_rank(self, max_rank: int) -> int:
        """Rows of A per (slice, slot) on this rank."""
        return max_rank // self.tp.world_size if self.shards_rank else max_rank

    def b_width(self, size: int) -> int:
        """Columns of B per slice on this rank (``size``: the base slice's local rows)."""
        return self.out_size if self.row_parallel and self.fully_sharded else size

    def shard(
        self, index: int, a: torch.Tensor, b: torch.Tensor, max_rank: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's part of slice ``index``'s (A [r, in], B [out, r])."""
        if self.row_parallel:
            spec = self.shards[None]
            a = a.narrow(1, spec.start, spec.size)
            if self.fully_sharded:
                b = b.narrow(0, self.out_start, self.out_size)
            return a, b
        spec = self.shards[self.shard_ids[index]]
        b = b.narrow(0, spec.start, spec.size)
        if self.fully_sharded:
            padded = a.new_zeros(max_rank, a.shape[1])
            padded[: a.shape[0]] = a
            rows = self.a_rank(max_rank)
            a = padded[self.tp.rank_in_group * rows : (self.tp.rank_in_group + 1) * rows]
        return a, b

    def gather_shrunk(self, xa: torch.Tensor, num_slices: int, num_slots: int) -> torch.Tensor:
        """The shrunk activations every row's expand needs: [tokens, slices * slots * max
        rank] in one process's order."""
        if not self.fully_sharded:
            return xa
        if self.row_parallel:
            return self.tp.all_reduce(xa)
        tokens, world = xa.shape[0], self.tp.world_size
        parts = self.tp.all_gather(xa, dim=-1).view(tokens, world, num_slices, num_slots, -1)
        return parts.permute(0, 2, 3, 1, 4).reshape(tokens, -1)

    def add_row_delta(self, partial: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """A row-parallel base's partial output plus this rank's share of the delta."""
        if not self.fully_sharded:
            return partial + delta
        after = partial.shape[1] - self.out_start - self.out_size
        return partial + torch.nn.functional.pad(delta, (self.out_start, after))


def sharding_of(base: LinearBase, fully_sharded: bool) -> LoRASharding | None:
    """How adapters of ``base`` split over its tensor-parallel group; None: one rank."""
    tp = getattr(base, "tp_group", None)
    shards = getattr(base, "tp_shards", None)
    if tp is None or tp.world_size == 1 or shards is None:
        return None
    row = isinstance(base, RowParallelLinear)
    sharding = LoRASharding(tp, row, fully_sharded, shards, slice_shard_ids(base))
    if row and fully_sharded:
        chunk = cdiv(base.output_size, tp.world_size)
        sharding.out_start = min(tp.rank_in_group * chunk, base.output_size)
        sharding.out_size = min(chunk, base.output_size - sharding.out_start)
    return sharding
