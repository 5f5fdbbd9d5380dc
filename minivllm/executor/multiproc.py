"""The "mp" executor: one spawned process per rank on this machine.

Start-up: the processes are *spawned* (a fresh interpreter each; forking a
process whose torch threads have started can deadlock), each gets its share of
the CPU threads, joins torch.distributed over a free local TCP port, loads its
shard and reports how many KV blocks fit; the engine takes the minimum.

Each step is one broadcast: the `SchedulerOutput` is pickled once and written to
every rank's pipe; every rank answers on its own pipe (the output rank with the
`ModelRunnerOutput`, the others with None).  Calls may be submitted before the
answers of earlier ones are read (``execute_model(..., non_block=True)``, so the
pipeline stages overlap): each rank runs its calls and answers in order, so the
answers are gathered oldest first.  A thread in each worker reads the calls as
they arrive, so the engine never blocks writing one while a rank writes an
answer.  While it waits the executor also watches every process's sentinel, so
a rank that dies or raises fails the step at once with `WorkerError` and marks
the executor dead: the peers of a failed rank may be stuck in a collective, so
nothing can run any more.  Workers watch their parent too and exit when it is
gone.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import traceback
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from minivllm.executor.multinode import accept_remote_ranks, node_ranks, rendezvous
from minivllm.executor.rank_worker import RankWorker, output_rank
from minivllm.executor.uniproc import set_up_ranks
from minivllm.logger import init_logger
from minivllm.platforms.cpu import cpu_threads_per_rank
from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

PARENT_POLL_S = 1.0
"""How often an idle worker checks that the engine process is still there."""
_PEER_DEATH_GRACE_S = 0.5
"""How long a rank's error waits for a peer's death to show (failure path only)."""


class WorkerError(RuntimeError):
    """A worker process died or raised; the executor cannot run any more steps."""


@dataclass(frozen=True)
class CallDone:
    """A worker's answer to one call: the method's return value."""

    value: Any


@dataclass(frozen=True)
class CallFailed:
    """A worker's answer to one call that raised: the formatted traceback."""

    traceback: str


WorkerReply = CallDone | CallFailed


def free_local_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_main(
    conn: Connection, parent_pid: int, args: tuple[Any, ...], factory: Any = RankWorker
) -> None:
    """Body of a worker process: build ``factory(*args)`` (a `RankWorker`; a whole
    data-parallel engine replica for `minivllm.engine.dp_replica`), then serve calls
    until told to stop or until the parent process is gone."""
    # Ctrl-C reaches the whole process group: the engine process decides what stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    inbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    reader = threading.Thread(target=_read_calls, args=(conn, parent_pid, inbox), daemon=True)
    reader.start()
    try:
        worker = factory(*args)
    except BaseException:
        conn.send(CallFailed(traceback.format_exc()))
        return
    while True:
        data = inbox.get()
        if data is None:  # the pipe closed, or the engine process is gone
            return
        method, call_args = pickle.loads(data)
        if method == "shutdown":  # leaving the process also leaves its groups
            conn.send(CallDone(None))
            return
        reply: WorkerReply
        try:
            reply = CallDone(getattr(worker, method)(*call_args))
        except BaseException:
            reply = CallFailed(traceback.format_exc())
        conn.send(reply)


def _read_calls(conn: Connection, parent_pid: int, inbox: queue.SimpleQueue[bytes | None]) -> None:
    """Move calls from the pipe to ``inbox`` as they arrive; None once no more can come."""
    while True:
        try:
            if not conn.poll(PARENT_POLL_S):
                if os.getppid() != parent_pid:  # the engine died: nobody will call again
                    break
                continue
            inbox.put(conn.recv_bytes())
        except (EOFError, OSError):
            break
    inbox.put(None)


