"""Start-up of torch.distributed and the tensor-/pipeline-parallel groups.

Ranks are laid out as in vLLM: ``rank = pp_rank * tp_size + tp_rank``, so a
tensor-parallel group is a run of consecutive ranks and a pipeline group takes
the ranks with the same ``tp_rank``.  The groups live for the whole process
(one engine rank per process), like torch.distributed's own default group;
before `initialize_model_parallel` every getter returns a one-rank group whose
collectives are no-ops, so single-process code paths need no special case.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from minivllm.distributed.communicator import GroupCoordinator
from minivllm.logger import init_logger

logger = init_logger(__name__)


@dataclass
class _ParallelGroups:
    world: GroupCoordinator
    tp: GroupCoordinator
    pp: GroupCoordinator


_SINGLE = _ParallelGroups(
    world=GroupCoordinator("world1", [0], 0, None),
    tp=GroupCoordinator("tp1", [0], 0, None),
    pp=GroupCoordinator("pp1", [0], 0, None),
)
_groups: _ParallelGroups = _SINGLE


def output_rank(world_size: int, tensor_parallel_size: int) -> int:
    """The global rank that samples and whose step output the engine uses: the first
    tensor-parallel rank of the last pipeline stage."""
    return world_size - tensor_parallel_size


def default_backend(device_type: str) -> str:
    """nccl for CUDA tensors, gloo for CPU ones."""
    return "nccl" if device_type == "cuda" else "gloo"


def init_distributed_environment(
    world_size: int,
    rank: int,
    init_method: str,
    backend: str = "gloo",
    timeout_s: float = 1800.0,
) -> None:
    """Join the default process group (``init_method`` like ``tcp://host:port``)."""
    if dist.is_initialized():
        return
    dist.init_process_group(
        backend=backend,
        init_method=init_method,
        world_size=world_size,
        rank=rank,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    logger.info("rank %d/%d joined torch.distributed (%s)", rank, world_size, backend)


def initialize_model_parallel(tensor_parallel_size: int, pipeline_parallel_size: int) -> None:
    """Create the TP and PP groups of this process (every rank must call it)."""
    global _groups
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    if tp * pp != world_size:
        raise ValueError(
            f"tensor_parallel_size={tp} x pipeline_parallel_size={pp} != world size {world_size}"
        )
    backend = dist.get_backend()
    # Every rank must create every group, in the same order (torch.distributed's rule).
    gloo = "gloo" if backend != "gloo" else None
    world_cpu = dist.new_group(list(range(world_size)), backend=gloo) if gloo else None
    world = GroupCoordinator("world", list(range(world_size)), rank, dist.group.WORLD, world_cpu)
    tp_group = pp_group = None
    for p in range(pp):
        ranks = [p * tp + t for t in range(tp)]
        g = dist.new_group(ranks, backend=backend)
        cpu = dist.new_group(ranks, backend=gloo) if gloo else None
        if rank in ranks:
            tp_group = GroupCoordinator("tp", ranks, rank, g, cpu)
    for t in range(tp):
        ranks = [p * tp + t for p in range(pp)]
        g = dist.new_group(ranks, backend=backend)
        cpu = dist.new_group(ranks, backend=gloo) if gloo else None
        if rank in ranks:
            pp_group = GroupCoordinator("pp", ranks, rank, g, cpu)
    assert tp_group is not None and pp_group is not None
    _groups = _ParallelGroups(world=world, tp=tp_group, pp=pp_group)


def model_parallel_is_initialized() -> bool:
    return _groups is not _SINGLE


def get_world_group() -> GroupCoordinator:
    return _groups.world


def get_tp_group() -> GroupCoordinator:
    """This rank's tensor-parallel group (one rank before initialization)."""
    return _groups.tp


def get_pp_group() -> GroupCoordinator:
    """This rank's pipeline-parallel group (one rank before initialization)."""
    return _groups.pp


def destroy_distributed_environment() -> None:
    """Leave the groups and torch.distributed (safe to call when never initialized)."""
    global _groups
    for g in (_groups.world, _groups.tp, _groups.pp):
        g.destroy()
    _groups = _SINGLE
    if dist.is_initialized():
        dist.destroy_process_group()


def local_device(device_type: str, local_rank: int) -> torch.device:
    """The device of rank ``local_rank`` on this machine."""
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device(device_type)
