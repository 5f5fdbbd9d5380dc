"""`VllmConfig`: every configuration of one engine, resolved into a consistent whole.

Building a `VllmConfig` runs `__post_init__`, which resolves what the user left
unset and reconciles the sub-configs with each other and with the platform, step
by step in the order `minivllm.config.resolution` gives.  Each step records what it
changed in a `Provenance`, so ``vllm_config.explain()`` tells, per field, whether
the user set it, a level or the platform defaulted it, or which rule changed it and
why.

Who built the config says which fields the user set: ``VllmConfig(...,
user_set_paths={"scheduler_config.max_num_seqs", ...})``.  Without it, a field
counts as user-set when it differs from its class default before resolution.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib.metadata
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import InitVar, field
from pathlib import Path
from typing import Any, TypeVar

from minivllm.config import vllm_rules as rules
from minivllm.config.attention import AttentionConfig
from minivllm.config.cache import CacheConfig
from minivllm.config.compilation import CompilationConfig
from minivllm.config.compilation.cudagraph_sizes import set_compile_ranges, set_cudagraph_sizes
from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.config.device import DeviceConfig
from minivllm.config.kernel import KernelConfig
from minivllm.config.kv_events import KVEventsConfig
from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.load import LoadConfig
from minivllm.config.logging import LoggingConfig
from minivllm.config.lora import LoRAConfig
from minivllm.config.model import ModelConfig
from minivllm.config.observability import ObservabilityConfig
from minivllm.config.optimization import (
    OPTIMIZATION_LEVEL_TO_CONFIG,
    OptimizationLevel,
    PerformanceMode,
    enable_act_fusion,
    enable_allreduce_rms_fusion,
    enable_mla_dual_rms_norm_fusion,
    enable_norm_fusion,
    enable_norm_pad_fusion,
    enable_qk_norm_rope_kvcache,
    enable_rope_kvcache_fusion,
    enable_rope_kvcache_mla_fusion,
)
from minivllm.config.parallel import ParallelConfig
from minivllm.config.profiler import ProfilerConfig
from minivllm.config.provenance import Provenance
from minivllm.config.quantization import QuantizationConfig, get_quant_config
from minivllm.config.reasoning import ReasoningConfig
from minivllm.config.resolution import resolve
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.structured_outputs import StructuredOutputsConfig
from minivllm.config.unsupported.aux_output import AuxOutputConfig
from minivllm.config.unsupported.diffusion import DiffusionConfig
from minivllm.config.unsupported.ec_manager import EncoderCacheManagerConfig
from minivllm.config.unsupported.ec_transfer import ECTransferConfig
from minivllm.config.unsupported.engram import EngramConfig
from minivllm.config.unsupported.mamba import MambaConfig
from minivllm.config.unsupported.offload import OffloadConfig
from minivllm.config.unsupported.watermark import WatermarkConfig
from minivllm.config.unsupported.weight_transfer import WeightTransferConfig
from minivllm.config.utils import config, get_hash_factors, hash_factors
from minivllm.logger import init_logger
from minivllm.platforms import current_platform

logger = init_logger(__name__)

T = TypeVar("T")

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
"""Sub-configs whose own hash enters `VllmConfig.compute_hash`, in the order vLLM's
`compute_hash` takes them.  Everything else (instance_id, logging, shutdown_timeout, performance_mode and the
level, which act only through the fields they set) cannot change the compiled graph."""


def _version() -> str:
    try:
        return importlib.metadata.version("minivllm")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "0+unknown"


@config
class VllmConfig:
    """All configuration of one minivllm engine, resolved for the current platform."""

    model_config: ModelConfig | None = None
    """Model configuration (None only for tests and layers built without a model)."""
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    """KV cache configuration."""
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    """Parallelism configuration."""
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig.default_factory)
    """Scheduler configuration."""
    device_config: DeviceConfig = field(default_factory=DeviceConfig)
    """Device configuration."""
    load_config: LoadConfig = field(default_factory=LoadConfig)
    """Weight loading configuration."""
    offload_config: OffloadConfig = field(default_factory=OffloadConfig)
    """Model weight offloading (unsupported: defaults only)."""
    attention_config: AttentionConfig = field(default_factory=AttentionConfig)
    """Attention configuration."""
    aux_output_config: AuxOutputConfig = field(default_factory=AuxOutputConfig)
    """Auxiliary execution outputs (unsupported: defaults only)."""
    engram_config: EngramConfig | None = None
    """N-gram embedding storage (unsupported: must stay None)."""
    mamba_config: MambaConfig = field(default_factory=MambaConfig)
    """Mamba layers (unsupported: defaults only)."""
    kernel_config: KernelConfig = field(default_factory=KernelConfig)
    """Kernel configuration."""
    lora_config: LoRAConfig | None = None
    """LoRA adapters (None: LoRA off; see `LoRAConfig`)."""
    speculative_config: SpeculativeConfig | None = None
    """Speculative decoding ("ngram" or "draft_model"); None: off."""
    watermark_config: WatermarkConfig | None = None
    """Text watermarking (unsupported: must stay None)."""
    diffusion_config: DiffusionConfig | None = None
    """Diffusion LLMs (unsupported: must stay None)."""
    structured_outputs_config: StructuredOutputsConfig = field(
        default_factory=StructuredOutputsConfig
    )
    """Structured outputs: the grammar backend and its options."""
    observability_config: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    """Observability (metrics, tracing) configuration."""
    logging_config: LoggingConfig = field(default_factory=LoggingConfig)
    """Logging configuration."""
    quant_config: QuantizationConfig | None = None
    """Quantization of the weights; derived from ``model_config.quantization`` when None."""
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    """torch.compile and CUDA graph configuration of the model; e.g.
    ``{"mode": 3, "cudagraph_capture_sizes": [1, 2, 4, 8]}``, or ``-cc.mode=3`` on the
    command line."""
    profiler_config: ProfilerConfig = field(default_factory=ProfilerConfig)
    """Profiling configuration."""
    kv_transfer_config: KVTransferConfig | None = None
    """KV connector (offloading tier, disaggregated prefill); None: none, unless
    ``cache_config.kv_offloading_size`` resolves into one."""
    kv_events_config: KVEventsConfig | None = None
    """KV cache events (blocks stored / removed) published for prefix-aware routers, e.g.
    {"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"} (see KVEventsConfig);
    None: off."""
    ec_transfer_config: ECTransferConfig | None = None
    """Distributed encoder cache transfer (unsupported: must stay None)."""
    ec_manager_config: EncoderCacheManagerConfig = field(default_factory=EncoderCacheManagerConfig)
    """Custom encoder cache manager (unsupported: defaults only)."""
    reasoning_config: ReasoningConfig | None = None
    """Reasoning models: the parser and its markers (``--reasoning-parser``); None: off."""
    weight_transfer_config: WeightTransferConfig | None = None
    """Weight transfer for RL training (unsupported: must stay None)."""
    additional_config: dict[str, Any] = field(default_factory=dict)
    """Opaque platform-specific settings; they only enter the hash (contents must be JSON)."""
    instance_id: str = ""
    """ID of this engine instance (generated when empty)."""
    optimization_level: OptimizationLevel = OptimizationLevel.O2
    """Start-up time against speed: -O0 starts fastest, -O3 runs fastest; -O2 is the
    default.  A level only fills fields left unset; see `OptimizationLevel`."""
    performance_mode: PerformanceMode = "balanced"
    """'balanced' (default), 'interactivity' (every CUDA graph size up to 32 for
    low latency at small batches) or 'throughput' (favours large batches)."""
    shutdown_timeout: int = 0
    """Seconds shutdown waits for running requests to finish before aborting them."""
    user_set_paths: InitVar[frozenset[str] | None] = None
    """Dotted paths of the fields the user set (e.g. ``"scheduler_config.max_num_seqs"``),
    for ``explain()``; not stored as a field. None: inferred from class defaults."""

    # -- resolution ------------------------------------------------------------
    def __post_init__(self, user_set_paths: frozenset[str] | None = None) -> None:
        # The ordered resolution (minivllm/config/resolution.py) records every change.
        self._provenance: Provenance = resolve(self, user_set_paths)

    # -- derived values -----------------------------------------------------------

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
            sub = getattr(self, name)
            if sub is None:
                factors.append("None")
            # Config classes without a hash of their own hash all their fields.
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
        """Draft tokens per step (0: no speculative decoding)."""
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
        """KV slots to reserve past the scheduled tokens for a drafter: a draft model
        writes the KV of its own drafts there; n-gram lookup needs none."""
        spec = self.speculative_config
        if spec is None or not spec.uses_draft_model():
            return 0
        return self.num_speculative_tokens

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """Prefill tokens past the computed range a drafter reads (0 without one)."""
        return 0

    @property
    def max_concurrent_batches(self) -> int:
        """vLLM's bound on batches in flight: one per pipeline stage, two with async
        scheduling and no pipeline parallelism (the step after the running one is
        scheduled early).  It sizes `max_in_flight_tokens`.  How many batches
        minivllm's engine actually keeps in flight is `SchedulerOptions`'s decision
        (the pipeline's stages): its engine never overlaps a step with the next."""
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
        if parallel.data_parallel_size <= 1:
            return False
        model = self.model_config
        return model is None or model.is_moe or not parallel.data_parallel_external_lb

    @property
    def use_cumem_cudagraph_pool(self) -> bool:
        """Whether CUDA graphs go to the memory pool that sleep mode offloads."""
        model = self.model_config
        return (
            model is not None
            and model.enable_sleep_mode
            and model.sleep_mode_offload_cudagraph
            and self.compilation_config.cudagraph_mode != CUDAGraphMode.NONE
            and current_platform.is_cuda()
        )

    def __str__(self) -> str:
        model = self.model_config
        parts = [
            f"model={None if model is None else model.model!r}",
            f"dtype={None if model is None else model.dtype}",
            f"max_seq_len={None if model is None else model.max_model_len}",
            f"enforce_eager={None if model is None else model.enforce_eager}",
            f"tensor_parallel_size={self.parallel_config.tensor_parallel_size}",
            f"pipeline_parallel_size={self.parallel_config.pipeline_parallel_size}",
            f"kv_cache_dtype={self.cache_config.cache_dtype}",
            f"block_size={self.cache_config.block_size}",
            f"enable_prefix_caching={self.cache_config.enable_prefix_caching}",
            f"optimization_level={self.optimization_level.name}",
            f"compilation_config={self.compilation_config!r}",
        ]
        return ", ".join(parts)

    # -- methods of vLLM's VllmConfig (same names, same meaning) ----------------------
    @staticmethod
    def _get_quantization_config(
        model_config: ModelConfig, load_config: LoadConfig
    ) -> QuantizationConfig | None:
        """The quantization config of the model, checked against device and dtype."""
        if model_config.quantization is None:
            return None
        quant_config = get_quant_config(model_config, load_config)
        capability = current_platform.get_device_capability()
        if capability is not None and capability.to_int() < quant_config.get_min_capability():
            raise ValueError(
                f"quantization {model_config.quantization!r} needs compute capability "
                f"{quant_config.get_min_capability()} or newer, this GPU has "
                f"{capability.to_int()}; use an unquantized model."
            )
        if model_config.dtype not in quant_config.get_supported_act_dtypes():
            raise ValueError(
                f"dtype {model_config.dtype} is not supported with quantization "
                f"{model_config.quantization!r} (supported: "
                f"{quant_config.get_supported_act_dtypes()}); choose one with --dtype."
            )
        quant_config.maybe_update_config(model_config.model, hf_config=model_config.hf_config)
        return quant_config

    def _set_config_default(self, config_obj: Any, key: str, value: Any) -> None:
        """Set ``config_obj.key`` to ``value`` (or ``value(self)``) if it is still None."""
        if getattr(config_obj, key) is None:
            setattr(config_obj, key, value(self) if callable(value) else value)

    def _apply_optimization_level_defaults(self, defaults: dict[str, Any]) -> None:
        """Fill the fields named in ``defaults`` (nested like the config) that are None."""

        def apply(config_obj: Any, config_defaults: dict[str, Any]) -> None:
            for key, value in config_defaults.items():
                if not hasattr(config_obj, key):
                    continue
                current = getattr(config_obj, key)
                if isinstance(value, dict) and dataclasses.is_dataclass(current):
                    apply(current, value)
                else:
                    self._set_config_default(config_obj, key, value)

        apply(self, defaults)

    def _normalize_piecewise_cudagraph_mode(self, *, breakable_cudagraph_enabled: bool) -> None:
        rules.normalize_piecewise_cudagraph_mode(self, breakable_cudagraph_enabled)

    def _set_cudagraph_sizes(self) -> None:
        """Resolve CUDA graph capture sizes (see `minivllm.config.compilation.cudagraph_sizes`)."""
        set_cudagraph_sizes(self)

    def _set_compile_ranges(self) -> None:
        """Resolve ``compile_ranges_endpoints`` (see `minivllm.config.compilation.cudagraph_sizes`)."""
        set_compile_ranges(self)

    def try_verify_and_update_config(self) -> None:
        """Run the per-architecture config hooks once per model config.

        vLLM keeps a table of hooks for architectures that need config changes
        (hybrid Mamba models, classification adapters); minivllm's architectures
        need none, so this only marks the model config as visited.
        """
        model = self.model_config
        if model is None or model.config_updated:
            return
        model.config_updated = True

    def validate_block_size(self) -> None:
        """Check the final block size against context-parallel interleaving."""
        block_size = self.cache_config.block_size
        parallel = self.parallel_config
        interleave = parallel.cp_kv_cache_interleave_size
        if block_size is not None and parallel.decode_context_parallel_size > 1:
            if interleave > block_size or block_size % interleave:
                raise ValueError(
                    f"block_size ({block_size}) must be a multiple of, and at least, "
                    f"cp_kv_cache_interleave_size ({interleave}); change one of them."
                )

    # -- explanation ---------------------------------------------------------------
    def explain(self) -> dict[str, dict[str, Any]]:
        """``{path: {"value", "source", "rule"?, "reason"?}}`` for every field.

        ``source`` is "user", "level", "platform", "rule" or "default"; ``rule`` names
        the resolution step and ``reason`` says why it changed the value.
        """
        return self._provenance.explain()

    @property
    def provenance(self) -> Provenance:
        """The provenance record behind `explain` (not part of the config's value)."""
        return self._provenance


def iter_user_paths(vllm_config: VllmConfig) -> Iterator[str]:
    """Paths recorded as user-set (for CLIs that echo what the user chose)."""
    for path, origin in vllm_config.provenance.origins.items():
        if origin.source == "user":
            yield path


# -- the config in force while a model is built -------------------------------------
_current_vllm_config: contextvars.ContextVar[VllmConfig | None] = contextvars.ContextVar(
    "minivllm_current_vllm_config", default=None
)
_current_prefix: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "minivllm_current_model_prefix", default=None
)


