"""Engine statistics that the scheduler fills and the engine and server read.

Torch-free and free of imports from the rest of minivllm, so the scheduler (which
produces them), the engine loop and the Prometheus endpoint (which consume them) all
import it without depending on each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerStats:
    """A snapshot for metrics; the prefix-cache and preemption counts are cumulative."""

    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float
    """Fraction of KV blocks held by requests."""
    prefix_cache_requests: int
    prefix_cache_queries: int
    """Tokens looked up in the prefix cache."""
    prefix_cache_hits: int
    """Tokens found in the prefix cache."""
    num_preemptions: int


__all__ = ["SchedulerStats"]
