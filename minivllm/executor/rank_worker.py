"""`RankWorker`: one rank of a multi-process engine, driven by an executor.

The same class runs in a spawned process (the "mp" executor) and as a Ray actor
(the "ray" executor); the executor calls its methods in the same order on every
rank: `load` (join the groups, build and load this rank's shard, size its KV
cache), `initialize_kv_cache` with the smallest size over ranks, then `execute`
once per step.  Only the output rank (the first tensor-parallel rank of the last
pipeline stage) returns the step's `ModelRunnerOutput`; the others return None.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig
    from minivllm.kv_cache.groups import KVCacheGroups
    from minivllm.worker.worker import Worker


def output_rank(vllm_config: VllmConfig) -> int:
    """Global rank whose step output the engine uses."""
    from minivllm.distributed import output_rank as rank_rule

    parallel = vllm_config.parallel_config
    return rank_rule(parallel.world_size, parallel.tensor_parallel_size)


class RankWorker:
    """Holds this rank's `Worker` between the executor's calls."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        rank: int,
        local_rank: int,
        cpu_threads: int,
    ) -> None:
        self.vllm_config = vllm_config
        self.rank = rank
        self.local_rank = local_rank
        self.is_output_rank = rank == output_rank(vllm_config)
        self.cpu_threads = cpu_threads
        """This rank's torch threads on CPU (`cpu_threads_per_rank` of the executor)."""
        self.worker: Worker | None = None

    def load(self, distributed_init_method: str) -> tuple[int, str]:
        """Join torch.distributed (``tcp://host:port`` of rank 0), load this rank's
        weights; returns (KV blocks, where the number came from)."""
        from minivllm.worker.worker import Worker

        self.vllm_config.parallel_config.rank = self.rank
        self.worker = Worker(
            self.vllm_config,
            self.rank,
            self.local_rank,
            distributed_init_method,
            cpu_threads=self.cpu_threads,
        )
        self.worker.load_model()
        return self.worker.determine_num_kv_blocks()

    def kv_cache_bytes_per_block(self) -> int:
        assert self.worker is not None
        return self.worker.model_runner.kv_cache_bytes_per_block()

    def kv_groups(self) -> KVCacheGroups:
        """How this rank's attention layers share KV blocks (the same on every rank)."""
        assert self.worker is not None and self.worker.model_runner.kv_groups is not None
        return self.worker.model_runner.kv_groups

    def initialize_kv_cache(self, num_blocks: int) -> None:
        assert self.worker is not None
        self.worker.initialize_kv_cache(num_blocks)

    def execute(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        assert self.worker is not None
        out = self.worker.execute_model(scheduler_output)
        return out if self.is_output_rank else None

    def list_loras(self) -> list[int]:
        """Ids of the LoRA adapters loaded on this rank (vLLM's worker call)."""
        assert self.worker is not None
        lora = self.worker.model_runner.lora
        return [] if lora is None else lora.loaded_ids()

    def pid(self) -> int:
        return os.getpid()

    def take_comm_seconds(self) -> float:
        """Seconds this rank spent in collectives and sends/receives since the last call."""
        from minivllm.distributed import get_pp_group, get_tp_group, get_world_group

        groups = {id(g): g for g in (get_world_group(), get_tp_group(), get_pp_group())}
        total = sum(g.comm_seconds for g in groups.values())
        for g in groups.values():
            g.comm_seconds = 0.0
        return total

    def node_ip_and_free_port(self) -> tuple[str, int]:
        """An address the other ranks can reach this one at (rank 0 hosts the rendezvous)."""
        import socket

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:  # the interface a route out would use; no packet is sent
                s.connect(("10.255.255.255", 1))
                ip = s.getsockname()[0]
            except OSError:
                ip = "127.0.0.1"
        with socket.socket() as s:
            s.bind(("", 0))
            return ip, int(s.getsockname()[1])

    def num_threads(self) -> int:
        import torch

        return torch.get_num_threads()

    def close(self) -> None:
        from minivllm.distributed import destroy_distributed_environment

        destroy_distributed_environment()
