"""Per-step statistics for the offline engine (`LLM(..., disable_log_stats=False)`).

The server's `AsyncLLM` times each stream itself; offline there are no streams, so
the engine derives the same `IterationStats` from the scheduler's per-request
outputs of each step: tokens, time to first token, inter-token latencies, and the
requests that finished.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from minivllm.engine.output_processor import OutputProcessor
from minivllm.outputs import RequestOutput
from minivllm.scheduler.output import EngineCoreOutput
from minivllm.stats import FinishedRequestStats, IterationStats


@dataclass
class _Times:
    arrival: float
    num_prompt_tokens: int
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0


class OfflineStatsCollector:
    """Turns each step's core outputs into `IterationStats`."""

    def __init__(self) -> None:
        self._times: dict[str, _Times] = {}

    def observe(
        self, core_outputs: list[EngineCoreOutput], processor: OutputProcessor
    ) -> IterationStats:
        """Call with the step's core outputs before the output processor consumes them."""
        stats = IterationStats()
        now = time.time()
        for eco in core_outputs:
            state = processor.states.get(eco.request_id)
            if state is None:
                continue
            times = self._times.get(eco.request_id)
            if times is None:
                times = self._times[eco.request_id] = _Times(
                    state.arrival_time, len(state.parent.prompt_token_ids)
                )
            if eco.new_token_ids:
                if times.first_token is None:
                    times.first_token = now
                    stats.time_to_first_tokens.append(now - times.arrival)
                    stats.num_prompt_tokens += times.num_prompt_tokens
                elif times.last_token is not None:
                    stats.inter_token_latencies.append(now - times.last_token)
                times.last_token = now
                times.num_tokens += len(eco.new_token_ids)
                stats.num_generation_tokens += len(eco.new_token_ids)
        return stats

    def finish(self, outputs: list[RequestOutput], stats: IterationStats) -> None:
        """Add the requests that finished this step (after the output processor ran)."""
        now = time.time()
        for output in outputs:
            if not output.finished:
                continue
            for completion in output.outputs:
                child = output.request_id if len(output.outputs) == 1 else None
                times = self._times.pop(child or f"{completion.index}_{output.request_id}", None)
                if times is None:
                    continue
                first = times.first_token
                stats.finished_requests.append(
                    FinishedRequestStats(
                        completion.finish_reason or "abort",
                        now - times.arrival,
                        times.num_prompt_tokens,
                        times.num_tokens,
                        decode_time=(times.last_token or now) - first if first else 0.0,
                        inference_time=(times.last_token or now) - times.arrival,
                    )
                )
