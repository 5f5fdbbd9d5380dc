"""Tensor parallelism as a thin layer over the plain layers: shard after building.

The layer classes in ``linear.py`` and ``vocab_embedding.py`` hold full weights and
know nothing of ranks.  `shard_model` walks a freshly built model and, for each
layer that tensor parallelism splits, (1) replaces its weight with this rank's
shard, (2) records a `ShardSpec` telling the weight loader which slice of each
checkpoint tensor belongs here (kept as the layer's ``tp_shards``, by shard id, for
the LoRA layers that shard adapters the same way), and (3) swaps the module's class for a subclass
that adds the one collective the split needs:

| layer | split | collective |
| --- | --- | --- |
| `ColumnParallelLinear`, merged gate/up, QKV | output rows (per piece, per head) | none |
| `RowParallelLinear` | input columns; the bias lives on rank 0 | all-reduce of the output |
| `VocabParallelEmbedding` | vocabulary rows (padded to a multiple of the size) | all-reduce |
| `ParallelLMHead` + `LogitsProcessor` | vocabulary rows | all-gather of the logits |

QKV keeps whole heads per rank; with fewer KV heads than ranks each KV head is
replicated on ``tp_size / num_kv_heads`` consecutive ranks, as in vLLM.  The model
code picks its per-rank head counts from `get_tp_group` (see ``models/llama.py``).
Checkpoint tensors are narrowed before the copy, and a lazily read safetensors
slice (`LazyWeight`) is read only for this rank's part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from minivllm.distributed.communicator import GroupCoordinator
from minivllm.math_utils import cdiv
from minivllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from minivllm.model_executor.layers.utils import (
    default_weight_loader,
    get_weight_loader,
    make_param,
    set_weight_loader,
)
from minivllm.model_executor.layers.vocab_embedding import (
    LogitsProcessor,
    ParallelLMHead,
    VocabParallelEmbedding,
)


@dataclass(frozen=True)
class ShardSpec:
    """This rank's slice of a checkpoint tensor: ``size`` rows/columns from ``start``."""

    dim: int
    start: int
    size: int


class LazyWeight:
    """A checkpoint tensor not read yet; `narrow` reads only the slice asked for."""

    def __init__(self, source: Any) -> None:
        self._source = source  # a safetensors PySafeSlice
        self.shape = tuple(source.get_shape())

    def narrow(self, dim: int, start: int, size: int) -> torch.Tensor:
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + size)
        return self._source[tuple(index)]

    def materialize(self) -> torch.Tensor:
        return self._source[tuple(slice(None) for _ in self.shape)]


def materialize(loaded: Any) -> torch.Tensor:
    """A real tensor from a tensor or a `LazyWeight`."""
    return loaded.materialize() if isinstance(loaded, LazyWeight) else loaded


def narrow(loaded: Any, spec: ShardSpec) -> torch.Tensor:
    """The part of ``loaded`` that ``spec`` names (clipped to the tensor's end)."""
    size = max(0, min(spec.size, loaded.shape[spec.dim] - spec.start))
    return loaded.narrow(spec.dim, spec.start, size)


# -- the subclasses that add a collective --------------------------------------------
class _RowParallelMixin:
    tp_group: GroupCoordinator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp_group.all_reduce(super().forward(x))  # type: ignore[misc]


class _VocabEmbeddingMixin:
    tp_group: GroupCoordinator
    vocab_start: int
    vocab_end: int

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(mine, input_ids - self.vocab_start, 0)
        out = super().forward(local_ids)  # type: ignore[misc]
        return self.tp_group.all_reduce(out.masked_fill(~mine.unsqueeze(-1), 0))


class _LogitsMixin:
    tp_group: GroupCoordinator
    vocab_size: int

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor) -> torch.Tensor:
        local = super().forward(lm_head, hidden_states)  # type: ignore[misc]
        return self.tp_group.all_gather(local, dim=-1)[..., : self.vocab_size]


_CLASSES: dict[tuple[type, type], type] = {}


def _swap_class(module: nn.Module, mixin: type | None, tp: GroupCoordinator) -> None:
    module.tp_group = tp  # type: ignore[assignment]
    if mixin is None:
        return
    base = type(module)
    key = (mixin, base)
    if key not in _CLASSES:
        _CLASSES[key] = type(f"TP{base.__name__}", (mixin, base), {})
    module.__class__ = _CLASSES[key]


def _replace(module: nn.Module, name: str, shape: tuple[int, ...], loader: Any) -> nn.Parameter:
    old = getattr(module, name)
    param = make_param(*shape, dtype=old.dtype)
    param.data = param.data.to(old.device)
    set_weight_loader(param, loader)
    setattr(module, name, param)
    return param


# -- one function per kind of layer ----------------------------------------------------
def _qkv_specs(m: QKVParallelLinear, tp: GroupCoordinator) -> dict[str, ShardSpec]:
    rank, size = tp.rank_in_group, tp.world_size
    heads = m.num_heads // size
    if m.num_kv_heads >= size:
        kv_heads, kv_first = m.num_kv_heads // size, rank * (m.num_kv_heads // size)
    else:  # replicate: ranks [i * r, (i + 1) * r) share KV head i
        kv_heads, kv_first = 1, rank // (size // m.num_kv_heads)
    d = m.head_size
    return {
        "q": ShardSpec(0, rank * heads * d, heads * d),
        "k": ShardSpec(0, kv_first * d, kv_heads * d),
        "v": ShardSpec(0, kv_first * d, kv_heads * d),
    }