@contextmanager
def set_current_vllm_config(
    vllm_config: VllmConfig, prefix: str | None = None
) -> Iterator[VllmConfig]:
    """Make ``vllm_config`` the current config inside the block (model construction).

    ``prefix`` names the model being built (e.g. a draft model).
    """
    config_token = _current_vllm_config.set(vllm_config)
    prefix_token = _current_prefix.set(prefix)
    try:
        yield vllm_config
    finally:
        _current_prefix.reset(prefix_token)
        _current_vllm_config.reset(config_token)


def get_current_vllm_config() -> VllmConfig:
    """The current config; a default `VllmConfig` (with a warning) when none is set."""
    vllm_config = _current_vllm_config.get()
    if vllm_config is not None:
        return vllm_config
    # Outside model construction (unit tests of single layers, mostly) a default
    # config keeps the layer usable; the warning says the defaults were assumed.
    logger.warning("Current minivllm config is not set; using a default VllmConfig.")
    return VllmConfig()


def get_current_vllm_config_or_none() -> VllmConfig | None:
    """The current config, or None when no ``set_current_vllm_config`` block is active."""
    return _current_vllm_config.get()


def get_current_model_prefix() -> str | None:
    """The ``prefix`` given to the active ``set_current_vllm_config`` block."""
    return _current_prefix.get()


