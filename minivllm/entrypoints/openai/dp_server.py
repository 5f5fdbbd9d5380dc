"""The server's engine for a configuration: one `AsyncLLM`, or a `DPAsyncLLM` with
``data_parallel_size`` replicas behind it (each with its own stat loggers, labelled
``engine="<rank>"``, in the one /metrics registry).

With ``--node-rank K`` (K > 0) of a multi-node run the command serves no HTTP: it
runs this node's ranks for the engine on node 0 (`serve_worker_node`).

With ``--data-parallel-rank`` (external load balancing) this server is one replica:
one engine whose metrics carry its rank, pinned to its share of the machine's cores
(as `DPClient` pins its replicas) when every replica runs here.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from minivllm.engine.async_llm import AsyncLLM, StatLogger
from minivllm.engine.stat_logger import LoggingStatLogger
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.parallel import ParallelConfig
    from minivllm.config.vllm import VllmConfig
    from minivllm.entrypoints.openai.metrics import PrometheusStatLogger

logger = init_logger(__name__)


def start_async_engine(vllm_config: VllmConfig, stat_logger: PrometheusStatLogger) -> Any:
    """The engine ``vllm_config`` describes; ``stat_logger`` is engine 0's (or this
    replica's) Prometheus logger, the others are made from it."""
    parallel = vllm_config.parallel_config
    interval = vllm_config.logging_config.log_stats_interval_s

    def loggers(prometheus: StatLogger, index: int) -> list[StatLogger]:
        if vllm_config.logging_config.disable_log_stats:
            return [prometheus]
        prefix = index if parallel.data_parallel_size > 1 else None
        return [prometheus, LoggingStatLogger(interval, engine_index=prefix)]

    if parallel.internal_data_parallel:
        from minivllm.engine.dp_async_llm import DPAsyncLLM

        return DPAsyncLLM(
            vllm_config,
            lambda i: loggers(stat_logger if i == 0 else stat_logger.for_engine(i), i),
        )
    from minivllm.engine.llm_engine import LLMEngine

    rank = parallel.data_parallel_rank
    if parallel.data_parallel_external_lb:
        _pin_external_replica(parallel)
        stat_logger = stat_logger.for_engine(rank)
    return AsyncLLM(LLMEngine(vllm_config), stat_loggers=loggers(stat_logger, rank))


def _pin_external_replica(parallel: ParallelConfig) -> None:
    """Replica ``data_parallel_rank`` of several on this machine takes its share of
    the cores and threads (as an internal replica would)."""
    import os

    from minivllm.platforms.cpu import data_parallel_cpu_sets, pin_to_cpus

    if parallel.data_parallel_size_local <= 1:
        return
    cpu_sets, threads, warning = data_parallel_cpu_sets(parallel.data_parallel_size_local)
    if warning is not None:
        logger.warning("%s", warning)
    pin_to_cpus(cpu_sets[parallel.data_parallel_rank % parallel.data_parallel_size_local])
    os.environ["MINIVLLM_CPU_THREADS"] = str(threads)


def serve_worker_node(args: argparse.Namespace) -> int:
    """``--node-rank K`` (K > 0): run this node's ranks of a multi-node engine."""
    from minivllm.engine.worker_node import run_worker_node
    from minivllm.entrypoints.model_tag import engine_args_from_cli

    return run_worker_node(engine_args_from_cli(args).create_engine_config())


def data_parallel_summary(parallel: ParallelConfig) -> str:
    """The banner's line on data parallelism."""
    dp = parallel.data_parallel_size
    if dp == 1:
        return "off"
    if parallel.data_parallel_external_lb:
        return f"replica {parallel.data_parallel_rank} of {dp} (external load balancing)"
    routing = "prefix-aware" if parallel.data_parallel_prefix_aware_routing else "least loaded"
    return f"{dp} replicas ({parallel.data_parallel_backend}), {routing} routing"


__all__ = ["data_parallel_summary", "serve_worker_node", "start_async_engine"]
