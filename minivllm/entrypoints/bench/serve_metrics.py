"""Per-request results of ``bench serve`` and the figures computed from them.

Latencies are kept in seconds per request and reported in milliseconds:
TTFT (time to the first generated text), TPOT (time per output token after the
first: ``(e2el - ttft) / (output_tokens - 1)``), ITL (gaps between successive
streamed chunks) and E2EL (request sent to last byte received).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from minivllm.entrypoints.bench.common import format_percentile, mean, percentile, std

METRICS = ("ttft", "tpot", "itl", "e2el")
"""The latency metrics, in report order."""
METRIC_TITLES = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}
GOODPUT_METRICS = ("ttft", "tpot", "e2el")
"""Metrics a --goodput SLO may bound."""


@dataclass
class RequestResult:
    """What one request of the benchmark measured (times in seconds)."""

    prompt_len: int
    """Prompt tokens: the server's usage.prompt_tokens, else the dataset's count."""
    success: bool = False
    output_tokens: int = 0
    """Generated tokens: the server's usage.completion_tokens, else counted by tokenizer."""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    start_time: float = 0.0
    """When the request was sent, relative to the benchmark's start."""
    chunk_times: list[float] = field(default_factory=list)
    """When each text chunk arrived, relative to the benchmark's start."""
    generated_text: str = ""
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Mean time per token after the first; None with fewer than two tokens."""
        if self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items or []:
        name, sep, raw = item.partition(":")
        name = name.strip().lower()
        if not sep or name not in GOODPUT_METRICS:
            raise ValueError(
                f"argument --goodput: {item!r} is not METRIC:MILLISECONDS with METRIC one of "
                f"{', '.join(GOODPUT_METRICS)} (e.g. --goodput ttft:500 tpot:50)"
            )
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"argument --goodput: {raw!r} in {item!r} is not a number") from None
        if not value > 0 or math.isinf(value):
            raise ValueError(f"argument --goodput: the SLO of {name} must be > 0 ms, got {raw}")
        slos[name] = value
    return slos


def meets_slos(result: RequestResult, slos: dict[str, float]) -> bool:
    """Whether a successful request is within every SLO (milliseconds)."""
    values = {"ttft": result.ttft, "tpot": result.tpot or 0.0, "e2el": result.latency}
    return all(values[name] * 1000 <= limit for name, limit in slos.items())


def per_second_series(
    results: list[RequestResult], duration: float
) -> tuple[list[float], list[int]]:
    """(output tokens, peak requests in flight) in each whole second of the run.

    A request's tokens are spread evenly over its streamed chunks (a chunk may carry
    more than one token).  Concurrency is swept exactly over start and end events
    (an end before a start at the same instant), so a request that ends and the
    one that replaces it in the same second are not counted together.
    """
    num_bins = max(1, math.ceil(duration))
    tokens = [0.0] * num_bins
    for r in results:
        per_chunk = r.output_tokens / len(r.chunk_times) if r.chunk_times else 0.0
        for t in r.chunk_times:
            tokens[min(int(t), num_bins - 1)] += per_chunk
    events = sorted(
        [(r.start_time + r.latency, -1) for r in results] + [(r.start_time, 1) for r in results]
    )
    in_flight = [0] * num_bins
    current, second = 0, 0
    for t, delta in events:
        event_bin = min(max(int(t), 0), num_bins - 1)
        while second < event_bin:  # seconds with no event keep the running count
            second += 1
            in_flight[second] = max(in_flight[second], current)
        current += delta
        in_flight[event_bin] = max(in_flight[event_bin], current)
    return tokens, in_flight


def compute_metrics(
    results: list[RequestResult],
    duration: float,
    percentiles: list[float],
    slos: dict[str, float],
) -> dict[str, Any]:
    """Every figure of the run (latencies in ms), as flat JSON-ready fields."""
    ok = [r for r in results if r.success]
    samples: dict[str, list[float]] = {
        "ttft": [r.ttft for r in ok],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }
    total_input = sum(r.prompt_len for r in ok)
    total_output = sum(r.output_tokens for r in ok)
    tokens_per_s, in_flight = per_second_series(ok, duration)
    metrics: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration,
        "output_throughput": total_output / duration,
        "total_token_throughput": (total_input + total_output) / duration,
        "max_output_tokens_per_s": max(tokens_per_s),
        "max_concurrent_requests": max(in_flight),
    }
    if slos:
        good = sum(meets_slos(r, slos) for r in ok)
        metrics["good_requests"] = good
        metrics["request_goodput"] = good / duration
    for name in METRICS:
        values_ms = [v * 1000 for v in samples[name]]
        metrics[f"mean_{name}_ms"] = mean(values_ms)
        metrics[f"median_{name}_ms"] = percentile(values_ms, 50)
        metrics[f"std_{name}_ms"] = std(values_ms)
        for q in percentiles:
            metrics[f"p{format_percentile(q)}_{name}_ms"] = percentile(values_ms, q)
    metrics["input_lens"] = [r.prompt_len for r in results]
    metrics["output_lens"] = [r.output_tokens for r in results]
    metrics["ttfts"] = [r.ttft for r in results]
    metrics["itls"] = [r.itl for r in results]
    metrics["e2els"] = [r.latency for r in results]
    metrics["start_times"] = [r.start_time for r in results]
    metrics["errors"] = [r.error for r in results]
    return metrics


def summary_rows(
    metrics: dict[str, Any], percentiles: list[float], max_concurrency: int | None
) -> list[tuple[str, Any] | str]:
    """The rows of the printed result table (vLLM's layout)."""
    rows: list[tuple[str, Any] | str] = [
        ("Successful requests:", metrics["completed"]),
        ("Failed requests:", metrics["failed"]),
        ("Maximum request concurrency:", max_concurrency),
        ("Benchmark duration (s):", metrics["duration"]),
        ("Total input tokens:", metrics["total_input_tokens"]),
        ("Total generated tokens:", metrics["total_output_tokens"]),
        ("Request throughput (req/s):", metrics["request_throughput"]),
    ]
    if "request_goodput" in metrics:
        rows.append(("Request goodput (req/s):", metrics["request_goodput"]))
        rows.append(("Requests within SLOs:", metrics["good_requests"]))
    rows += [
        ("Output token throughput (tok/s):", metrics["output_throughput"]),
        ("Peak output token throughput (tok/s):", metrics["max_output_tokens_per_s"]),
        ("Peak concurrent requests:", metrics["max_concurrent_requests"]),
        ("Total token throughput (tok/s):", metrics["total_token_throughput"]),
    ]
    for name in METRICS:
        upper = name.upper()
        rows.append(METRIC_TITLES[name])
        rows.append((f"Mean {upper} (ms):", metrics[f"mean_{name}_ms"]))
        rows.append((f"Median {upper} (ms):", metrics[f"median_{name}_ms"]))
        rows.append((f"Std {upper} (ms):", metrics[f"std_{name}_ms"]))
        for q in percentiles:
            label = format_percentile(q)
            rows.append((f"P{label} {upper} (ms):", metrics[f"p{label}_{name}_ms"]))
    return rows
