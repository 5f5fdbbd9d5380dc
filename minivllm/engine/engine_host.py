"""`EngineHost`: one data-parallel replica, a whole `LLMEngine` in its own process.

The data-parallel front end (`minivllm.engine.dp_client`) starts one host per
replica, as a spawned process ("mp") or a Ray actor ("ray"), and calls its methods
one at a time: `info` once, then `add`, `abort` and `step` as its engine thread
needs them.  Every answer carries the replica's `ReplicaLoad` (its waiting and
running counts, its statistics), which is how the front end's load balancer stays
current.  Before the engine is built the host pins itself to its share of the
cores and sets its share of the torch threads, so an executor inside the replica
(TP/PP ranks) splits that share further.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from minivllm.engine.llm_engine import LLMEngine
from minivllm.outputs import RequestOutput
from minivllm.platforms.cpu import pin_to_cpus
from minivllm.sampling_params import SamplingParams
from minivllm.stats import SchedulerStats

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


@dataclass(frozen=True)
class ReplicaLoad:
    """A replica's state after a call: what the load balancer and the engine thread read."""

    num_waiting: int
    num_running: int
    has_unfinished: bool
    """Requests waiting or running (the engine thread keeps stepping while True)."""
    started_ids: frozenset[str]
    """Unfinished requests that have had tokens computed (their queue time is over)."""
    stats: SchedulerStats
    healthy: bool
    """The replica's executor still runs (False once one of its ranks died)."""


@dataclass(frozen=True)
class ReplicaReport:
    """A replica's outputs of one call (a step or an abort), with its load after it."""

    outputs: list[RequestOutput]
    load: ReplicaLoad


@dataclass(frozen=True)
class AddResult:
    """The answer to `EngineHost.add`: the load, or why the request was refused."""

    load: ReplicaLoad
    error: str | None = None


@dataclass(frozen=True)
class ReplicaInfo:
    """What a replica tells the front end once it has started."""

    index: int
    pid: int
    num_blocks: int
    kv_group_windows: tuple[int | None, ...]
    max_model_len: int
    """After KV cache sizing (a default max_model_len may be lowered to what fits)."""
    num_threads: int
    cpus: list[int] | None


class EngineHost:
    """Holds replica ``index``'s engine between the front end's calls."""

    def __init__(
        self, vllm_config: VllmConfig, index: int, cpus: list[int] | None, threads: int
    ) -> None:
        pin_to_cpus(cpus)
        os.environ["MINIVLLM_CPU_THREADS"] = str(threads)
        config = copy.deepcopy(vllm_config)
        config.parallel_config.data_parallel_rank = index
        config.parallel_config.data_parallel_index = index
        self.index = index
        self.cpus = cpus
        self.threads = threads
        self.engine = LLMEngine(config)

    def info(self) -> ReplicaInfo:
        config = self.engine.vllm_config
        assert config.model_config is not None
        return ReplicaInfo(
            self.index,
            os.getpid(),
            self.engine.scheduler.kv_cache_manager.block_pool.num_blocks,
            tuple(self.engine.executor.kv_group_windows),
            config.model_config.max_model_len,
            self.threads,
            self.cpus,
        )

    def load(self) -> ReplicaLoad:
        stats = self.engine.get_stats()
        requests = self.engine.scheduler.requests
        return ReplicaLoad(
            stats.num_waiting_reqs,
            stats.num_running_reqs,
            self.engine.has_unfinished_requests(),
            frozenset(r for r, req in requests.items() if req.num_computed_tokens > 0),
            stats,
            self.engine.is_healthy(),
        )

    def add(
        self, request_id: str, prompt: dict[str, Any], params: SamplingParams, priority: int
    ) -> AddResult:
        """Queue a request the front end validated (validated again here: the grammar
        of a structured-output request is compiled by the replica that runs it)."""
        try:
            self.engine.add_request(request_id, prompt, params, priority=priority)
        except ValueError as exc:
            return AddResult(self.load(), str(exc))
        return AddResult(self.load())

    def abort(self, request_ids: list[str]) -> ReplicaReport:
        outputs = self.engine.abort_request(request_ids)
        return ReplicaReport(outputs, self.load())

    def step(self) -> ReplicaReport:
        outputs = self.engine.step() if self.engine.has_unfinished_requests() else []
        return ReplicaReport(outputs, self.load())

    def close(self) -> None:
        """Stop the replica's executor (its rank processes or actors)."""
        self.engine.shutdown()


__all__ = ["AddResult", "EngineHost", "ReplicaInfo", "ReplicaLoad", "ReplicaReport"]
