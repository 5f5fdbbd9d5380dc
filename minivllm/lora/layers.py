"""LoRA layers: a base projection plus every row's own adapter delta, in one batch.

All adapters in use sit in ``max_loras`` slots of stacked weights, so a batch that
mixes adapters (and rows with none) takes two small GEMMs per projection, whatever
the mix (punica's shrink / expand, in plain torch):

- shrink: ``xa = x @ A_all.T``, A_all [slices * slots * rank, in]: every row's
  projection on every slot's A;
- select: ``xa`` times the row's one-hot slot mask (`LoRARows.mask`) keeps only the
  row's own slot (a row without an adapter keeps nothing);
- expand: per slice (q / k / v, gate / up), ``xa[slice] @ B_slice`` with B_slice
  [slots * rank, slice out], the slices' outputs side by side.

Under tensor parallelism each rank holds its share of the adapters and the delta
joins the base's output where the base's own collective covers it (`sharding`).

The base keeps its own weights and kernel (low-bit GGUF blocks stay low-bit); the
adapter computes in ``lora_dtype``.  Shapes do not depend on which adapters run, so
the compiled forward and graphs keep one shape per batch size; the weights are
written in place when an adapter takes a slot.
"""

from __future__ import annotations

import torch
from torch import nn

from minivllm.lora.sharding import sharding_of
from minivllm.model_executor.layers.linear import (
    LinearBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
)


class LoRARows:
    """Which slot each row of the step uses, as a one-hot mask shared by every layer."""

    def __init__(
        self, num_slots: int, max_num_tokens: int, dtype: torch.dtype, device: torch.device
    ):
        self.num_slots = num_slots
        self.mask = torch.zeros(max_num_tokens, num_slots, dtype=dtype, device=device)
        """[max_num_tokens, num_slots]: 1 where the row uses the slot; read in place."""

    def set_rows(self, slot_ids: list[int]) -> None:
        """Row i uses slot ``slot_ids[i] - 1``; 0 means no adapter."""
        if len(slot_ids) > self.mask.shape[0]:  # a larger step (warm-up): grow in place
            self.mask.resize_(len(slot_ids), self.num_slots)
        self.mask.zero_()
        slots = torch.tensor(slot_ids, dtype=torch.long)
        rows = torch.nonzero(slots > 0).flatten()
        if rows.numel():
            self.mask[rows.to(self.mask.device), (slots[rows] - 1).to(self.mask.device)] = 1


def output_slices(base: LinearBase) -> list[tuple[int, int]]:
    """(offset, size) of each projection stacked in ``base`` (q/k/v, gate/up, or one)."""
    if isinstance(base, QKVParallelLinear):
        return [base.shard_rows(s) for s in ("q", "k", "v")]
    if isinstance(base, MergedColumnParallelLinear):
        return [base.shard_rows(i) for i in range(len(base.output_sizes))]
    return [(0, base.output_size)]


class LoRALinear(nn.Module):
    """``base(x)`` plus each row's adapter delta (see the module docstring)."""

    def __init__(
        self,
        base: LinearBase,
        rows: LoRARows,
        max_rank: int,
        dtype: torch.dtype,
        fully_sharded: bool = False,
    ):
        super().__init__()
        self.base = base
        self.rows = rows
        self.slices = output_slices(base)
        self.max_rank = max_rank
        self.sharding = sharding_of(base, fully_sharded)
        """None: one rank holds the whole adapters."""
        self.a_rank = max_rank if self.sharding is None else self.sharding.a_rank(max_rank)
        """Rows of A per (slice, slot) here: ``max_rank`` unless A's rank is sharded."""
        device = next((t.device for t in base.buffers() if t is not None), None)
        if base.weight is not None:
            device = base.weight.device
        width, a_rows = rows.num_slots * max_rank, len(self.slices) * rows.num_slots * self.a_rank
        self.register_buffer(
            "lora_a",
            torch.zeros(a_rows, base.input_size, dtype=dtype, device=device),
            persistent=False,
        )
        for index, (_, size) in enumerate(self.slices):
            size = size if self.sharding is None else self.sharding.b_width(size)
            b = torch.zeros(width, size, dtype=dtype, device=device)
            self.register_buffer(f"lora_b{index}", b, persistent=False)

    def _rows_of(self, slot: int, index: int) -> int:
        """First row of (slice, slot) in ``lora_a`` (slice-major: a slice's rows are
        contiguous, so its part of ``xa`` is one block)."""
        return (index * self.rows.num_slots + slot) * self.a_rank

    @torch.no_grad()
    def set_slot(self, slot: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write an adapter's (A [r, in], scaled B [out, r]) per slice into ``slot``
        (0-based); slices it does not adapt stay zero.  Whole weights: the layer keeps
        its rank's share."""
        rank_rows = slice(slot * self.max_rank, (slot + 1) * self.max_rank)
        for index in range(len(self.slices)):
            start = self._rows_of(slot, index)
            self.lora_a[start : start + self.a_rank].zero_()
            getattr(self, f"lora_b{index}")[rank_rows].zero_()
        for index, (a, b) in weights.items():
            if self.sharding is not None:
                a, b = self.sharding.shard(index, a, b, self.max_rank)
            start, rank = self._rows_of(slot, index), b.shape[1]
            self.lora_a[start : start + a.shape[0]].copy_(a)
            lora_b = getattr(self, f"lora_b{index}")
            lora_b[slot * self.max_rank : slot * self.max_rank + rank].copy_(b.t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sharding = self.sharding
        if sharding is None or not sharding.row_parallel:
            y = self.base(x)
            return y + self._delta(x).to(y.dtype)
        # Row-parallel: this rank's share of the delta joins its partial output, and
        # the base's all-reduce sums both (the delta counted once).
        partial = LinearBase.forward(self.base, x)
        delta = self._delta(x).to(partial.dtype)
        return sharding.tp.all_reduce(sharding.add_row_delta(partial, delta))

    def _delta(self, x: torch.Tensor) -> torch.Tensor:
        """Every row's adapter delta (this rank's share of it under TP)."""
        num_tokens, num_slices = x.shape[0], len(self.slices)
        xa = torch.nn.functional.linear(x.to(self.lora_a.dtype), self.lora_a)
        if self.sharding is not None:
            xa = self.sharding.gather_shrunk(xa, num_slices, self.rows.num_slots)
        mask = self.rows.mask[:num_tokens].view(num_tokens, 1, -1, 1)
        xa = (xa.view(num_tokens, num_slices, self.rows.num_slots, -1) * mask).flatten(2)
        parts = [xa[:, i] @ getattr(self, f"lora_b{i}") for i in range(num_slices)]
        return parts[0] if num_slices == 1 else torch.cat(parts, dim=1)


def apply_lora(
    model: nn.Module,
    modules: tuple[str, ...],
    rows: LoRARows,
    max_rank: int,
    dtype: torch.dtype,
    fully_sharded: bool = False,
) -> dict[str, LoRALinear]:
    """Replace each linear layer named ``*.<one of modules>`` by a `LoRALinear` around it
    (from outside: the model code stays plain); returns them by module path."""
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, LinearBase) and name.rsplit(".", 1)[-1] in modules
    ]
    wrapped: dict[str, LoRALinear] = {}
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        wrapped[name] = LoRALinear(module, rows, max_rank, dtype, fully_sharded)
        setattr(parent, child, wrapped[name])
    return wrapped
