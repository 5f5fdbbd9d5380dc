"""The ranks of a node above 0 in a multi-node "mp" run (see `multinode`): started
here, each connects to node 0 and serves the engine's calls over that connection."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from multiprocessing.connection import Client
from typing import TYPE_CHECKING, Any

from minivllm import envs
from minivllm.executor.multinode import CONNECT_TIMEOUT_S, call_address, node_ranks
from minivllm.executor.multiproc import main_module_hidden, serve_calls
from minivllm.executor.rank_worker import RankWorker
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


def _remote_rank_main(address: tuple[str, int], authkey: bytes, args: tuple[Any, ...]) -> None:
    """A rank of a node above 0: connect to node 0, then serve the executor's calls."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            conn = Client(address, authkey=authkey)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    conn.send((args[1], os.getpid()))
    serve_calls(conn, os.getppid(), args, RankWorker)


def run_node(vllm_config: VllmConfig, threads: int) -> int:
    """Node ``node_rank`` > 0: start this node's ranks and wait until they end
    (when node 0's engine shuts down or goes away); 0 when all ended cleanly."""
    parallel = vllm_config.parallel_config
    ctx = mp.get_context("spawn")
    procs = []
    first = node_ranks(parallel).start
    for rank in node_ranks(parallel):
        args = (vllm_config, rank, rank - first, threads)
        proc = ctx.Process(
            target=_remote_rank_main,
            args=(call_address(parallel), envs.node_authkey(), args),
            name=f"minivllm-worker-{rank}",
        )
        with main_module_hidden():
            proc.start()
        procs.append(proc)
    logger.info(
        "node %d of %d: ranks %s started; they take their calls from %s:%d",
        parallel.node_rank,
        parallel.nnodes,
        list(node_ranks(parallel)),
        *call_address(parallel),
    )
    for proc in procs:
        proc.join()
    return 0 if all(p.exitcode == 0 for p in procs) else 1


__all__ = ["run_node"]
