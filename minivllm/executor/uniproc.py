"""The single-process executor: one worker in the engine's own process."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from minivllm.kv_cache.groups import KVCacheGroups, max_blocks_per_request
from minivllm.logger import init_logger
from minivllm.math_utils import cdiv
from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


class UniProcExecutor:
    """Drives one `Worker`; chosen for world size 1."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        from minivllm.worker.worker import Worker

        self.vllm_config = vllm_config
        self.worker = Worker(vllm_config)
        self.worker.load_model()
        num_blocks, source = self.worker.determine_num_kv_blocks()
        per_block = self.worker.model_runner.kv_cache_bytes_per_block()
        groups = self.worker.model_runner.kv_groups
        assert groups is not None
        self.kv_group_windows: tuple[int | None, ...] = groups.windows
        """Sliding window of each KV cache group, for the scheduler's KV cache manager."""
        self.num_blocks = finish_kv_cache_sizing(vllm_config, num_blocks, source, per_block, groups)
        self.worker.initialize_kv_cache(self.num_blocks)

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        """Run one step; with ``non_block`` the result comes as a finished future (one
        process has nothing to overlap)."""
        out = self.worker.execute_model(scheduler_output)
        if not non_block:
            return out
        future: Future[ModelRunnerOutput] = Future()
        future.set_result(out)
        return future

    def is_healthy(self) -> bool:
        """An in-process worker cannot die on its own."""
        return True

    def shutdown(self) -> None:
        """An in-process worker only has its KV connector to stop (its server, its
        load thread)."""
        connector = self.worker.model_runner.kv_connector
        if connector is not None:
            connector.shutdown()


def finish_kv_cache_sizing(
    vllm_config: VllmConfig,
    num_blocks: int,
    source: str,
    per_block: int,
    groups: KVCacheGroups | None = None,
) -> int:
    """Check the KV cache size every worker agreed on, record and log it; returns it."""
    block_size = vllm_config.cache_config.block_size
    if num_blocks < 2:
        raise ValueError(
            f"the KV cache holds only {num_blocks} block(s) of {block_size} tokens ({source}); "
            "give it more memory (--kv-cache-memory-bytes) or lower --max-model-len"
        )
    check_kv_cache_holds_max_model_len(vllm_config, num_blocks, source, groups)
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    logger.info(
        "start-up 3/4: KV cache: %d blocks x %d tokens = %d tokens, %.2f GiB (%s)",
        num_blocks,
        block_size,
        num_blocks * block_size,
        num_blocks * per_block / (1 << 30),
        source,
    )
    return num_blocks


def set_up_ranks(
    vllm_config: VllmConfig, rpc: Callable[..., list[Any]], init_method: str
) -> tuple[int, tuple[int | None, ...]]:
    """Load every rank (``rpc`` calls a `RankWorker` method on all of them), agree on
    the KV cache size (the smallest any rank holds) and allocate it everywhere;
    returns (KV blocks, the sliding window of each KV cache group)."""
    sizes = rpc("load", init_method)
    per_block = rpc("kv_cache_bytes_per_block")[0]
    num_blocks, source = min(sizes)
    groups = rpc("kv_groups")[0]
    num_blocks = finish_kv_cache_sizing(vllm_config, num_blocks, source, per_block, groups)
    rpc("initialize_kv_cache", num_blocks)
    return num_blocks, groups.windows


def check_kv_cache_holds_max_model_len(
    vllm_config: VllmConfig, num_blocks: int, source: str, groups: KVCacheGroups | None = None
) -> None:
    """The KV cache must hold one request of ``max_model_len`` tokens, as in vLLM.

    Otherwise long requests would be cut short at run time (finish_reason "length")
    though they passed validation.  A ``max_model_len`` the user chose is an error that
    names both fixes; one taken from the model is lowered to what fits, with a warning.
    Block 0 is the KV cache manager's null block, so ``num_blocks - 1`` blocks hold tokens.
    """
    model_config = vllm_config.model_config
    block_size = vllm_config.cache_config.block_size
    # A resolved config (the only kind the engine runs) has all three.
    assert (
        model_config is not None
        and model_config.max_model_len is not None
        and block_size is not None
    )
    max_model_len = model_config.max_model_len
    needed = cdiv(max_model_len, block_size) + 1
    if groups is not None and groups.num_groups > 1:
        # Sliding-window groups hold only their window (plus one step's chunk).
        chunk = vllm_config.scheduler_config.max_num_batched_tokens
        capacity = _longest_request(groups, num_blocks - 1, block_size, chunk, max_model_len)
        needed = max_blocks_per_request(groups, max_model_len, block_size, chunk) + 1
    else:
        capacity = (num_blocks - 1) * block_size
    if capacity >= max_model_len:
        return
    origin = vllm_config.provenance.origins.get("model_config.max_model_len")
    if origin is not None and origin.source == "user":
        raise ValueError(
            f"max_model_len={max_model_len} does not fit in the KV cache: it holds "
            f"{capacity} tokens ({num_blocks} blocks of {block_size} tokens, one reserved; "
            f"from {source}), and one request of max_model_len tokens needs "
            f"{needed} blocks. Give the KV cache more room "
            "(--num-gpu-blocks-override, --kv-cache-memory-bytes, or "
            f"--gpu-memory-utilization on a GPU), or lower --max-model-len to {capacity} "
            "or less."
        )
    logger.warning(
        "The KV cache holds %d tokens (%d blocks of %d tokens, one reserved; from %s), "
        "less than the model's max_model_len of %d: lowering max_model_len to %d. Give "
        "the KV cache more room to serve longer requests, or set --max-model-len.",
        capacity,
        num_blocks,
        block_size,
        source,
        max_model_len,
        capacity,
    )
    model_config.max_model_len = capacity


def _longest_request(
    groups: KVCacheGroups, usable: int, block_size: int, chunk: int, limit: int
) -> int:
    """Longest request (a multiple of the block size, at most ``limit``) that fits."""
    lo, hi = 0, cdiv(limit, block_size)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        fits = max_blocks_per_request(groups, mid * block_size, block_size, chunk) <= usable
        lo, hi = (mid, hi) if fits else (lo, mid - 1)
    return min(lo * block_size, limit)
