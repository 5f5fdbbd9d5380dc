"""The "ray" executor: one Ray actor per rank, placed with a placement group.

Ray is the cluster manager users already run for multi-node vLLM: ``ray start
--head`` on one machine, ``ray start --address=HEAD:6379`` on the others, then
start the engine on the head with ``RAY_ADDRESS`` set (see the README).  Without
``RAY_ADDRESS`` and without a prior ``ray.init`` in the process, a local Ray
instance is started (and stopped at shutdown); a caller's own ``ray.init`` is
used as it is.

Each rank is a `RankWorker` actor holding one bundle (one CPU, or one GPU) of a
placement group; rank 0's node hosts the torch.distributed rendezvous.  Each step
puts the `SchedulerOutput` in Ray's object store once and every actor reads it;
an actor that dies or raises fails the step with `WorkerError` and marks the
executor dead, as in the "mp" executor.  ``execute_model(..., non_block=True)``
returns at once (an actor runs one caller's calls in order), so the pipeline
stages of several in-flight steps overlap.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from minivllm import envs
from minivllm.executor.multiproc import WorkerError
from minivllm.executor.rank_worker import RankWorker, output_rank
from minivllm.executor.uniproc import set_up_ranks
from minivllm.logger import init_logger
from minivllm.platforms.cpu import cpu_threads_per_rank
from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

PLACEMENT_TIMEOUT_S = 120.0
"""How long to wait for the cluster to grant the ranks' bundles."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "distributed_executor_backend='ray' needs Ray: pip install ray "
            "(or use --distributed-executor-backend mp on one machine)"
        ) from None
    return ray


class RayExecutor:
    """Drives ``world_size`` Ray actors; chosen for ``distributed_executor_backend="ray"``."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        ray = self._ray = _import_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.vllm_config = vllm_config
        parallel = vllm_config.parallel_config
        self.world_size = parallel.world_size
        self.output_rank = output_rank(vllm_config)
        self._failed: str | None = None
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            address = envs.ray_address()
            if address:
                ray.init(address=address)
            else:  # a local instance with a logical CPU per rank (more ranks than cores is fine)
                cpus = max(os.cpu_count() or 1, self.world_size)
                ray.init(num_cpus=cpus, include_dashboard=False)
        on_gpu = vllm_config.device_config.device_type == "cuda"
        bundle = {"GPU": 1.0, "CPU": 1.0} if on_gpu else {"CPU": 1.0}
        self._pg = placement_group([dict(bundle) for _ in range(self.world_size)], "PACK")
        ready, _ = ray.wait([self._pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            self.shutdown()
            raise ValueError(
                f"the Ray cluster did not grant {self.world_size} bundles of {bundle} in "
                f"{PLACEMENT_TIMEOUT_S:.0f} s; add nodes or resources (ray status shows them), "
                "or lower --tensor-parallel-size / --pipeline-parallel-size"
            )
        threads = cpu_threads_per_rank(self.world_size)
        actor_cls = ray.remote(RankWorker)
        env = envs.ray_worker_env()
        self.workers = [
            actor_cls.options(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, rank),
                runtime_env={"env_vars": env},
            ).remote(vllm_config, rank, 0, threads)
            for rank in range(self.world_size)
        ]
        try:
            ip, port = self.wait_for([self.workers[0].node_ip_and_free_port.remote()], "address")[0]
            self.num_blocks, self.kv_group_windows = set_up_ranks(
                vllm_config, self.collective_rpc, f"tcp://{ip}:{port}"
            )
        except BaseException:
            self.shutdown()
            raise
        logger.info("ray executor: %d actors, %d CPU thread(s) each", self.world_size, threads)

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every actor (arguments put in the object store once)."""
        return self.wait_for(self._submit(method, args), method)

    def _submit(self, method: str, args: tuple[Any, ...]) -> list[Any]:
        """Start ``method`` on every actor (arguments put in the object store once)."""
        if self._failed is not None:
            raise WorkerError(self._failed)
        refs = [self._ray.put(a) for a in args]
        return [getattr(w, method).remote(*refs) for w in self.workers]

    def wait_for(self, refs: list[Any], method: str) -> list[Any]:
        """Every actor's answer to ``method`` (submitted as ``refs``), by rank; a failed
        or dead actor marks the executor dead and raises `WorkerError`."""
        if self._failed is not None:
            raise WorkerError(self._failed)
        ray = self._ray
        pending = list(refs)
        while pending:
            # One at a time: a rank stuck in a collective with a dead peer must not hide
            # the dead peer's error.
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except Exception as exc:
                rank = refs.index(done[0])
                self._failed = f"worker rank {rank} died or raised during {method!r}: {exc}"
                logger.error("%s; the engine cannot continue", self._failed)
                raise WorkerError(self._failed) from exc
        return ray.get(refs)

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | RayPendingStep:
        """Run one step on every actor: the output rank's `ModelRunnerOutput`, or with
        ``non_block`` a `RayPendingStep` whose ``result()`` waits for it."""
        step = RayPendingStep(self, self._submit("execute", (scheduler_output,)))
        return step if non_block else step.result()

    def is_healthy(self) -> bool:
        return self._failed is None

    def shutdown(self) -> None:
        """Kill the actors and free the placement group; stop Ray if this executor
        started it."""
        ray = self._ray
        for w in getattr(self, "workers", []):
            ray.kill(w)
        self.workers = []
        try:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
        except Exception:  # already gone with the cluster
            pass
        if self._started_ray and ray.is_initialized():
            ray.shutdown()
        if self._failed is None:
            self._failed = "the executor was shut down"


class RayPendingStep:
    """A step submitted to every actor; ``result()`` waits for the output rank's answer
    (and for every actor's, so that a failed one is reported)."""

    def __init__(self, executor: RayExecutor, refs: list[Any]) -> None:
        self._executor = executor
        self._refs = refs

    def result(self) -> ModelRunnerOutput:
        executor = self._executor
        out = executor.wait_for(self._refs, "execute")[executor.output_rank]
        assert out is not None
        return out


import_ray = _import_ray
"""Ray, or a ValueError that says how to install it."""

__all__ = ["RankWorker", "RayExecutor", "RayPendingStep", "import_ray"]