def _shard_output_rows(m: nn.Module, tp: GroupCoordinator) -> None:
    """Column-parallel layers: the output rows of each piece, split per rank."""
    if isinstance(m, QKVParallelLinear):
        specs: dict[Any, ShardSpec] = _qkv_specs(m, tp)
        m.num_heads //= tp.world_size
        m.num_kv_heads = specs["k"].size // m.head_size
        m.q_size, m.kv_size = specs["q"].size, specs["k"].size
        m.output_size = m.q_size + 2 * m.kv_size
    elif isinstance(m, MergedColumnParallelLinear):
        local = [s // tp.world_size for s in m.output_sizes]
        specs = {i: ShardSpec(0, tp.rank_in_group * s, s) for i, s in enumerate(local)}
        m.output_sizes = local
        m.output_size = sum(local)
    else:
        rows = m.output_size // tp.world_size
        specs = {None: ShardSpec(0, tp.rank_in_group * rows, rows)}
        m.output_size = rows

    def loader(param: nn.Parameter, loaded: Any, shard_id: int | str | None = None) -> None:
        if shard_id not in specs:
            raise ValueError(
                f"{type(m).__name__} cannot shard a fused checkpoint tensor over "
                f"tensor-parallel ranks (shard {shard_id!r}); use tensor_parallel_size=1"
            )
        m.weight_loader(param, narrow(loaded, specs[shard_id]), shard_id)

    m.tp_shards = specs  # type: ignore[assignment]
    for name in ("weight", "bias"):
        if getattr(m, name, None) is not None:
            old = getattr(m, name)
            _replace(m, name, (m.output_size, *old.shape[1:]), loader)
    _swap_class(m, None, tp)


def _shard_input_columns(m: RowParallelLinear, tp: GroupCoordinator) -> None:
    cols = m.input_size // tp.world_size
    spec = ShardSpec(1, tp.rank_in_group * cols, cols)
    m.input_size = cols
    m.tp_shards = {None: spec}  # type: ignore[assignment]

    def weight_loader(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        default_weight_loader(param, narrow(loaded, spec))

    def bias_loader(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        # The partial outputs are summed over ranks: add the bias once.
        if tp.rank_in_group == 0:
            default_weight_loader(param, materialize(loaded))
        else:
            param.data.zero_()

    _replace(m, "weight", (m.output_size, cols), weight_loader)
    if m.bias is not None:
        _replace(m, "bias", (m.output_size,), bias_loader)
    _swap_class(m, _RowParallelMixin, tp)


def _shard_vocab(m: VocabParallelEmbedding, tp: GroupCoordinator, replaced: dict) -> None:
    per_rank = cdiv(m.num_embeddings, tp.world_size)
    m.vocab_start = tp.rank_in_group * per_rank  # type: ignore[assignment]
    m.vocab_end = min(m.vocab_start + per_rank, m.num_embeddings)  # type: ignore[assignment]
    spec = ShardSpec(0, m.vocab_start, per_rank)

    def loader(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        part = narrow(loaded, spec)
        param.data[: part.shape[0]].copy_(part)
        param.data[part.shape[0] :].zero_()

    if id(m.weight) in replaced:  # an LM head tied to the (already sharded) embedding
        m.weight = replaced[id(m.weight)]
    else:
        old = m.weight
        replaced[id(old)] = _replace(m, "weight", (per_rank, m.embedding_dim), loader)
    is_head = isinstance(m, ParallelLMHead)
    _swap_class(m, None if is_head else _VocabEmbeddingMixin, tp)


def shard_model(model: nn.Module, tp: GroupCoordinator) -> int:
    """Shard ``model``'s layers over ``tp`` before its weights are loaded; returns how
    many layers were split (0 for one rank).  Parameters left whole get a loader that
    reads a `LazyWeight` in full."""
    if tp.world_size == 1:
        return 0
    replaced: dict[int, nn.Parameter] = {}
    count = 0
    for m in list(model.modules()):
        if isinstance(m, RowParallelLinear):
            _shard_input_columns(m, tp)
        elif isinstance(m, (ColumnParallelLinear, MergedColumnParallelLinear, QKVParallelLinear)):
            _shard_output_rows(m, tp)
        elif isinstance(m, VocabParallelEmbedding):
            _shard_vocab(m, tp, replaced)
        elif isinstance(m, LogitsProcessor):
            _swap_class(m, _LogitsMixin, tp)
            continue
        else:
            continue
        count += 1
    sharded = {id(p) for p in replaced.values()}
    for m in model.modules():
        if getattr(m, "tp_group", None) is not None:
            sharded.update(id(p) for p in m.parameters(recurse=False))
    for p in model.parameters():
        if id(p) not in sharded:
            set_weight_loader(p, _whole(get_weight_loader(p)))
    return count


def _whole(loader: Any) -> Any:
    def load(param: nn.Parameter, loaded: Any, *args: Any) -> None:
        loader(param, materialize(loaded), *args)

    return load
