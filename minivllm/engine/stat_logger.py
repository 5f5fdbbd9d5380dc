"""The periodic statistics line (vLLM's ``LoggingStatLogger``), every
``log_stats_interval_s`` seconds while the engine works.

Throughputs are averages over the interval; with speculative decoding a second line
gives the interval's acceptance: mean acceptance length, accepted and drafted tokens,
the acceptance rate per draft position and overall.
"""

from __future__ import annotations

import time

from minivllm.logger import init_logger
from minivllm.stats import IterationStats, SchedulerStats, SpecDecodingStats

logger = init_logger(__name__)


class LoggingStatLogger:
    """Accumulates step statistics and logs them once per interval."""

    def __init__(self, interval_s: float = 10.0, engine_index: int | None = None) -> None:
        self.interval_s = interval_s
        self.prefix = "" if engine_index is None else f"Engine {engine_index:03d}: "
        """``Engine 001: `` before each line of a data-parallel replica (vLLM's form)."""
        self._last_log = time.monotonic()
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._last_spec: SpecDecodingStats | None = None
        self._last_prefix = (0, 0)
        self.last_lines: list[str] = []
        """The lines logged last (for tests and the curious)."""

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats) -> None:
        self._prompt_tokens += iteration_stats.num_prompt_tokens
        self._generation_tokens += iteration_stats.num_generation_tokens
        now = time.monotonic()
        if now - self._last_log >= self.interval_s:
            self.log(scheduler_stats, now)

    def log(self, s: SchedulerStats, now: float | None = None) -> None:
        """Log the interval since the last line, and start a new one."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self._last_log, 1e-9)
        queries = s.prefix_cache_queries - self._last_prefix[0]
        hits = s.prefix_cache_hits - self._last_prefix[1]
        lines = [
            f"{self.prefix}Avg prompt throughput: {self._prompt_tokens / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {self._generation_tokens / elapsed:.1f} tokens/s, "
            f"Running: {s.num_running_reqs} reqs, Waiting: {s.num_waiting_reqs} reqs, "
            f"KV cache usage: {s.kv_cache_usage * 100:.1f}%, "
            f"Prefix cache hit rate: {hits / queries * 100 if queries else 0.0:.1f}%"
        ]
        spec = s.spec_decoding_stats
        if spec is not None:
            lines.append(self.prefix + self._spec_line(spec, elapsed))
            self._last_spec = spec.copy()
        for line in lines:
            logger.info("%s", line)
        self.last_lines = lines
        self._last_log = now
        self._prompt_tokens = self._generation_tokens = 0
        self._last_prefix = (s.prefix_cache_queries, s.prefix_cache_hits)

    def _spec_line(self, spec: SpecDecodingStats, elapsed: float) -> str:
        last = self._last_spec or SpecDecodingStats(spec.num_spec_tokens)
        drafts = spec.num_drafts - last.num_drafts
        drafted = spec.num_draft_tokens - last.num_draft_tokens
        accepted = spec.num_accepted_tokens - last.num_accepted_tokens
        per_pos = [
            (now - before) / drafts if drafts else 0.0
            for now, before in zip(
                spec.num_accepted_tokens_per_pos, last.num_accepted_tokens_per_pos, strict=True
            )
        ]
        return (
            f"SpecDecoding metrics: Mean acceptance length: "
            f"{1 + accepted / drafts if drafts else 1.0:.2f}, "
            f"Accepted throughput: {accepted / elapsed:.2f} tokens/s, "
            f"Drafted throughput: {drafted / elapsed:.2f} tokens/s, "
            f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
            f"Per-position acceptance rate: {', '.join(f'{r:.3f}' for r in per_pos)}, "
            f"Avg Draft acceptance rate: {accepted / drafted * 100 if drafted else 0.0:.1f}%"
        )
