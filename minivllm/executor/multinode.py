"""Multi-node runs of the "mp" executor without Ray (``--nnodes``, ``--node-rank``,
``--master-addr``, ``--master-port``), as vLLM's multiprocessing executor does them.

Node ``k`` runs ranks ``k * per_node .. (k + 1) * per_node - 1`` (``per_node =
world_size / nnodes``).  Node 0 runs the engine and its own ranks as usual, and
listens on ``master_addr:master_port + 1`` for the other nodes' ranks: each
connects there, says which rank it is, and from then on serves the executor's
calls over that TCP connection exactly as a local rank does over its pipe
(`node_launcher` starts them).  torch.distributed's rendezvous is at
``master_addr:master_port``.  A remote rank that dies closes its connection, which
fails the step in which the executor notices it.

The connections carry pickles: the nodes must trust their network (as with vLLM),
and share ``MINIVLLM_NODE_AUTHKEY`` (multiprocessing's handshake key).
"""

from __future__ import annotations

import os
import threading
from multiprocessing.connection import Connection, Listener
from typing import TYPE_CHECKING

from minivllm import envs
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.parallel import ParallelConfig

logger = init_logger(__name__)

CONNECT_TIMEOUT_S = 600.0
"""How long node 0 waits for the other nodes' ranks, and they for node 0."""


def node_ranks(parallel: ParallelConfig) -> range:
    """The global ranks this node runs."""
    per_node = parallel.ranks_per_node
    return range(parallel.node_rank * per_node, (parallel.node_rank + 1) * per_node)


def rendezvous(parallel: ParallelConfig) -> str:
    """torch.distributed's init method of a multi-node run."""
    return f"tcp://{parallel.master_addr}:{parallel.master_port}"


def call_address(parallel: ParallelConfig) -> tuple[str, int]:
    return parallel.master_addr, parallel.master_port + 1


class RemoteRank:
    """Stands in for a local rank's `Process` in the executor: a rank on another node,
    reached over ``conn`` (its ``sentinel`` is the connection's socket, readable at EOF)."""

    def __init__(self, conn: Connection, rank: int, pid: int) -> None:
        self.conn = conn
        self.rank = rank
        self.pid = pid
        # A second descriptor of the same socket: `wait` takes the connection and the
        # sentinels together, and one descriptor may not be registered twice.
        self.sentinel = os.dup(conn.fileno())
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        return not self.conn.closed

    def join(self, timeout: float | None = None) -> None:
        """Nothing to wait for here (the rank's own node reaps it)."""

    def kill(self) -> None:
        self.conn.close()
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


def accept_remote_ranks(parallel: ParallelConfig) -> dict[int, RemoteRank]:
    """Node 0: wait for every rank of the other nodes to connect; by rank."""
    local = node_ranks(parallel)
    expected = {r for r in range(parallel.world_size) if r not in local}
    found: dict[int, RemoteRank] = {}
    listener = Listener(call_address(parallel), authkey=envs.node_authkey())

    def accept_all() -> None:
        while len(found) < len(expected):
            conn = listener.accept()
            rank, pid = conn.recv()
            if rank in expected:
                found[rank] = RemoteRank(conn, rank, pid)
            else:
                conn.close()

    acceptor = threading.Thread(target=accept_all, daemon=True)
    acceptor.start()
    acceptor.join(CONNECT_TIMEOUT_S)
    listener.close()
    if len(found) < len(expected):
        missing = sorted(expected - set(found))
        raise ValueError(
            f"ranks {missing} of the other nodes did not connect to "
            f"{parallel.master_addr}:{parallel.master_port + 1} in {CONNECT_TIMEOUT_S:.0f} s; "
            "start `minivllm serve` with the same flags and --node-rank K on every node"
        )
    logger.info("multi-node: ranks %s of the other nodes connected", sorted(found))
    return found


__all__ = ["RemoteRank", "accept_remote_ranks", "call_address", "node_ranks", "rendezvous"]
