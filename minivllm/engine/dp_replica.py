"""The front end's handle on one data-parallel replica (an `EngineHost` elsewhere).

`RemoteEngine` offers the part of `LLMEngine` that `AsyncLLM`'s engine thread and
`DPLLMEngine` use (add, abort, step, has_unfinished_requests, has_started,
get_stats, is_healthy, shutdown), so each replica runs under an ordinary
`AsyncLLM` in the server: the abort path, the request timings and the metrics are
the one-engine code.  Calls go through a transport: `ProcessTransport` (a spawned
process and a pipe, the "mp" data-parallel backend) or `RayTransport` (an actor).
One call is in flight per replica at a time; a replica that dies fails that call
with `ReplicaDiedError` and stays dead.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TYPE_CHECKING, Any

from minivllm import envs
from minivllm.engine.dp_balancer import LoadBalancer
from minivllm.engine.engine_host import EngineHost, ReplicaInfo, ReplicaLoad
from minivllm.engine.input_processor import ValidatedRequest
from minivllm.executor.multiproc import CallFailed, main_module_hidden, serve_calls
from minivllm.logger import init_logger
from minivllm.outputs import RequestOutput
from minivllm.stats import SchedulerStats

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

SHUTDOWN_WAIT_S = 10.0
"""How long a replica may take to stop before it is killed."""


class ReplicaDiedError(RuntimeError):
    """A data-parallel replica's process (or actor) died or failed a call."""


@dataclass(frozen=True)
class ReplicaPlacement:
    """Where replica ``index`` runs: its cores (None: anywhere) and torch threads."""

    index: int
    cpus: list[int] | None
    threads: int


class ProcessTransport:
    """A replica in a spawned process (not daemonic, so that its own executor may
    spawn rank processes); it exits when this process is gone."""

    def __init__(self, vllm_config: VllmConfig, placement: ReplicaPlacement) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        args = (vllm_config, placement.index, placement.cpus, placement.threads)
        self.proc = ctx.Process(
            target=serve_calls,
            args=(child_conn, os.getpid(), args, EngineHost),
            name=f"minivllm-dp-engine-{placement.index}",
        )
        with main_module_hidden():
            self.proc.start()
        child_conn.close()
        self.index = placement.index
        self._failed: str | None = None

    def submit(self, method: str, *args: Any) -> None:
        if self._failed is not None:
            raise ReplicaDiedError(self._failed)
        try:
            self.conn.send_bytes(pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL))
        except OSError as exc:
            raise self._fail(f"its pipe broke ({exc})") from exc

    def result(self, method: str) -> Any:
        """The answer to the call submitted last (waits; watches the process)."""
        if self._failed is not None:
            raise ReplicaDiedError(self._failed)
        ready = wait([self.conn, self.proc.sentinel])
        if self.conn not in ready and not self.conn.poll():
            raise self._fail(self._exited(method))
        try:
            reply = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise self._fail(self._exited(method)) from exc
        if isinstance(reply, CallFailed):
            raise self._fail(f"it raised during {method!r}:\n{reply.traceback}")
        return reply.value

    def _exited(self, method: str) -> str:
        self.proc.join(timeout=1.0)  # reap it, for its exit code
        return f"its process died (exit code {self.proc.exitcode}) during {method!r}"

    def _fail(self, why: str) -> ReplicaDiedError:
        self._failed = f"data-parallel engine {self.index} (pid {self.proc.pid}) failed: {why}"
        logger.error("%s", self._failed)
        return ReplicaDiedError(self._failed)

    def is_alive(self) -> bool:
        return self._failed is None and self.proc.is_alive()

    def shutdown(self) -> None:
        if self.is_alive():
            try:
                self.submit("close")
                self.result("close")
                self.submit("shutdown")
            except ReplicaDiedError:
                pass
        self.proc.join(timeout=SHUTDOWN_WAIT_S if self.proc.is_alive() else 0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5.0)
        self.conn.close()
        self._failed = self._failed or "the replica was shut down"


