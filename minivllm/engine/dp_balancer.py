"""Which data-parallel replica gets the next request.

vLLM's rule: the replica with the least ``waiting * 4 + running``.  The counts come
from each replica's reports (every answer of a replica carries its load) plus this
front end's own bookkeeping: a request routed to a replica counts as waiting there
from the moment it is routed until the replica's answer to its ``add`` includes it,
so a burst of requests spreads out before any replica has reported.

Prefix-aware routing (``data_parallel_prefix_aware_routing``, minivllm's step
beyond vLLM): the balancer remembers, per replica, the hashes of the full prompt
blocks it routed there (as many as the replica's KV cache holds, least recently
used first out), and sends a request to the replica holding the longest run of its
leading blocks when that replica's load is within ``slack`` of the least loaded
one; otherwise, or without any hit, the least loaded replica takes it.

Torch-free and thread-safe (the event loop routes while engine threads report).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

WAITING_WEIGHT = 4
"""A waiting request counts four times a running one (vLLM's weight)."""


@dataclass
class ReplicaCounts:
    """What the balancer knows of one replica's load."""

    num_waiting: int = 0
    num_running: int = 0
    num_routed: int = 0
    """Routed here but not yet in a report of the replica."""
    num_requests: int = 0
    """Requests routed here over the replica's life (a per-engine counter)."""

    @property
    def score(self) -> int:
        return (self.num_waiting + self.num_routed) * WAITING_WEIGHT + self.num_running


class PrefixIndex:
    """The prompt-block hashes routed to one replica, least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def matched(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes`` (a request's block chain) are here, from the first."""
        count = 0
        for h in hashes:
            if h not in self._blocks:
                break
            count += 1
        return count

    def add(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a prompt (each covers every token before)."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class LoadBalancer:
    """Routes requests over ``num_replicas`` replicas (see the module docstring)."""

    def __init__(
        self,
        num_replicas: int,
        block_size: int,
        prefix_aware: bool = False,
        slack: int = 8,
        blocks_per_replica: int = 1024,
    ) -> None:
        self.counts = [ReplicaCounts() for _ in range(num_replicas)]
        self.block_size = block_size
        self.prefix_aware = prefix_aware
        self.slack = slack
        self.indexes = [PrefixIndex(blocks_per_replica) for _ in range(num_replicas)]
        self._lock = threading.Lock()

    def choose(self, prompt_token_ids: Sequence[int], alive: Sequence[bool]) -> int:
        """The replica for a new request (one of the ``alive`` ones), counted as routed."""
        hashes = block_hashes(prompt_token_ids, self.block_size) if self.prefix_aware else []
        with self._lock:
            live = [i for i, ok in enumerate(alive) if ok]
            if not live:
                raise ValueError("no live data-parallel replica")
            least = min(live, key=lambda i: (self.counts[i].score, self.counts[i].num_requests))
            chosen = least
            if hashes:
                best = max(live, key=lambda i: (self.indexes[i].matched(hashes), -i))
                hit = self.indexes[best].matched(hashes)
                if hit and self.counts[best].score <= self.counts[least].score + self.slack:
                    chosen = best
                self.indexes[chosen].add(hashes)
            self.counts[chosen].num_routed += 1
            self.counts[chosen].num_requests += 1
            return chosen

    def added(self, index: int, num_waiting: int, num_running: int) -> None:
        """Replica ``index`` took a routed request; its load is now as given."""
        with self._lock:
            counts = self.counts[index]
            counts.num_routed = max(0, counts.num_routed - 1)
            counts.num_waiting, counts.num_running = num_waiting, num_running

    def unrouted(self, index: int) -> None:
        """A routed request never reached replica ``index`` (refused, or it died)."""
        with self._lock:
            self.counts[index].num_routed = max(0, self.counts[index].num_routed - 1)

    def report(self, index: int, num_waiting: int, num_running: int) -> None:
        """Replica ``index`` reported its load (after a step or an abort)."""
        with self._lock:
            self.counts[index].num_waiting = num_waiting
            self.counts[index].num_running = num_running


__all__ = ["LoadBalancer", "PrefixIndex", "ReplicaCounts", "block_hashes"]
