"""Grammar calls with a deadline, and matchers that count the time their request spent.

A token mask costs what the grammar makes it cost: a nested bounded repetition such as
``(.{0,50}){0,50}`` takes seconds per mask after a few tokens.  Neither library can
cancel a call, but both release the GIL while they compute a mask (xgrammar, measured:
a Python thread keeps ~2/3 of its solo speed beside a 5 s mask; llguidance documents
it for its mask calls), so a call
runs on a daemon thread and the caller waits only until its deadline.  A call that
overruns is abandoned: its thread finishes it, unseen, then exits, and a fresh thread
takes its place.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from minivllm.structured_output.spec import GrammarMatcher

_QUEUED, _RUNNING, _DONE, _DROPPED, _ABANDONED = range(5)


class CallResult:
    """How one call went: its value or exception, its time, or that it overran."""

    __slots__ = ("value", "error", "seconds", "timed_out")

    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.timed_out = False


class _Job:
    __slots__ = ("fn", "result", "state", "finished")

    def __init__(self, fn: Callable[[], Any], finished: threading.Semaphore) -> None:
        self.fn = fn
        self.result = CallResult()
        self.state = _QUEUED
        self.finished = finished


class GrammarExecutor:
    """Daemon worker threads that run a step's grammar calls, each waited for at most
    ``timeout_s`` (calls not yet started at the deadline get a fresh one)."""

    def __init__(self, num_threads: int = 2) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.num_abandoned = 0
        """Calls given up on so far."""
        for _ in range(num_threads):
            self._spawn()

    def _spawn(self) -> None:
        threading.Thread(target=self._work, name="minivllm-grammar", daemon=True).start()

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            with self._lock:
                if job.state != _QUEUED:
                    continue  # its caller gave up before it started
                job.state = _RUNNING
            start = time.perf_counter()
            try:
                job.result.value = job.fn()
            except BaseException as exc:  # handed to the caller
                job.result.error = exc
            job.result.seconds = time.perf_counter() - start
            with self._lock:
                abandoned = job.state == _ABANDONED
                if not abandoned:
                    job.state = _DONE
            job.finished.release()
            if abandoned:
                return  # a replacement thread was started when the caller gave up

    def run(self, fns: list[Callable[[], Any]], timeout_s: float) -> list[CallResult]:
        """Run ``fns`` on the workers; a result has ``timed_out`` set for a call still
        running ``timeout_s`` after it could start."""
        results: list[CallResult] = [CallResult() for _ in fns]
        pending = list(enumerate(fns))
        while pending:
            finished = threading.Semaphore(0)
            jobs = [(i, _Job(fn, finished)) for i, fn in pending]
            for _, job in jobs:
                self._queue.put(job)
            deadline = time.perf_counter() + timeout_s
            for _ in jobs:
                left = deadline - time.perf_counter()
                if left <= 0 or not finished.acquire(timeout=left):
                    break
            pending = []
            with self._lock:
                for i, job in jobs:
                    if job.state == _DONE:
                        results[i] = job.result
                    elif job.state == _RUNNING:
                        job.state = _ABANDONED
                        results[i].timed_out = True
                        results[i].seconds = timeout_s
                        self.num_abandoned += 1
                        self._spawn()
                    else:  # still queued behind an overrunning call: try again
                        job.state = _DROPPED
                        pending.append((i, job.fn))
        return results


def run_with_deadline(fn: Callable[[], Any], timeout_s: float) -> CallResult:
    """``fn()`` on a thread of its own, waited for at most ``timeout_s``."""
    result = CallResult()
    done = threading.Event()

    def call() -> None:
        start = time.perf_counter()
        try:
            result.value = fn()
        except BaseException as exc:  # handed to the caller
            result.error = exc
        result.seconds = time.perf_counter() - start
        done.set()

    threading.Thread(target=call, name="minivllm-grammar-probe", daemon=True).start()
    if not done.wait(timeout_s):
        result.timed_out = True
        result.seconds = timeout_s
    return result


class TimedMatcher:
    """A request's matcher, with the time its grammar calls took so far and, once a
    limit is broken, why the request must end (the matcher is not used again)."""

    def __init__(self, inner: GrammarMatcher) -> None:
        self.inner = inner
        self.spent_s = 0.0
        self.error: str | None = None

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.inner.fill_bitmask(bitmask, row)

    def accept_token(self, token_id: int) -> bool:
        return self.inner.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self.inner.is_terminated()
