"""Prompt tokens by source and the KV connector's counters, as Prometheus metrics.

``vllm:prompt_tokens_by_source`` (``local_compute``, ``local_cache_hit``,
``external_kv_transfer``) and ``vllm:external_prefix_cache_queries`` / ``_hits`` are
vLLM's names; the transfer counters (``vllm:kv_connector_*``: blocks and bytes
loaded and saved, load seconds, failed loads, corrupt blocks) exist once a connector
reports.  The engine's statistics are cumulative; the counters take the increments.
"""

from __future__ import annotations

from typing import Any

from minivllm.stats import KVConnectorStats, PromptTokenStats, SchedulerStats

SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")

CONNECTOR_COUNTERS = {
    "external_queries": ("vllm:external_prefix_cache_queries",
                         "External prefix cache (KV connector) queries, in tokens."),
    "external_hits": ("vllm:external_prefix_cache_hits",
                      "External prefix cache (KV connector) hits, in tokens."),
    "num_loaded_blocks": ("vllm:kv_connector_loaded_blocks", "KV blocks the connector loaded."),
    "num_loaded_bytes": ("vllm:kv_connector_loaded_bytes", "Bytes of KV the connector loaded."),
    "load_time_s": ("vllm:kv_connector_load_seconds", "Seconds spent loading KV blocks."),
    "num_saved_blocks": ("vllm:kv_connector_saved_blocks",
                         "KV blocks the connector saved (storage, offload tier, send buffer)."),
    "num_saved_bytes": ("vllm:kv_connector_saved_bytes", "Bytes of KV the connector saved."),
    "num_failed_loads": ("vllm:kv_connector_failed_loads",
                         "Requests whose KV load failed (unreachable producer, ...)."),
    "num_corrupt_blocks": ("vllm:kv_connector_corrupt_blocks",
                           "Stored KV blocks that failed their checksum (treated as misses)."),
}  # fmt: skip


class KVTransferMetrics:
    """Records `SchedulerStats.prompt_token_stats` and `kv_connector_stats`."""

    def __init__(self, make: Any) -> None:
        self._make = make
        family = make.counter_family(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", "source"
        )
        self._by_source = {s: make.child(family, source=s) for s in SOURCES}
        self._last_prompt = PromptTokenStats()
        self._connector: dict[str, Any] | None = None
        self._last_connector = KVConnectorStats()

    def record(self, stats: SchedulerStats) -> None:
        prompt = stats.prompt_token_stats
        if prompt is not None:
            for source, counter in self._by_source.items():
                counter.inc(max(0, getattr(prompt, source) - getattr(self._last_prompt, source)))
            self._last_prompt = PromptTokenStats(**vars(prompt))
        kv = stats.kv_connector_stats
        if kv is None:
            return
        if self._connector is None:
            self._connector = {
                field: self._make.counter(name, doc)
                for field, (name, doc) in CONNECTOR_COUNTERS.items()
            }
        for field, counter in self._connector.items():
            counter.inc(max(0, getattr(kv, field) - getattr(self._last_connector, field)))
        self._last_connector = kv.copy()
