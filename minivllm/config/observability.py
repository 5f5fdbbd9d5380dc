"""`ObservabilityConfig`: metrics and tracing."""

from __future__ import annotations

from typing import Literal

from minivllm.config.utils import config, hash_factors

PerRequestSpecDecodeMetrics = Literal["none", "summary", "detailed"]
"""vLLM's values: off, a summary of acceptance, or the summary plus per-step arrays."""


@config
class ObservabilityConfig:
    """Configuration for observability: metrics and tracing."""

    show_hidden_metrics_for_version: str | None = None
    """Re-enable metrics hidden since this version (e.g. "0.7") during their
    deprecation period."""
    otlp_traces_endpoint: str | None = None
    """OpenTelemetry traces endpoint. Unsupported (no tracing): must be None."""
    collect_detailed_traces: list[str] | None = None
    """Modules to collect detailed traces for. Unsupported: must be None."""
    kv_cache_metrics: bool = False
    """Sample KV-block lifetimes and reuse for the metrics endpoint."""
    kv_cache_metrics_sample: float = 0.01
    """Fraction of KV blocks sampled when ``kv_cache_metrics`` is on."""
    cudagraph_metrics: bool = False
    """Report how often batches ran in a CUDA graph and their padding."""
    enable_layerwise_nvtx_tracing: bool = False
    """Emit an NVTX range per layer. Unsupported."""
    enable_mfu_metrics: bool = False
    """Estimate model FLOPs utilization per step."""
    enable_logging_iteration_details: bool = False
    """Log per-step batch details."""
    per_request_spec_decode_metrics: PerRequestSpecDecodeMetrics = "none"
    """Per-request speculative decoding acceptance metrics in each response: "none"
    (off), "summary" (mean acceptance length and rate, histogram of accepted drafts)
    or "detailed" (the summary plus the per-step accepted/proposed counts), in each
    completion's ``spec_decode_metrics`` (offline) and each choice's
    ``spec_decode_metrics`` (server, non-streaming). Needs speculative decoding."""

    def __post_init__(self) -> None:
        if not 0 < self.kv_cache_metrics_sample <= 1:
            raise ValueError(
                f"kv_cache_metrics_sample must be in (0, 1], got {self.kv_cache_metrics_sample}"
            )
        self.check_supported()

    def check_supported(self) -> None:
        """Tracing and NVTX ranges are not implemented."""
        problems = []
        if self.otlp_traces_endpoint is not None:
            problems.append("otlp_traces_endpoint (OpenTelemetry tracing)")
        if self.collect_detailed_traces is not None:
            problems.append("collect_detailed_traces (tracing)")
        if self.enable_layerwise_nvtx_tracing:
            problems.append("enable_layerwise_nvtx_tracing (NVTX ranges)")
        if problems:
            raise ValueError(f"not supported by minivllm: {'; '.join(problems)}. Leave them unset.")

    @property
    def collect_model_forward_time(self) -> bool:
        return False

    @property
    def collect_model_execute_time(self) -> bool:
        return False

    def compute_hash(self) -> str:
        """Observability does not change the compiled graph: no factors."""
        return hash_factors([])
