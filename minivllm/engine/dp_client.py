"""`DPClient`: the front end's side of data parallelism (``data_parallel_size`` > 1).

It starts one engine replica per data-parallel rank (`EngineHost` in a spawned
process with the "mp" backend, in a Ray actor with "ray"), all at once so that
they load in parallel; validates requests once, in front (a 400 before any
replica sees a bad request: the tokenizer and a scheduler sized like the smallest
replica's KV cache); and routes each request with the `LoadBalancer`.  The server
(`DPAsyncLLM`) and `LLM` (`DPLLMEngine`) both use it.

Cores: with "mp" each replica is pinned to its own run of the usable cores and gets
its share of the torch threads (`data_parallel_cpu_sets`; more replicas than cores
is a warning and one thread each).  KV cache: each replica sizes its own; the CPU
default budget is split over the local replicas (`Worker`).
"""

from __future__ import annotations

import atexit
import copy
import threading
from typing import TYPE_CHECKING, Any

from minivllm.engine.dp_balancer import LoadBalancer
from minivllm.engine.dp_replica import (
    ProcessTransport,
    RayTransport,
    RemoteEngine,
    ReplicaDiedError,
    ReplicaPlacement,
    Transport,
)
from minivllm.engine.input_processor import InputProcessor, PromptInput, ValidatedRequest
from minivllm.logger import init_logger
from minivllm.platforms.cpu import data_parallel_cpu_sets
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.scheduler import Scheduler

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


def replica_placements(vllm_config: VllmConfig) -> list[ReplicaPlacement]:
    """Cores and threads of each replica (Ray replicas are placed by Ray: no cores)."""
    parallel = vllm_config.parallel_config
    num = parallel.data_parallel_size
    cpu_sets, threads, warning = data_parallel_cpu_sets(num)
    if warning is not None:
        logger.warning("%s", warning)
    on_ray = parallel.data_parallel_backend == "ray"
    return [ReplicaPlacement(i, None if on_ray else cpu_sets[i], threads) for i in range(num)]


class DPClient:
    """Starts the replicas of ``vllm_config`` and routes requests over them."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        parallel = vllm_config.parallel_config
        cache = vllm_config.cache_config
        assert cache.block_size is not None and vllm_config.model_config is not None
        self.vllm_config = vllm_config
        self.balancer = LoadBalancer(
            parallel.data_parallel_size,
            cache.block_size,
            prefix_aware=parallel.data_parallel_prefix_aware_routing,
            slack=parallel.data_parallel_prefix_routing_slack,
        )
        self._ray: Any = None
        self._started_ray = False
        self._lock = threading.Lock()
        self._closed = False
        placements = replica_placements(vllm_config)
        self.replicas = [
            RemoteEngine(self._transport(vllm_config, p), self.balancer) for p in placements
        ]
        atexit.register(self.shutdown)
        try:
            infos = [self._wait_ready(r) for r in self.replicas]
        except BaseException:
            self.shutdown()
            raise
        for info in infos:  # logged here: a Ray actor's own log lines may be merged
            logger.info(
                "data-parallel engine %d ready (pid %d, cores %s, %d thread(s))",
                info.index,
                info.pid,
                info.cpus if info.cpus is not None else "all",
                info.num_threads,
            )
        # Validate against the smallest replica: a request any replica could not run is
        # refused in front.
        num_blocks = min(info.num_blocks for info in infos)
        for index in self.balancer.indexes:
            index.capacity = num_blocks
        self.front_config = front = copy.deepcopy(vllm_config)
        assert front.model_config is not None
        front.model_config.max_model_len = min(info.max_model_len for info in infos)
        vllm_config.model_config.max_model_len = front.model_config.max_model_len
        front.cache_config.num_gpu_blocks = vllm_config.cache_config.num_gpu_blocks = num_blocks
        scheduler = Scheduler.from_config(front, num_blocks, infos[0].kv_group_windows)
        self.tokenizer = None
        if not front.model_config.skip_tokenizer_init:
            from minivllm.tokenizer import get_tokenizer

            model_config = front.model_config
            self.tokenizer = get_tokenizer(model_config.tokenizer or model_config.model)
        self.inputs = InputProcessor(front, self.tokenizer, scheduler)
        self.model_config: ModelConfig = front.model_config
        """The front end's model config (``max_model_len`` is the smallest replica's)."""
        logger.info(
            "data parallelism: %d replicas (%s backend), %d KV blocks each, %d thread(s) each",
            len(self.replicas),
            parallel.data_parallel_backend,
            num_blocks,
            infos[0].num_threads,
        )

    def _transport(self, vllm_config: VllmConfig, placement: ReplicaPlacement) -> Transport:
        if vllm_config.parallel_config.data_parallel_backend == "mp":
            return ProcessTransport(vllm_config, placement)
        if self._ray is None:
            self._ray, self._started_ray = start_ray(vllm_config)
        return RayTransport(vllm_config, placement, self._ray)

    @staticmethod
    def _wait_ready(replica: RemoteEngine) -> Any:
        try:
            return replica.wait_ready()
        except ReplicaDiedError as exc:
            # The last line of the replica's traceback is the reason (a config error...).
            reason = str(exc).strip().splitlines()[-1]
            raise ValueError(
                f"data-parallel engine {replica.index} failed to start: {reason}"
            ) from None

    @property
    def num_blocks(self) -> int:
        """KV blocks of each replica (the smallest, which validation uses)."""
        return self.inputs.scheduler.kv_cache_manager.block_pool.num_blocks

    def process_inputs(
        self, prompt: PromptInput, params: SamplingParams | None, priority: int = 0
    ) -> ValidatedRequest:
        """Validate a request in front (one at a time: the tokenizer is not thread-safe)."""
        with self._lock:
            return self.inputs.process(prompt, params, priority)

    def choose(self, request: ValidatedRequest, alive: list[bool]) -> int:
        """The replica that takes ``request`` (counted as routed there)."""
        return self.balancer.choose(request.prompt_token_ids, alive)

    def shutdown(self) -> None:
        """Stop every replica (in parallel); stop Ray if this client started it."""
        if self._closed:
            return
        self._closed = True
        threads = [threading.Thread(target=r.shutdown) for r in self.replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if self._started_ray and self._ray.is_initialized():
            self._ray.shutdown()


def start_ray(vllm_config: VllmConfig) -> tuple[Any, bool]:
    """Ray, joined as the "ray" executor does: a caller's ``ray.init``, ``RAY_ADDRESS``,
    or a local instance with a logical CPU per replica thread; (ray, started here)."""
    import os

    from minivllm import envs
    from minivllm.executor.ray_executor import import_ray

    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    address = envs.ray_address()
    if address:
        ray.init(address=address)
    else:
        parallel = vllm_config.parallel_config
        _, threads, _ = data_parallel_cpu_sets(parallel.data_parallel_size)
        cpus = max(os.cpu_count() or 1, threads * parallel.data_parallel_size)
        ray.init(num_cpus=cpus, include_dashboard=False)
    return ray, True


__all__ = ["DPClient", "replica_placements", "start_ray"]
