"""Derived properties, hashing and paths of `VllmConfig` (a mixin, kept apart so
the resolution code in ``vllm.py`` stays readable)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.config.utils import get_hash_factors, hash_factors
from minivllm.platforms import current_platform

_HASHED_SUBCONFIGS = (
    "model_config",
    "cache_config",
    "parallel_config",
    "scheduler_config",
    "device_config",
    "load_config",
    "offload_config",
    "attention_config",
    "engram_config",
    "lora_config",
    "speculative_config",
    "structured_outputs_config",
    "profiler_config",
    "observability_config",
    "compilation_config",
    "kernel_config",
    "kv_transfer_config",
    "ec_transfer_config",
    "aux_output_config",
)
"""Sub-configs whose own hash enters `VllmConfig.compute_hash`, in the seed's order.
Everything else (instance_id, logging, shutdown_timeout, performance_mode and the
level, which act only through the fields they set) cannot change the compiled graph."""


def _version() -> str:
    try:
        return importlib.metadata.version("minivllm")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "0+unknown"


class VllmConfigDerived:
    """What `VllmConfig` computes from its fields rather than stores."""

    if TYPE_CHECKING:  # declared (and validated) on `VllmConfig`; only read here
        model_config: Any
        scheduler_config: Any
        parallel_config: Any
        cache_config: Any
        compilation_config: Any
        speculative_config: Any
        diffusion_config: Any
        additional_config: Any

    def compile_debug_dump_path(self) -> Path | None:
        """Where this rank dumps torch.compile debug output, or None when not dumping."""
        base = self.compilation_config.debug_dump_path
        if base is None:
            return None
        parallel = self.parallel_config
        return Path(base) / f"rank_{parallel.rank}_dp_{parallel.data_parallel_index}"

    # -- hashing ---------------------------------------------------------------------
    def compute_hash(self, include_version: bool = True) -> str:
        """10 hex characters identifying everything that shapes the compiled graph
        (input ids to final hidden states): each hashed sub-config's own hash, the
        additional config and, by default, the minivllm version."""
        factors: list[Any] = [_version()] if include_version else []
        for name in _HASHED_SUBCONFIGS:
            sub = getattr(self, name, None)
            if sub is None:
                factors.append("None")
            elif callable(getattr(sub, "compute_hash", None)):
                factors.append(sub.compute_hash())
            else:
                factors.append(hash_factors(get_hash_factors(sub, set())))
        extra = self.additional_config
        if not extra:
            factors.append("None")
        elif isinstance(extra, dict):
            factors.append(hash_factors(json.loads(json.dumps(extra, sort_keys=True))))
        else:
            factors.append(extra.compute_hash())
        return hash_factors(factors)[:10]

    # -- derived properties ------------------------------------------------------
    @property
    def num_speculative_tokens(self) -> int:
        """Draft tokens per step (0: no speculative decoding, which minivllm lacks)."""
        spec = self.speculative_config
        if spec is not None and spec.num_speculative_tokens is not None:
            return spec.num_speculative_tokens
        diffusion = self.diffusion_config
        if diffusion is not None and diffusion.canvas_length is not None:
            return diffusion.canvas_length
        return 0

    @property
    def uniform_decode_query_len(self) -> int:
        """Query tokens per request in a uniform decode batch: the sampled token plus
        one per draft token."""
        return 1 + self.num_speculative_tokens

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots to reserve past the scheduled tokens for a drafter (0 without one)."""
        return 0 if self.speculative_config is None else self.num_speculative_tokens

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """Prefill tokens past the computed range a drafter reads (0 without one)."""
        return 0

    @property
    def max_concurrent_batches(self) -> int:
        """Batches in flight: one per pipeline stage, two with async scheduling (PP=1)."""
        pp_size = self.parallel_config.pipeline_parallel_size
        if self.scheduler_config.async_scheduling and pp_size <= 1:
            return 2
        return pp_size

    @property
    def max_in_flight_tokens(self) -> int:
        """Upper bound on scheduled-but-unsettled tokens: a full budget per batch."""
        return self.max_concurrent_batches * self.scheduler_config.max_num_batched_tokens

    @property
    def use_v2_model_runner(self) -> bool:
        """minivllm has one model runner, which follows vLLM's V1 runner rules."""
        return False

    @property
    def is_mm_encoder_only(self) -> bool:
        """Multimodal encoder-only instances do not exist in minivllm."""
        return False

    @property
    def needs_dp_coordinator(self) -> bool:
        """Data parallelism needs a coordinator for MoE waves or internal load balancing."""
        parallel = self.parallel_config
        if getattr(parallel, "data_parallel_size", 1) <= 1:
            return False
        model = self.model_config
        return (
            model is None
            or bool(getattr(model, "is_moe", False))
            or not getattr(parallel, "data_parallel_external_lb", False)
        )

    @property
    def use_cumem_cudagraph_pool(self) -> bool:
        """Whether CUDA graphs go to the memory pool that sleep mode offloads."""
        model = self.model_config
        return (
            model is not None
            and bool(getattr(model, "enable_sleep_mode", False))
            and bool(getattr(model, "sleep_mode_offload_cudagraph", False))
            and self.compilation_config.cudagraph_mode != CUDAGraphMode.NONE
            and current_platform.is_cuda()
        )

    def __str__(self) -> str:
        model = self.model_config
        parts = [
            f"model={getattr(model, 'model', None)!r}",
            f"dtype={getattr(model, 'dtype', None)}",
            f"max_seq_len={getattr(model, 'max_model_len', None)}",
            f"enforce_eager={getattr(model, 'enforce_eager', None)}",
            f"tensor_parallel_size={self.parallel_config.tensor_parallel_size}",
            f"pipeline_parallel_size={self.parallel_config.pipeline_parallel_size}",
            f"kv_cache_dtype={getattr(self.cache_config, 'cache_dtype', None)}",
            f"block_size={self.cache_config.block_size}",
            f"enable_prefix_caching={getattr(self.cache_config, 'enable_prefix_caching', None)}",
            f"optimization_level={self.optimization_level.name}",
            f"compilation_config={self.compilation_config!r}",
        ]
        return ", ".join(parts)