class PendingCall:
    """A call sent to every rank whose answers are not read yet; `result` reads them
    (and those of every earlier call first: the pipes answer in order)."""

    def __init__(self, executor: MultiprocExecutor, method: str, pick: int | None) -> None:
        self._executor = executor
        self.method = method
        self._pick = pick
        self.done = False
        self._value: Any = None
        self._error: BaseException | None = None

    def set_result(self, values: list[Any]) -> None:
        """Every rank's answer, by rank (called by the executor once it read them)."""
        self._value, self.done = values, True

    def set_error(self, error: BaseException) -> None:
        """The call failed; `result` raises ``error``."""
        self._error, self.done = error, True

    def result(self) -> Any:
        while not self.done:
            self._executor.gather_oldest()
        if self._error is not None:
            raise self._error
        return self._value if self._pick is None else self._value[self._pick]


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Spawn without re-running the caller's script in the child.

    A spawned child normally imports the parent's ``__main__`` file first, so a
    script without an ``if __name__ == "__main__":`` guard would start a second
    engine in every worker.  The workers need nothing from ``__main__`` (only the
    config is sent), so hide it while the process starts.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class MultiprocExecutor:
    """Drives ``world_size`` worker processes; chosen for ``distributed_executor_backend="mp"``."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        self.vllm_config = vllm_config
        parallel = vllm_config.parallel_config
        self.world_size = parallel.world_size
        self.output_rank = output_rank(vllm_config)
        self._failed: str | None = None
        self._pending: deque[PendingCall] = deque()
        init_method = f"tcp://127.0.0.1:{free_local_port()}"
        local_ranks = range(self.world_size)
        if parallel.node_rank > 0:
            raise ValueError(
                f"node_rank={parallel.node_rank} runs only that node's ranks, for the engine "
                "on node 0: start it with `minivllm serve ... --node-rank "
                f"{parallel.node_rank}` (the same flags as node 0)"
            )
        if parallel.nnodes > 1:  # the other nodes' ranks connect below (`multinode`)
            init_method, local_ranks = rendezvous(parallel), node_ranks(parallel)
        threads = cpu_threads_per_rank(len(local_ranks))
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for rank in local_ranks:
            parent_conn, child_conn = ctx.Pipe()
            args = (vllm_config, rank, rank, threads)
            proc = ctx.Process(
                target=_worker_main,
                args=(child_conn, os.getpid(), args),
                name=f"minivllm-worker-{rank}",
                daemon=True,
            )
            with _main_module_hidden():
                proc.start()
            child_conn.close()
            self.conns.append(parent_conn)
            self.procs.append(proc)
        if parallel.nnodes > 1:
            try:
                remote = accept_remote_ranks(parallel)
            except BaseException:
                self.shutdown()
                raise
            for rank in sorted(remote):
                self.conns.append(remote[rank].conn)
                self.procs.append(remote[rank])
        logger.info(
            "mp executor: %d worker processes (TP=%d x PP=%d), %d CPU thread(s) each",
            self.world_size,
            parallel.tensor_parallel_size,
            parallel.pipeline_parallel_size,
            threads,
        )
        try:
            self.num_blocks, self.kv_group_windows = set_up_ranks(
                vllm_config, self.collective_rpc, init_method
            )
        except BaseException:
            self.shutdown()
            raise

    @property
    def worker_pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def collective_rpc(self, method: str, *args: Any) -> list[Any]:
        """Call ``method`` on every rank (one pickled message); their results by rank."""
        return self._submit(method, args).result()

    def _submit(self, method: str, args: tuple[Any, ...], pick: int | None = None) -> PendingCall:
        if self._failed is not None:
            raise WorkerError(self._failed)
        data = pickle.dumps((method, args), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            for conn in self.conns:
                conn.send_bytes(data)
        except OSError as exc:
            raise self._fail(f"a worker's pipe broke while sending {method!r}: {exc}") from exc
        call = PendingCall(self, method, pick)
        self._pending.append(call)
        return call

    @property
    def num_pending(self) -> int:
        """Calls sent whose answers have not been read yet."""
        return len(self._pending)

    def gather_oldest(self) -> None:
        """Read every rank's answer to the oldest pending call into it (answers come in
        call order).  On failure that call and every later one get the error."""
        call = self._pending.popleft()
        try:
            if self._failed is not None:
                raise WorkerError(self._failed)
            call.set_result(self._gather(call.method))
        except BaseException as exc:  # result() raises it
            call.set_error(exc)
            if self._failed is None:  # part of the answers may be unread: the pipes are out of step
                self._failed = f"reading the answers to {call.method!r} failed: {exc!r}"
            # Nothing later can be answered either.
            while self._pending:
                self._pending.popleft().set_error(WorkerError(self._failed))

    def _gather(self, method: str) -> list[Any]:
        results: dict[int, Any] = {}
        by_conn = {id(c): r for r, c in enumerate(self.conns)}
        by_sentinel = {p.sentinel: r for r, p in enumerate(self.procs)}
        while len(results) < self.world_size:
            pending = [c for r, c in enumerate(self.conns) if r not in results]
            sentinels = [s for s, r in by_sentinel.items() if r not in results]
            for obj in wait(pending + sentinels):
                if isinstance(obj, int):  # a process ended
                    rank = by_sentinel[obj]
                    if rank in results or self.conns[rank].poll():
                        continue  # its answer is there; read it first
                    code = self._exit_code(rank)
                    raise self._fail(
                        f"worker rank {rank} died (exit code {code}) during {method!r}"
                    )
                rank = by_conn[id(obj)]
                try:
                    reply: WorkerReply = obj.recv()
                except (EOFError, OSError) as exc:
                    code = self._exit_code(rank)
                    why = f"worker rank {rank} died (exit code {code}) during {method!r}"
                    raise self._fail(why) from exc
                if isinstance(reply, CallFailed):
                    raise self._fail(self._why_raised(rank, method, reply.traceback))
                results[rank] = reply.value
        return [results[r] for r in range(self.world_size)]

    def _why_raised(self, rank: int, method: str, traceback: str) -> str:
        """What to report when ``rank`` raised: a peer that died is the root cause (a
        collective with a dead rank fails on the live ones, often before the death is
        noticed), so name the dead rank first and keep the live rank's error after it."""
        others = [p.sentinel for r, p in enumerate(self.procs) if r != rank]
        ready = set(wait(others, timeout=_PEER_DEATH_GRACE_S))  # sockets close as it dies
        dead = [
            r
            for r, p in enumerate(self.procs)
            if r != rank and (p.sentinel in ready or p.exitcode is not None)
        ]
        raised = f"worker rank {rank} raised during {method!r}:\n{traceback}"
        if not dead:
            return raised
        died = "; ".join(
            f"worker rank {r} died (exit code {self._exit_code(r)}) during {method!r}" for r in dead
        )
        return f"{died}; then {raised}"

    def _exit_code(self, rank: int) -> int | None:
        """A dead rank's exit code.  Its sentinel is ready once its files are closed,
        a moment before the kernel lets it be reaped (a loaded machine widened that
        moment past the grace: the death went unreported), so wait for that briefly."""
        proc = self.procs[rank]
        proc.join(_PEER_DEATH_GRACE_S)
        return proc.exitcode

    def _fail(self, why: str) -> WorkerError:
        """Mark the executor dead; the error for the caller to raise."""
        self._failed = why
        logger.error("%s; the engine cannot continue", why)
        return WorkerError(why)

    def execute_model(
        self, scheduler_output: SchedulerOutput, non_block: bool = False
    ) -> ModelRunnerOutput | PendingCall:
        """Run one step on every rank: the output rank's `ModelRunnerOutput`, or with
        ``non_block`` a `PendingCall` whose ``result()`` waits for it."""
        call = self._submit("execute", (scheduler_output,), pick=self.output_rank)
        return call if non_block else call.result()

    def is_healthy(self) -> bool:
        """False once a worker died or raised."""
        if self._failed is None and not all(p.is_alive() for p in self.procs):
            dead = [r for r, p in enumerate(self.procs) if not p.is_alive()]
            self._failed = f"worker rank(s) {dead} exited"
        return self._failed is None

    def shutdown(self) -> None:
        """Ask the workers to stop, then end any that do not within a few seconds."""
        if self._failed is None and all(p.is_alive() for p in self.procs):
            data = pickle.dumps(("shutdown", ()))
            for conn in self.conns:
                try:
                    conn.send_bytes(data)
                except OSError:
                    pass
        # After a failure the survivors may be blocked in a collective: end them now.
        deadline = time.monotonic() + (5.0 if self._failed is None else 0.0)
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5.0)
        for conn in self.conns:
            conn.close()
        if self._failed is None:
            self._failed = "the executor was shut down"


serve_calls = _worker_main
"""The public name of a spawned process's call loop (`_worker_main`)."""
main_module_hidden = _main_module_hidden
"""The public name of `_main_module_hidden`."""

__all__ = [
    "CallDone",
    "CallFailed",
    "MultiprocExecutor",
    "RankWorker",
    "WorkerError",
    "main_module_hidden",
    "serve_calls",
]
