"""Which failure the mp executor reports when one rank dies and another then raises.

With tensor parallelism a killed rank makes its peers' next collective fail (a reset
connection), and that error can reach the executor before the death does.  The report
must still name the dead rank: its error is the cause, the live rank's only a symptom.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import time
from collections import deque
from typing import Any

import pytest

from minivllm.executor.multiproc import CallFailed, MultiprocExecutor, WorkerError


def _raise_at_once(conn: Any) -> None:
    conn.send(CallFailed("RuntimeError: Connection reset by peer\n"))
    time.sleep(5)


def _die_once_released(released: Any, conn: Any) -> None:
    released.wait(30)
    os._exit(3)


def _answer_none(conn: Any) -> None:
    time.sleep(5)


def _executor(*targets: Any) -> MultiprocExecutor:
    """An executor over processes running ``targets`` (rank order), without a model."""
    ctx = mp.get_context("fork")
    executor = MultiprocExecutor.__new__(MultiprocExecutor)
    executor.world_size = len(targets)
    executor._failed = None
    executor._pending = deque()
    executor.conns, executor.procs = [], []
    for target in targets:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=target, args=(child,), daemon=True)
        proc.start()
        executor.conns.append(parent)
        executor.procs.append(proc)
    return executor


def _stop(executor: MultiprocExecutor) -> None:
    for proc in executor.procs:
        proc.kill()
        proc.join()


def test_a_dead_peer_is_reported_before_the_rank_that_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Rank 1 dies just after the executor has read rank 0's error, as a killed rank's
    # peer reports the reset first: ordered by an event, not by sleeps (a sleeping
    # process on a loaded 2-core machine woke later than the executor's grace).
    released = mp.get_context("fork").Event()
    executor = _executor(_raise_at_once, functools.partial(_die_once_released, released))
    why_raised = executor._why_raised

    def read_then_release(*args: Any) -> str:
        released.set()
        return why_raised(*args)

    monkeypatch.setattr(executor, "_why_raised", read_then_release)
    try:
        with pytest.raises(WorkerError) as info:
            executor._gather("execute")
        message = str(info.value)
        assert message.startswith("worker rank 1 died (exit code 3) during 'execute'")
        assert "then worker rank 0 raised during 'execute'" in message
        assert "Connection reset by peer" in message
        assert not executor.is_healthy()
    finally:
        _stop(executor)


def test_a_rank_that_raises_alone_is_reported_as_raising() -> None:
    executor = _executor(_raise_at_once, _answer_none)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError, match=r"^worker rank 0 raised during 'execute'"):
            executor._gather("execute")
        assert time.monotonic() - start < 3  # the wait for a dying peer is short
    finally:
        _stop(executor)
