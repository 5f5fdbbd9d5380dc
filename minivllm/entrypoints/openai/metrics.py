"""Prometheus metrics under vLLM's names, so vLLM's Grafana dashboards work unchanged.

Every server app owns its own `CollectorRegistry` (two apps in one process, as in
tests, never collide).  `PrometheusStatLogger.record` is called by the engine
thread after every step; prometheus_client's metrics are thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE_LATEST
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

from minivllm.config.cache import CacheConfig
from minivllm.entrypoints.openai.kv_metrics import KVTransferMetrics
from minivllm.stats import IterationStats, SchedulerStats, SpecDecodingStats

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
"""Time-to-first-token buckets (seconds), vLLM's."""
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
"""Inter-token latency buckets (seconds), vLLM's."""
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                           40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip
"""End-to-end request latency buckets (seconds), vLLM's."""
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
"""Tokens per engine step (vLLM's buckets)."""
N_BUCKETS = [1, 2, 5, 10, 20]
"""``n`` per request (vLLM's buckets)."""
FINISH_REASONS = ("stop", "length", "abort", "error")
"""finished_reason label values, pre-created so a dashboard sees zeros, not gaps."""


class PrometheusStatLogger:
    """The engine statistics as Prometheus metrics, labelled with the served model name."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        registry: CollectorRegistry,
        num_spec_tokens: int = 0,
        max_loras: int = 0,
        engine_index: int = 0,
        families: dict[str, Any] | None = None,
    ) -> None:
        self.registry = registry
        self._args = (model_name, max_model_len, registry, num_spec_tokens, max_loras)
        self._families: dict[str, Any] = {} if families is None else families
        values = {"model_name": model_name, "engine": str(engine_index)}
        make = _LabelledMetrics(registry, values, self._families)
        self._make = make
        self._add_scheduler_metrics(make)
        self._add_token_counters(make)
        self._add_latency_histograms(make)
        self._add_request_histograms(make, max_model_len)
        self._kv_transfer = KVTransferMetrics(make)
        self._cache_info = make.family(
            "vllm:cache_config",
            lambda: Info(
                "vllm:cache_config",
                "Information of the LLMEngine's CacheConfig.",
                registry=registry,
            ),
        )
        self._success = make.counter_family(
            "vllm:request_success",
            "Successfully processed requests, by finish reason.",
            "finished_reason",
        )
        self.request_success = {
            reason: make.child(self._success, finished_reason=reason) for reason in FINISH_REASONS
        }
        self._spec: dict[str, Any] | None = None
        self._last_spec: SpecDecodingStats | None = None
        if num_spec_tokens:
            self._spec = _spec_decode_counters(make, num_spec_tokens)
        self._lora_info: Gauge | None = None
        self._lora_labels: tuple[str, ...] | None = None
        self.max_loras = max_loras
        if max_loras:  # vLLM's info gauge: the adapters in its labels, the time as value
            self._lora_info = make.family(
                "vllm:lora_requests_info",
                lambda: Gauge(
                    "vllm:lora_requests_info",
                    "Running stats on lora requests.",
                    ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                    registry=registry,
                ),
            )
        # SchedulerStats counters are cumulative; Prometheus counters take increments.
        self._last_queries = 0
        self._last_hits = 0
        self._last_preemptions = 0

    def for_engine(self, engine_index: int) -> PrometheusStatLogger:
        """The stat logger of another engine (a data-parallel replica): the same
        metrics in the same registry, labelled ``engine="<engine_index>"``, so that
        /metrics shows every replica, as vLLM's does."""
        return PrometheusStatLogger(*self._args, engine_index, self._families)

    def _add_scheduler_metrics(self, make: _LabelledMetrics) -> None:
        """The queue lengths, KV cache use, prefix-cache and preemption counts."""
        self.num_requests_running = make.gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.num_requests_waiting = make.gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_cache_usage = make.gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_cache_queries = make.counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens."
        )
        self.prefix_cache_hits = make.counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in tokens."
        )
        self.num_preemptions = make.counter("vllm:num_preemptions", "Cumulative preemptions.")

    def _add_token_counters(self, make: _LabelledMetrics) -> None:
        """Prompt and generated tokens, in total and per engine step."""
        self.prompt_tokens = make.counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        )
        self.generation_tokens = make.counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.iteration_tokens = make.histogram(
            "vllm:iteration_tokens_total",
            "Histogram of the number of tokens per engine step.",
            [float(b) for b in ITERATION_TOKENS_BUCKETS],
        )

    def _add_latency_histograms(self, make: _LabelledMetrics) -> None:
        """Time to first token, between tokens, end to end, and in each request phase."""
        self.ttft = make.histogram(
            "vllm:time_to_first_token_seconds", "Time to first token, in seconds.", TTFT_BUCKETS
        )
        self.itl = make.histogram(
            "vllm:inter_token_latency_seconds", "Inter-token latency, in seconds.", ITL_BUCKETS
        )
        self.e2e = make.histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency, in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        phase_doc = "Histogram of time spent in the {} phase of a request, in seconds."
        phases = {
            "queue_time": ("vllm:request_queue_time_seconds", "WAITING"),
            "prefill_time": ("vllm:request_prefill_time_seconds", "PREFILL"),
            "decode_time": ("vllm:request_decode_time_seconds", "DECODE"),
            "inference_time": (
                "vllm:request_inference_time_seconds",
                "RUNNING (prefill + decode)",
            ),
        }
        for attr, (name, phase) in phases.items():
            histogram = make.histogram(name, phase_doc.format(phase), REQUEST_LATENCY_BUCKETS)
            setattr(self, attr, histogram)

    def _add_request_histograms(self, make: _LabelledMetrics, max_model_len: int) -> None:
        """Per finished request: its ``n``, ``max_tokens``, prompt and output lengths."""
        self.request_params_n = make.histogram(
            "vllm:request_params_n", "Histogram of the n request parameter.", N_BUCKETS
        )
        length_buckets = _length_buckets(max_model_len)
        self.request_params_max_tokens = make.histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            length_buckets,
        )
        self.request_prompt_tokens = make.histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request.", length_buckets
        )
        self.request_generation_tokens = make.histogram(
            "vllm:request_generation_tokens", "Generated tokens per request.", length_buckets
        )

    def record(self, scheduler_stats: SchedulerStats, iteration_stats: IterationStats) -> None:
        """Update every metric from one engine step (engine thread)."""
        s = scheduler_stats
        self.num_requests_running.set(s.num_running_reqs)
        self.num_requests_waiting.set(s.num_waiting_reqs)
        self.kv_cache_usage.set(s.kv_cache_usage)
        self.prefix_cache_queries.inc(max(0, s.prefix_cache_queries - self._last_queries))
        self.prefix_cache_hits.inc(max(0, s.prefix_cache_hits - self._last_hits))
        self.num_preemptions.inc(max(0, s.num_preemptions - self._last_preemptions))
        self._last_queries = s.prefix_cache_queries
        self._last_hits = s.prefix_cache_hits
        self._last_preemptions = s.num_preemptions
        if self._spec is not None and s.spec_decoding_stats is not None:
            self._record_spec(s.spec_decoding_stats)
        if self._lora_info is not None:
            # One sample per engine: the adapters now (a replica's old sample goes,
            # the other replicas' stay).
            labels = (
                str(self.max_loras),
                ",".join(sorted(s.waiting_lora_adapters)),
                ",".join(sorted(s.running_lora_adapters)),
            )
            if self._lora_labels is not None and self._lora_labels != labels:
                self._lora_info.remove(*self._lora_labels)
            self._lora_labels = labels
            self._lora_info.labels(*labels).set_to_current_time()
        self._kv_transfer.record(s)

        it = iteration_stats
        num_step_tokens = it.num_prompt_tokens + it.num_generation_tokens
        if num_step_tokens:
            self.iteration_tokens.observe(num_step_tokens)
        self.prompt_tokens.inc(it.num_prompt_tokens)
        self.generation_tokens.inc(it.num_generation_tokens)
        for value in it.time_to_first_tokens:
            self.ttft.observe(value)
        for value in it.inter_token_latencies:
            self.itl.observe(value)
        for finished in it.finished_requests:
            counter = self.request_success.get(finished.finish_reason)
            if counter is None:
                counter = self._make.child(self._success, finished_reason=finished.finish_reason)
            counter.inc()
            self.e2e.observe(finished.e2e_latency)
            self.request_prompt_tokens.observe(finished.num_prompt_tokens)
            self.request_generation_tokens.observe(finished.num_generation_tokens)
            self.queue_time.observe(finished.queue_time)
            self.prefill_time.observe(finished.prefill_time)
            self.decode_time.observe(finished.decode_time)
            self.inference_time.observe(finished.inference_time)
            self.request_params_n.observe(finished.n)
            if finished.max_tokens is not None:
                self.request_params_max_tokens.observe(finished.max_tokens)

    def _record_spec(self, spec: SpecDecodingStats) -> None:
        assert self._spec is not None
        last = self._last_spec or SpecDecodingStats(spec.num_spec_tokens)
        self._spec["drafts"].inc(spec.num_drafts - last.num_drafts)
        self._spec["draft_tokens"].inc(spec.num_draft_tokens - last.num_draft_tokens)
        self._spec["accepted"].inc(spec.num_accepted_tokens - last.num_accepted_tokens)
        for counter, now, before in zip(
            self._spec["per_pos"],
            spec.num_accepted_tokens_per_pos,
            last.num_accepted_tokens_per_pos,
            strict=True,
        ):
            counter.inc(now - before)
        self._last_spec = spec.copy()

    def log_cache_config(self, cache_config: CacheConfig) -> None:
        """``vllm:cache_config_info``: the cache settings as labels (vLLM's info metric)."""
        fields = ("block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization",
                  "num_gpu_blocks", "num_gpu_blocks_override", "prefix_caching_hash_algo",
                  "cpu_kvcache_space_bytes", "kv_cache_memory_bytes", "swap_space")  # fmt: skip
        labels = {}
        for name in fields:
            if hasattr(cache_config, name):
                value = getattr(cache_config, name)
                labels[name] = str(getattr(value, "value", value))
        self._cache_info.info(labels)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


