"""Timing one batch of decode steps on an `LLMEngine` (shared by the benchmarks)."""

from __future__ import annotations

import time
from typing import Any


def time_decode_batch(
    engine: Any, tag: str, batch: int, prompt_len: int, params: Any
) -> tuple[float, int]:
    """Add ``batch`` requests of ``prompt_len`` token ids, run their prefill step,
    then step until all finish; returns (seconds of the decode steps, steps)."""
    for i in range(batch):
        ids = [(7 * i + j) % 1000 + 10 for j in range(prompt_len)]
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids}, params)
    engine.step()  # the prefill
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return time.perf_counter() - start, steps
