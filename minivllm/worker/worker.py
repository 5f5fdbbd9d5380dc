"""The worker: one device, its threads, its memory budget, and the model runner.

Thread settings on CPU (measured on a 2-core machine, see README):
- libgomp threads spin-wait ~300k iterations by default, which starves other
  processes (decode 2-30x slower on a busy machine), while not spinning at all
  costs 1.2-1.45x on an idle one; ``minivllm/__init__.py`` sets a short spin
  (``GOMP_SPINCOUNT=1000``) before torch is imported (an explicit user value wins).
- torch uses one intra-op thread per core the process may run on
  (``os.sched_getaffinity``), unless ``MINIVLLM_CPU_THREADS`` says otherwise; a
  multi-process engine splits them over its ranks (`cpu_threads_per_rank`).
- glibc's malloc thresholds are fixed (`configure_cpu_malloc`) so that per-step
  tensors come from the heap instead of fresh, page-faulting mmaps.
"""

from __future__ import annotations

import ctypes
import platform
from typing import TYPE_CHECKING

import psutil
import torch

from minivllm import envs
from minivllm.distributed.parallel_state import (
    default_backend,
    init_distributed_environment,
    initialize_model_parallel,
    local_device,
)
from minivllm.kernels import lowbit_cpu
from minivllm.kv_cache.groups import max_blocks_per_request
from minivllm.logger import init_logger
from minivllm.math_utils import cdiv
from minivllm.platforms.cpu import cpu_threads_per_rank
from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput
from minivllm.worker.model_runner import ModelRunner

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

GiB = 1 << 30
DEFAULT_CPU_KV_CACHE_BYTES = 1 * GiB
"""CPU default KV space when no size is configured: 23k tokens of the default model in
float32, more than a CPU batch uses, and quick to allocate (the cache is zeroed)."""


def configure_cpu_threads(num_threads: int) -> int:
    """Set torch's intra-op threads; returns the count torch took."""
    torch.set_num_threads(num_threads)
    return torch.get_num_threads()


MALLOC_MMAP_THRESHOLD = 32 << 20
"""Blocks below this come from the heap, not a fresh mmap (glibc's largest allowed value)."""
MALLOC_TRIM_THRESHOLD = 256 << 20
"""Free heap kept for reuse before glibc hands memory back to the OS."""


def configure_cpu_malloc() -> bool:
    """Fix glibc's mmap and trim thresholds; returns whether they were set.

    glibc serves a block above its mmap threshold (128 KiB at first, raised as large
    blocks are freed) with a fresh mmap, whose pages fault in on first touch and go
    back to the OS on free.  Each decode step allocates several such tensors (the
    logits of a batch of 32 are 6 MiB): in a process whose threshold had stayed low,
    e.g. one that started from a warm compile cache, the LM head and sampler took
    ~6 ms more per step.  Fixed thresholds make every process behave alike.  Nothing
    is changed off glibc, or when ``MALLOC_MMAP_THRESHOLD_`` or
    ``MALLOC_TRIM_THRESHOLD_`` is set (the user's tuning wins).
    """
    if envs.malloc_tuned_by_user():
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameter numbers (malloc.h)
    return bool(
        libc.mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD)
        and libc.mallopt(m_trim_threshold, MALLOC_TRIM_THRESHOLD)
    )


def trim_cpu_heap() -> int:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim``); returns
    the bytes the resident set fell by (0 off glibc).

    Loading a GGUF file converts its tensors through float temporaries, and the
    fixed trim threshold (`configure_cpu_malloc`) lets up to 256 MiB of that freed
    heap stay resident for good: Gemma 3 270M's process held ~250 MiB more than its
    live tensors after start-up.  Called once, when loading and warm-up are done;
    the steps' own working set then grows back and stays (the point of the
    threshold)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return 0
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return 0
    before = psutil.Process().memory_info().rss
    libc.malloc_trim(0)
    return max(0, before - psutil.Process().memory_info().rss)


