"""A node above 0 of a multi-node "mp" run: ``minivllm serve ... --node-rank K``
runs this node's ranks for the engine on node 0, and no HTTP server."""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivllm.executor.node_launcher import run_node
from minivllm.platforms.cpu import cpu_threads_per_rank

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


def run_worker_node(vllm_config: VllmConfig) -> int:
    """Run this node's ranks until node 0's engine stops; the exit status."""
    parallel = vllm_config.parallel_config
    return run_node(vllm_config, cpu_threads_per_rank(parallel.ranks_per_node))


__all__ = ["run_worker_node"]