class RayTransport:
    """A replica as a Ray actor (the "ray" data-parallel backend), holding ``threads``
    logical CPUs of the cluster."""

    def __init__(self, vllm_config: VllmConfig, placement: ReplicaPlacement, ray: Any) -> None:
        self._ray = ray
        self.index = placement.index
        actor_cls = ray.remote(EngineHost)
        on_gpu = vllm_config.device_config.device_type == "cuda"
        self.actor = actor_cls.options(
            num_cpus=placement.threads,
            num_gpus=vllm_config.parallel_config.world_size if on_gpu else 0,
            runtime_env={"env_vars": envs.ray_worker_env()},
            name=None,
        ).remote(vllm_config, placement.index, placement.cpus, placement.threads)
        self._ref: Any = None
        self._failed: str | None = None

    def submit(self, method: str, *args: Any) -> None:
        if self._failed is not None:
            raise ReplicaDiedError(self._failed)
        self._ref = getattr(self.actor, method).remote(*args)

    def result(self, method: str) -> Any:
        if self._failed is not None:
            raise ReplicaDiedError(self._failed)
        try:
            return self._ray.get(self._ref)
        except Exception as exc:
            self._failed = f"data-parallel engine {self.index} (Ray actor) failed: {exc}"
            logger.error("%s", self._failed)
            raise ReplicaDiedError(self._failed) from exc

    def is_alive(self) -> bool:
        return self._failed is None

    def shutdown(self) -> None:
        if self._failed is None:
            try:
                self.submit("close")
                self.result("close")
            except ReplicaDiedError:
                pass
        self._ray.kill(self.actor)
        self._failed = self._failed or "the replica was shut down"


Transport = ProcessTransport | RayTransport


class RemoteEngine:
    """One replica, seen through the `LLMEngine` methods its engine thread calls.

    Every load the replica reports goes to ``balancer``."""

    def __init__(self, transport: Transport, balancer: LoadBalancer) -> None:
        self.transport = transport
        self.index = transport.index
        self._balancer = balancer
        self._load = ReplicaLoad(
            0, 0, False, frozenset(), SchedulerStats(0, 0, 0.0, 0, 0, 0, 0), True
        )
        self.info: ReplicaInfo | None = None

    def call(self, method: str, *args: Any) -> Any:
        self.transport.submit(method, *args)
        return self.transport.result(method)

    def wait_ready(self) -> ReplicaInfo:
        self.info = self.call("info")
        assert self.info is not None
        return self.info

    def _took(self, load: ReplicaLoad, added: bool = False) -> None:
        self._load = load
        if added:
            self._balancer.added(self.index, load.num_waiting, load.num_running)
        else:
            self._balancer.report(self.index, load.num_waiting, load.num_running)

    # -- the LLMEngine surface ----------------------------------------------
    def add_request(self, request_id: str, prompt: ValidatedRequest) -> str:
        raw = {"prompt": prompt.prompt, "prompt_token_ids": prompt.prompt_token_ids}
        result = self.call("add", request_id, raw, prompt.params, prompt.priority)
        self._took(result.load, added=True)
        if result.error is not None:
            raise ValueError(result.error)
        return request_id

    def abort_request(self, request_ids: list[str]) -> list[RequestOutput]:
        report = self.call("abort", list(request_ids))
        self._took(report.load)
        return list(report.outputs)

    def submit_step(self) -> None:
        """Start a step; `finish_step` returns its outputs (replicas step in parallel)."""
        self.transport.submit("step")

    def finish_step(self) -> list[RequestOutput]:
        report = self.transport.result("step")
        self._took(report.load)
        return list(report.outputs)

    def step(self) -> list[RequestOutput]:
        self.submit_step()
        return self.finish_step()

    def has_unfinished_requests(self) -> bool:
        return self._load.has_unfinished

    def has_started(self, request_id: str) -> bool:
        started = self._load.started_ids
        return request_id in started or f"0_{request_id}" in started

    def get_stats(self) -> SchedulerStats:
        return self._load.stats

    def is_healthy(self) -> bool:
        return self.transport.is_alive() and self._load.healthy

    def shutdown(self) -> None:
        self.transport.shutdown()


__all__ = [
    "ProcessTransport",
    "RayTransport",
    "RemoteEngine",
    "ReplicaDiedError",
    "ReplicaPlacement",
]
