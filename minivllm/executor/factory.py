"""Pick the executor for a configuration's parallel layout and backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


def get_executor_class(vllm_config: VllmConfig) -> type[Any]:
    """``uni`` (one rank in this process), ``mp`` (spawned processes) or ``ray`` (actors)."""
    backend = vllm_config.parallel_config.distributed_executor_backend
    if backend == "mp":
        from minivllm.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor
    if backend == "ray":
        from minivllm.executor.ray_executor import RayExecutor

        return RayExecutor
    if vllm_config.parallel_config.world_size > 1:
        raise ValueError(
            f"world size {vllm_config.parallel_config.world_size} needs the 'mp' or 'ray' "
            f"executor, not {backend!r}; set --distributed-executor-backend mp"
        )
    from minivllm.executor.uniproc import UniProcExecutor

    return UniProcExecutor
