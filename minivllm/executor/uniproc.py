"""The single-process executor: one worker in the engine's own process."""

from __future__ import annotations

from typing import Any

from minivllm.logger import init_logger
from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput

logger = init_logger(__name__)


class UniProcExecutor:
    """Drives one `Worker`; chosen for world size 1."""

    def __init__(self, vllm_config: Any) -> None:
        from minivllm.worker.worker import Worker

        self.vllm_config = vllm_config
        self.worker = Worker(vllm_config)
        self.worker.load_model()
        num_blocks, source = self.worker.determine_num_kv_blocks()
        block_size = vllm_config.cache_config.block_size
        per_block = self.worker.model_runner.kv_cache_bytes_per_block()
        if num_blocks < 2:
            raise ValueError(
                f"the KV cache holds only {num_blocks} block(s) of {block_size} tokens ({source}); "
                "give it more memory (--kv-cache-memory-bytes) or lower --max-model-len"
            )
        self.worker.initialize_kv_cache(num_blocks)
        self.num_blocks = num_blocks
        vllm_config.cache_config.num_gpu_blocks = num_blocks
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens, %.2f GiB (%s)",
            num_blocks,
            block_size,
            num_blocks * block_size,
            num_blocks * per_block / (1 << 30),
            source,
        )

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.worker.execute_model(scheduler_output)

    def shutdown(self) -> None:
        """Nothing to stop for an in-process worker."""


def get_executor_class(vllm_config: Any) -> type[UniProcExecutor]:
    """The executor for ``vllm_config``'s parallel layout, or a ValueError saying why not."""
    parallel = vllm_config.parallel_config
    if parallel.world_size > 1:
        raise ValueError(
            f"tensor_parallel_size={parallel.tensor_parallel_size} needs a multi-process "
            "executor, which minivllm does not have yet; use --tensor-parallel-size 1"
        )
    return UniProcExecutor