class _LabelledMetrics:
    """Makes the metrics of one registry, each labelled with this engine's values
    (``model_name``, ``engine``); a family with one more label gives its children.
    Engines of one registry share ``families`` (metric name -> collector): the first
    makes a metric, the others add their children to it."""

    def __init__(
        self, registry: CollectorRegistry, values: dict[str, str], families: dict[str, Any]
    ) -> None:
        self.registry = registry
        self.values = values
        self.families = families

    def family(self, name: str, make: Callable[[], Any]) -> Any:
        if name not in self.families:
            self.families[name] = make()
        return self.families[name]

    def gauge(self, name: str, doc: str) -> Any:
        labels, registry = list(self.values), self.registry
        metric = self.family(name, lambda: Gauge(name, doc, labels, registry=registry))
        return metric.labels(**self.values)

    def counter(self, name: str, doc: str) -> Any:
        labels, registry = list(self.values), self.registry
        metric = self.family(name, lambda: Counter(name, doc, labels, registry=registry))
        return metric.labels(**self.values)

    def histogram(self, name: str, doc: str, buckets: list[float]) -> Any:
        labels, registry = list(self.values), self.registry
        metric = self.family(
            name, lambda: Histogram(name, doc, labels, buckets=buckets, registry=registry)
        )
        return metric.labels(**self.values)

    def counter_family(self, name: str, doc: str, extra_label: str) -> Counter:
        labels, registry = [*self.values, extra_label], self.registry
        family: Counter = self.family(name, lambda: Counter(name, doc, labels, registry=registry))
        return family

    def child(self, family: Counter, **extra: str) -> Any:
        return family.labels(**self.values, **extra)


def _spec_decode_counters(make: _LabelledMetrics, num_spec_tokens: int) -> dict[str, Any]:
    """vLLM's speculative decoding counters (the per-position one has a position label)."""
    per_pos = make.counter_family(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Accepted draft tokens, by position in the draft.",
        "position",
    )
    return {
        "drafts": make.counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
        "draft_tokens": make.counter(
            "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."
        ),
        "accepted": make.counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
        ),
        "per_pos": [make.child(per_pos, position=str(i)) for i in range(num_spec_tokens)],
    }


def _length_buckets(max_model_len: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len (vLLM's 1-2-5 series)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return buckets
            buckets.append(float(value))
        exponent += 1


__all__ = ["CONTENT_TYPE_LATEST", "PrometheusStatLogger"]
