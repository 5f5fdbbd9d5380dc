"""/metrics: prompt tokens by source and the KV connector's counters follow the
engine's cumulative statistics (each step adds the increment, never the total)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from minivllm.entrypoints.openai.metrics import PrometheusStatLogger
from minivllm.stats import IterationStats, KVConnectorStats, PromptTokenStats, SchedulerStats

LABELS = {"model_name": "m", "engine": "0"}


def _stats(prompt: PromptTokenStats, kv: KVConnectorStats | None) -> SchedulerStats:
    return SchedulerStats(0, 0, 0.0, 0, 0, 0, 0, prompt_token_stats=prompt, kv_connector_stats=kv)


def test_counters_take_the_increments() -> None:
    registry = CollectorRegistry()
    logger = PrometheusStatLogger("m", 128, registry)
    logger.record(_stats(PromptTokenStats(10, 4, 0), None), IterationStats())
    assert registry.get_sample_value("vllm:kv_connector_loaded_blocks_total", LABELS) is None
    kv = KVConnectorStats(num_loaded_blocks=3, num_loaded_bytes=300, load_time_s=0.5,
                          external_queries=64, external_hits=48)  # fmt: skip
    logger.record(_stats(PromptTokenStats(11, 4, 48), kv), IterationStats())
    kv2 = kv.copy()
    kv2.num_loaded_blocks, kv2.num_failed_loads = 5, 1
    logger.record(_stats(PromptTokenStats(12, 4, 80), kv2), IterationStats())

    def value(name: str, **extra: str) -> float | None:
        return registry.get_sample_value(name, {**LABELS, **extra})

    assert value("vllm:prompt_tokens_by_source_total", source="local_compute") == 12
    assert value("vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 4
    assert value("vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 80
    assert value("vllm:kv_connector_loaded_blocks_total") == 5
    assert value("vllm:kv_connector_loaded_bytes_total") == 300
    assert value("vllm:kv_connector_load_seconds_total") == 0.5
    assert value("vllm:kv_connector_failed_loads_total") == 1
    assert value("vllm:external_prefix_cache_hits_total") == 48
    assert value("vllm:external_prefix_cache_queries_total") == 64
