"""Waiting queues for the two scheduling policies: fcfs and priority."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterator

from minivllm.scheduler.request import Request

SCHEDULING_POLICIES = ("fcfs", "priority")


class RequestQueue:
    """Waiting requests in the order the scheduler should admit them."""

    def add(self, request: Request) -> None:
        """Queue a new request."""
        raise NotImplementedError

    def add_preempted(self, request: Request) -> None:
        """Queue a preempted request so it is among the first to come back."""
        raise NotImplementedError

    def peek(self) -> Request:
        raise NotImplementedError

    def pop(self) -> Request:
        raise NotImplementedError

    def remove(self, request: Request) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Request]:
        """Requests in admission order."""
        raise NotImplementedError


class FcfsQueue(RequestQueue):
    """Arrival order; preempted requests go back to the very front."""

    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        self._queue.append(request)

    def add_preempted(self, request: Request) -> None:
        self._queue.appendleft(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


class PriorityQueue(RequestQueue):
    """Ordered by (priority, arrival_time): lower priority values run first.

    A preempted request keeps its key, so it returns ahead of every later or
    less urgent arrival, which is "the front" for this policy.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        # Breaks ties between equal keys in insertion order (and avoids comparing Requests).
        self._counter = itertools.count()

    def add(self, request: Request) -> None:
        heapq.heappush(
            self._heap, (request.priority, request.arrival_time, next(self._counter), request)
        )

    def add_preempted(self, request: Request) -> None:
        self.add(request)

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        self._heap = [entry for entry in self._heap if entry[3] is not request]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in sorted(self._heap, key=lambda e: e[:3]))


def make_request_queue(policy: str) -> RequestQueue:
    if policy == "fcfs":
        return FcfsQueue()
    if policy == "priority":
        return PriorityQueue()
    raise ValueError(
        f"Unknown scheduling policy {policy!r}; choose one of {', '.join(SCHEDULING_POLICIES)}."
    )