def get_cached_compilation_config() -> CompilationConfig:
    """The current config's `CompilationConfig` (hot path for custom-op dispatch).

    Reading a context variable is already cheap, so nothing is cached beyond the
    config itself; a default is built (with a warning) when no config is set.
    """
    vllm_config = _current_vllm_config.get()
    if vllm_config is None:
        vllm_config = get_current_vllm_config()
    return vllm_config.compilation_config


def get_layers_from_vllm_config(
    vllm_config: VllmConfig, layer_type: type[T], layer_names: Iterable[str] | None = None
) -> dict[str, T]:
    """Layers of type ``layer_type`` registered in the static forward context.

    ``layer_names`` restricts the lookup; names that are missing or of another type
    are left out.
    """
    forward_context: dict[str, Any] = vllm_config.compilation_config.static_forward_context
    names = forward_context.keys() if layer_names is None else layer_names
    return {
        name: layer for name in names if isinstance(layer := forward_context.get(name), layer_type)
    }


__all__ = [
    "OPTIMIZATION_LEVEL_TO_CONFIG",
    "OptimizationLevel",
    "PerformanceMode",
    "VllmConfig",
    "enable_act_fusion",
    "enable_allreduce_rms_fusion",
    "enable_mla_dual_rms_norm_fusion",
    "enable_norm_fusion",
    "enable_norm_pad_fusion",
    "enable_qk_norm_rope_kvcache",
    "enable_rope_kvcache_fusion",
    "enable_rope_kvcache_mla_fusion",
    "get_cached_compilation_config",
    "get_current_model_prefix",
    "get_current_vllm_config",
    "get_current_vllm_config_or_none",
    "get_layers_from_vllm_config",
    "iter_user_paths",
    "set_current_vllm_config",
]