class Worker:
    """Runs the model (or this rank's part of it) on one device for the engine.

    With more than one rank (``distributed_init_method`` given) the worker joins
    torch.distributed and the tensor-/pipeline-parallel groups before it builds the
    model, so the layers see their shard sizes.
    """

    def __init__(
        self,
        vllm_config: VllmConfig,
        rank: int = 0,
        local_rank: int = 0,
        distributed_init_method: str | None = None,
        cpu_threads: int | None = None,
    ) -> None:
        """``cpu_threads``: torch threads on CPU (None: the whole process's share,
        `cpu_threads_per_rank` of one rank)."""
        self.vllm_config = vllm_config
        self.rank = rank
        device_type = vllm_config.device_config.device_type
        self.device = torch.device(device_type)
        parallel = vllm_config.parallel_config
        # Under the "mp" and "ray" executors (an init method given) even one rank joins
        # a process group, so the nccl/gloo path is the same at every size.
        if distributed_init_method is not None:
            self.device = local_device(device_type, local_rank)
            init_distributed_environment(
                parallel.world_size, rank, distributed_init_method, default_backend(device_type)
            )
            initialize_model_parallel(
                parallel.tensor_parallel_size, parallel.pipeline_parallel_size
            )
        if self.device.type == "cpu":
            threads = configure_cpu_threads(cpu_threads or cpu_threads_per_rank(1))
            malloc = "fixed" if configure_cpu_malloc() else "left as they are"
            logger.info("CPU worker: %d torch threads; malloc thresholds %s", threads, malloc)
        seed = vllm_config.model_config.seed
        if seed is not None:
            # Unseeded random sampling draws from the global generator: seeding it
            # makes a whole engine run reproducible, as vLLM's --seed does.
            torch.manual_seed(seed)
        self.model_runner = ModelRunner(vllm_config, self.device)
        self.num_blocks = 0

    def load_model(self) -> None:
        self.model_runner.load_model()

    def determine_num_kv_blocks(self) -> tuple[int, str]:
        """Number of KV blocks, and a phrase saying where the number came from."""
        cache = self.vllm_config.cache_config
        per_block = self.model_runner.kv_cache_bytes_per_block()
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override, "num_gpu_blocks_override"
        if cache.kv_cache_memory_bytes is not None:
            return cache.kv_cache_memory_bytes // per_block, "kv_cache_memory_bytes"
        if self.device.type == "cpu":
            if cache.cpu_kvcache_space_bytes is not None:
                return cache.cpu_kvcache_space_bytes // per_block, "cpu_kvcache_space_bytes"
            return self._default_cpu_blocks(per_block)
        return self._cuda_blocks(per_block)

    def _default_cpu_blocks(self, per_block: int) -> tuple[int, str]:
        sched = self.vllm_config.scheduler_config
        max_len = self.vllm_config.model_config.max_model_len
        block_size = self.vllm_config.cache_config.block_size
        # Enough for every sequence at full length, but no more than the default
        # space and a quarter of the memory that is free now.
        groups = self.model_runner.kv_groups
        per_request = (
            max_blocks_per_request(groups, max_len, block_size, sched.max_num_batched_tokens)
            if groups is not None
            else cdiv(max_len, block_size)
        )
        needed = sched.max_num_seqs * per_request + 1
        budget = min(DEFAULT_CPU_KV_CACHE_BYTES, psutil.virtual_memory().available // 4)
        # The ranks of one machine share its memory (every rank of every local
        # data-parallel replica): the default is for all of them.
        parallel = self.vllm_config.parallel_config
        local_replicas = parallel.data_parallel_size_local if parallel.internal_data_parallel else 1
        budget //= parallel.world_size * local_replicas
        return max(1, min(needed, budget // per_block)), "CPU default"

    def _cuda_blocks(self, per_block: int) -> tuple[int, str]:
        util = self.vllm_config.cache_config.gpu_memory_utilization
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free
        # Leave room for activations of the largest batch: a rough 10% of what is used.
        available = int(total * util) - used - used // 10
        if available <= per_block:
            raise ValueError(
                f"no GPU memory left for the KV cache (total {total / GiB:.1f} GiB, "
                f"used {used / GiB:.1f} GiB at gpu_memory_utilization={util}); "
                "raise --gpu-memory-utilization or set --kv-cache-memory-bytes"
            )
        return available // per_block, f"gpu_memory_utilization={util}"

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.model_runner.initialize_kv_cache(num_blocks)
        self.num_blocks = num_blocks
        if self.device.type == "cpu":
            # Only now: the blocks freed while the weights were converted are not kept.
            limit = envs.cpu_block_cache_bytes()
            if lowbit_cpu.install_block_cache(limit):
                logger.info(
                    "CPU worker: freed blocks of 16 MiB and up reused (%d MiB)", limit >> 20
                )
            trimmed = trim_cpu_heap()
            logger.info("CPU worker: %d MiB of load-time heap handed back", trimmed >> 20)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)
