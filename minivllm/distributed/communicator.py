"""`GroupCoordinator`: one process group and the collectives the model layers call.

All-reduce and all-gather go through custom ops (``minivllm::all_reduce``,
``minivllm::all_gather``) so that ``torch.compile`` treats them as opaque calls
instead of tracing into torch.distributed; the group travels by name.  A
coordinator without a process group (one rank, nothing initialized) returns its
input unchanged.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

_GROUPS: dict[str, GroupCoordinator] = {}
"""Coordinators by name, for the custom ops (which take strings, not objects)."""


class GroupCoordinator:
    """The ranks of one tensor- or pipeline-parallel group and their collectives."""

    def __init__(
        self,
        name: str,
        ranks: list[int],
        global_rank: int,
        device_group: dist.ProcessGroup | None,
        cpu_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.name = name
        self.ranks = list(ranks)
        self.global_rank = global_rank
        self.world_size = len(ranks)
        self.rank_in_group = self.ranks.index(global_rank)
        self.device_group = device_group
        """Collectives on the model's tensors (nccl on CUDA, gloo on CPU)."""
        self.cpu_group = cpu_group if cpu_group is not None else device_group
        """Gloo group for small CPU-side messages."""
        self.comm_seconds = 0.0
        """Wall time spent in this group's collectives and sends/receives (including
        waiting for slower peers); read and reset by benchmarks."""
        _GROUPS[name] = self

    # -- positions in the group ---------------------------------------------------
    @property
    def is_first_rank(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last_rank(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    @property
    def next_rank(self) -> int:
        """Global rank of the next member (wrapping round)."""
        return self.ranks[(self.rank_in_group + 1) % self.world_size]

    @property
    def prev_rank(self) -> int:
        """Global rank of the previous member (wrapping round)."""
        return self.ranks[(self.rank_in_group - 1) % self.world_size]

    # -- collectives -------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of ``x`` over the group (a new tensor; ``x`` is left as it is)."""
        if self.device_group is None:
            return x
        return torch.ops.minivllm.all_reduce(x, self.name)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """The members' ``x`` concatenated along ``dim`` in rank order."""
        if self.device_group is None:
            return x
        dim = dim % x.dim()
        return torch.ops.minivllm.all_gather(x, dim, self.name)

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``x`` of group member ``src`` on every member (in place)."""
        if self.device_group is not None:
            start = time.perf_counter()
            dist.broadcast(x, src=self.ranks[src], group=self.device_group)
            self.comm_seconds += time.perf_counter() - start
        return x

    def send(self, x: torch.Tensor, dst: int) -> torch.Tensor:
        """Send ``x`` [T, H] to global rank ``dst`` (which must call `recv`); returns a
        copy of ``x`` so that a compiled graph keeps the send (its output is used)."""
        assert self.device_group is not None, "send needs a process group"
        return torch.ops.minivllm.send(x, dst, self.name)

    def recv(
        self, like_rows: torch.Tensor, width: int, dtype: torch.dtype, src: int
    ) -> torch.Tensor:
        """A ``[len(like_rows), width]`` tensor of ``dtype`` sent by global rank ``src``
        (``like_rows`` gives the row count and the device)."""
        assert self.device_group is not None, "recv needs a process group"
        return torch.ops.minivllm.recv(like_rows, width, dtype, src, self.name)

    def barrier(self) -> None:
        if self.cpu_group is not None:
            dist.barrier(group=self.cpu_group)

    def destroy(self) -> None:
        _GROUPS.pop(self.name, None)


def _all_reduce_impl(x: torch.Tensor, group_name: str) -> torch.Tensor:
    group = _GROUPS[group_name]
    start = time.perf_counter()
    out = x.clone()
    dist.all_reduce(out, group=group.device_group)
    group.comm_seconds += time.perf_counter() - start
    return out


def _all_gather_impl(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    group = _GROUPS[group_name]
    start = time.perf_counter()
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(group.world_size)]
    dist.all_gather(parts, x, group=group.device_group)
    out = torch.cat(parts, dim=dim)
    group.comm_seconds += time.perf_counter() - start
    return out


@torch.library.custom_op("minivllm::all_reduce", mutates_args=())
def _all_reduce_op(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return _all_reduce_impl(x, group_name)


@_all_reduce_op.register_fake
def _(x: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("minivllm::all_gather", mutates_args=())
def _all_gather_op(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    return _all_gather_impl(x, dim, group_name)


@_all_gather_op.register_fake
def _(x: torch.Tensor, dim: int, group_name: str) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= len(_GROUPS[group_name].ranks)
    return x.new_empty(shape)


# Point-to-point ops for pipeline stages: custom ops too, since Dynamo refuses to trace
# torch.distributed's send/recv.
@torch.library.custom_op("minivllm::send", mutates_args=())
def _send_op(x: torch.Tensor, dst: int, group_name: str) -> torch.Tensor:
    group = _GROUPS[group_name]
    start = time.perf_counter()
    x = x.contiguous()
    dist.send(x, dst=dst, group=group.device_group)
    group.comm_seconds += time.perf_counter() - start
    return x.clone()


@_send_op.register_fake
def _(x: torch.Tensor, dst: int, group_name: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("minivllm::recv", mutates_args=())
def _recv_op(
    like_rows: torch.Tensor, width: int, dtype: torch.dtype, src: int, group_name: str
) -> torch.Tensor:
    group = _GROUPS[group_name]
    start = time.perf_counter()
    out = torch.empty((like_rows.shape[0], width), dtype=dtype, device=like_rows.device)
    dist.recv(out, src=src, group=group.device_group)
    group.comm_seconds += time.perf_counter() - start
    return out


@_recv_op.register_fake
def _(
    like_rows: torch.Tensor, width: int, dtype: torch.dtype, src: int, group_name: str
) -> torch.Tensor:
    return like_rows.new_empty((like_rows.shape[0], width), dtype=dtype)
