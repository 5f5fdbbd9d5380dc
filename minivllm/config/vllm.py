"""`VllmConfig`: every configuration of one engine, resolved into a consistent whole.

Building a `VllmConfig` runs `__post_init__`, which resolves what the user left
unset and reconciles the sub-configs with each other and with the platform, in the
order of the seed: enforce_eager and TORCH_COMPILE_DISABLE, the default compilation
mode, custom ops, the optimization-level defaults, static-graph support of the
platform, CUDA graph capture sizes, compile ranges, splitting ops, async scheduling
and the hybrid KV cache manager.  Each step records what it changed in a
`Provenance`, so ``vllm_config.explain()`` tells, per field, whether the user set
it, a level or the platform defaulted it, or which rule changed it and why.

Who built the config says which fields the user set: ``VllmConfig(...,
user_set_paths={"scheduler_config.max_num_seqs", ...})``.  Without it, a field
counts as user-set when it differs from its class default before resolution.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import InitVar, field
from typing import Any

from minivllm.config import vllm_rules as rules
from minivllm.config.attention import AttentionConfig
from minivllm.config.cache import CacheConfig
from minivllm.config.compilation import CompilationConfig
from minivllm.config.compilation.cudagraph_sizes import set_compile_ranges, set_cudagraph_sizes
from minivllm.config.compilation.modes import CompilationMode
from minivllm.config.device import DeviceConfig
from minivllm.config.kernel import KernelConfig
from minivllm.config.load import LoadConfig
from minivllm.config.logging import LoggingConfig
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
from minivllm.config.provenance import Origin, Provenance, Source, flatten
from minivllm.config.quantization import QuantizationConfig, get_quant_config
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.unsupported.aux_output import AuxOutputConfig
from minivllm.config.unsupported.diffusion import DiffusionConfig
from minivllm.config.unsupported.ec_manager import EncoderCacheManagerConfig
from minivllm.config.unsupported.ec_transfer import ECTransferConfig
from minivllm.config.unsupported.engram import EngramConfig
from minivllm.config.unsupported.kv_events import KVEventsConfig
from minivllm.config.unsupported.kv_transfer import KVTransferConfig
from minivllm.config.unsupported.lora import LoRAConfig
from minivllm.config.unsupported.mamba import MambaConfig
from minivllm.config.unsupported.offload import OffloadConfig
from minivllm.config.unsupported.reasoning import ReasoningConfig
from minivllm.config.unsupported.speculative import SpeculativeConfig
from minivllm.config.unsupported.structured_outputs import StructuredOutputsConfig
from minivllm.config.unsupported.watermark import WatermarkConfig
from minivllm.config.unsupported.weight_transfer import WeightTransferConfig
from minivllm.config.utils import config
from minivllm.config.vllm_context import (
    get_cached_compilation_config,
    get_current_vllm_config,
    get_layers_from_vllm_config,
    set_current_vllm_config,
)
from minivllm.config.vllm_derived import VllmConfigDerived
from minivllm.logger import init_logger
from minivllm.platforms import current_platform

logger = init_logger(__name__)


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    if isinstance(value, list) and len(value) > 8:
        text = f"[{', '.join(map(str, value[:4]))}, ..., {value[-1]}] ({len(value)} items)"
    return text


def _reason(why: str) -> Callable[[str, Any, Any], str]:
    """Per-field reason text: ``"<field> <before> -> <after>: <why>"``."""

    def word(path: str, before: Any, after: Any) -> str:
        return f"{path.rsplit('.', 1)[-1]} {_short(before)} -> {_short(after)}: {why}"

    return word


class _ChainedProvenance(Provenance):
    """`Provenance` whose steps reuse the previous step's "after" snapshot as their
    "before": resolution changes fields only inside steps, and flattening the whole
    tree is the dominant cost of building a config."""

    def __init__(self, root: Any) -> None:
        super().__init__(root)
        self._snapshot: dict[str, Any] | None = None

    @contextmanager
    def step(
        self, source: Source, rule: str, reason: str | Callable[[str, Any, Any], str] = ""
    ) -> Iterator[None]:
        before = self._snapshot if self._snapshot is not None else flatten(self._root)
        try:
            yield
        finally:
            after = flatten(self._root)
            self._snapshot = after
        for path, value in after.items():
            if path in before and before[path] == value:
                continue
            old = before.get(path)
            text = reason(path, old, value) if callable(reason) else reason
            self.origins[path] = Origin(source, rule, text, old)


@config
class VllmConfig(VllmConfigDerived):
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
    """LoRA adapters (unsupported: must stay None)."""
    speculative_config: SpeculativeConfig | None = None
    """Speculative decoding (unsupported: must stay None)."""
    watermark_config: WatermarkConfig | None = None
    """Text watermarking (unsupported: must stay None)."""
    diffusion_config: DiffusionConfig | None = None
    """Diffusion LLMs (unsupported: must stay None)."""
    structured_outputs_config: StructuredOutputsConfig = field(
        default_factory=StructuredOutputsConfig
    )
    """Structured outputs (unsupported: defaults only)."""
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
    """Distributed KV cache transfer (unsupported: must stay None)."""
    kv_events_config: KVEventsConfig | None = None
    """KV cache event publishing (unsupported: must stay None)."""
    ec_transfer_config: ECTransferConfig | None = None
    """Distributed encoder cache transfer (unsupported: must stay None)."""
    ec_manager_config: EncoderCacheManagerConfig = field(default_factory=EncoderCacheManagerConfig)
    """Custom encoder cache manager (unsupported: defaults only)."""
    reasoning_config: ReasoningConfig | None = None
    """Reasoning models (unsupported: must stay None)."""
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
        self._provenance: Provenance = _ChainedProvenance(self)
        self._provenance.mark_user(self._resolve_user_paths(user_set_paths))
        if self.shutdown_timeout < 0:
            raise ValueError(f"shutdown_timeout must be >= 0, got {self.shutdown_timeout}.")
        if not self.instance_id:
            # A unique name per engine (profiles, traces); the user's choice is kept.
            self.instance_id = f"{time.time_ns()}"
        if self.performance_mode != "balanced":
            logger.info("Performance mode set to %r.", self.performance_mode)
        self._check_supported()

        with self._step("rule", "try_verify_and_update_config", "model-specific config hook"):
            self.try_verify_and_update_config()
        self._verify_with_model()
        if self.quant_config is None and self.model_config is not None:
            with self._step("rule", "quant_config", "derived from model_config.quantization"):
                self.quant_config = self._get_quantization_config(
                    self.model_config, self.load_config
                )
        with self._step("rule", "async_scheduling", "async scheduling default"):
            rules.resolve_async_scheduling(self)
        with self._step("rule", "nccl_for_dp_sync", "follows async_scheduling"):
            rules.resolve_nccl_for_dp_sync(self)
        if (
            self.observability_config.per_request_spec_decode_metrics != "none"
            and self.speculative_config is None
        ):
            raise ValueError(
                "per_request_spec_decode_metrics needs speculative decoding, which is off; "
                "set it to 'none'."
            )
        rules.warn_turing_fp32(self)
        with self._step("rule", "enforce_eager", "enforce_eager turns compile and graphs off"):
            rules.apply_enforce_eager(self)
        with self._step("rule", "TORCH_COMPILE_DISABLE", "TORCH_COMPILE_DISABLE is set"):
            rules.apply_torch_compile_disable(self)
        with self._step("rule", "breakable_cudagraph", "breakable CUDA graphs need no compile"):
            breakable = rules.breakable_cudagraph_enabled(self)
        rules.warn_inductor_disabled(self, breakable)
        with self._step("rule", "blocked_weights_quant_fp8", "block-quantized weights"):
            # The CUDA fp8 quant kernel beats the native one for block-wise scales.
            if self.quant_config is not None and self.quant_config.has_blocked_weights():
                if "-quant_fp8" not in self.compilation_config.custom_ops:
                    self.compilation_config.custom_ops.append("+quant_fp8")
        with self._step("platform", "apply_config_platform_defaults", self._platform_why()):
            current_platform.apply_config_platform_defaults(self)
        level = f"-O{int(self.optimization_level)}"
        with self._step("rule", "default_compilation_mode", f"default mode at {level}"):
            rules.default_compilation_mode(self)
        with self._step("rule", "ir_enable_torch_wrap", "on only for VLLM_COMPILE + inductor"):
            rules.default_ir_torch_wrap(self)
        with self._step("rule", "default_custom_ops", "base custom-op mode for this backend"):
            rules.default_custom_ops(self)
        # Op priorities: after mode and backend are known, before the fusion predicates.
        with self._step("platform", "kernel_config.set_platform_defaults", "kernel defaults"):
            self.kernel_config.set_platform_defaults(self)
        with self._step("level", "_apply_optimization_level_defaults", f"default of {level}"):
            self._apply_optimization_level_defaults(
                OPTIMIZATION_LEVEL_TO_CONFIG[self.optimization_level]
            )
        assert self.kernel_config.enable_flashinfer_autotune is not None, "every level sets it"
        with self._step("rule", "_normalize_piecewise_cudagraph_mode", self._piecewise_why()):
            self._normalize_piecewise_cudagraph_mode(breakable_cudagraph_enabled=breakable)
        with self._step("rule", "fast_moe_cold_start", "superseded on torch >= 2.11"):
            rules.resolve_fast_moe_cold_start(self)
        self._resolve_attention_backend()
        self._resolve_static_graphs()
        self._warn_unused_settings()
        with self._step("platform", "check_and_update_config", self._platform_why()):
            current_platform.check_and_update_config(self)
        with self._step("rule", "_normalize_piecewise_cudagraph_mode", self._piecewise_why()):
            self._normalize_piecewise_cudagraph_mode(breakable_cudagraph_enabled=breakable)
        rules.validate_model_runner(self)
        with self._step("rule", "_set_compile_ranges", "compile ranges end at the token budget"):
            self._set_compile_ranges()
        with self._step("rule", "set_splitting_ops_for_v1", "graph split points for this mode"):
            self.compilation_config.set_splitting_ops_for_v1(
                all2all_backend=getattr(self.parallel_config, "all2all_backend", "allgather"),
                # Data parallelism only couples the ranks' graphs for MoE models.
                data_parallel_size=self._effective_dp_size(),
            )
        backend = self.attention_config.backend
        assert backend is not None, "_resolve_attention_backend chose one"
        why = rules.attention_cudagraph_why(backend)
        with self._step("rule", "resolve_cudagraph_mode_and_sizes", why):
            rules.apply_attention_cudagraph_support(self)
        rules.check_final_cudagraph_mode(self, breakable)
        with self._step("rule", "hybrid_kv_cache_manager", self._hma_why()):
            rules.resolve_hybrid_kv_cache_manager(self)
        with self._step("rule", "debug_dump_path", "made absolute"):
            rules.absolutize_debug_dump_path(self)
        self.compilation_config.pass_config.log_enabled_passes()
        self.validate_block_size()

    def _check_supported(self) -> None:
        """Every sub-config re-checks that minivllm can honour it; the sub-configs of
        subsystems minivllm lacks (LoRA, speculative decoding, KV transfer, ...) raise
        `ValueError` here when set."""
        for f in dataclasses.fields(self):
            check = getattr(getattr(self, f.name), "check_supported", None)
            if callable(check):
                check()

    def _step(self, source: Source, rule: str, why: str) -> AbstractContextManager[None]:
        return self._provenance.step(source, rule, _reason(why))

    def _platform_why(self) -> str:
        return f"{current_platform!r} platform rule"

    def _piecewise_why(self) -> str:
        mode = self.compilation_config.mode
        name = mode.name if isinstance(mode, CompilationMode) else mode
        return f"piecewise CUDA graphs need VLLM_COMPILE, mode is {name}"

    def _hma_why(self) -> str:
        if not current_platform.support_hybrid_kv_cache():
            return f"{current_platform!r} has no hybrid KV cache support"
        return "hybrid KV cache manager default"

    def _resolve_attention_backend(self) -> None:
        """Check the user's attention backend, or record the one the platform runs."""
        attention = self.attention_config
        device_type = self.device_config.device_type
        if attention.backend is not None:
            current_platform.check_attention_backend(attention.backend, device_type)
            return
        choice = current_platform.choose_attention_backend(device_type)
        with self._step("platform", "choose_attention_backend", choice.reason):
            attention.backend = choice.name

    def _resolve_static_graphs(self) -> None:
        if not current_platform.support_static_graph_mode():
            why = f"{current_platform!r} has no CUDA graphs (no static graph mode)"
            with self._step("platform", "support_static_graph_mode", why):
                rules.disable_static_graphs(self)
            return
        device_type = self.device_config.device_type
        if device_type != "cuda":
            why = f"the device is {device_type}, and CUDA graphs need a CUDA device"
            with self._step("rule", "device_type", why):
                rules.disable_static_graphs(self)
            return
        with self._step("rule", "cudagraph_mode_for_model", "unsupported by this kind of model"):
            rules.adjust_cudagraph_mode_for_model(self)
        eager = self.model_config is not None and self.model_config.enforce_eager
        why = (
            "enforce_eager turns CUDA graphs off"
            if eager
            else "graphs are captured, so each size gets one warm-up run first"
        )
        with self._step("rule", "enforce_eager_cudagraphs", why):
            rules.apply_eager_cudagraphs(self)
        with self._step("rule", "_set_cudagraph_sizes", self._sizes_why()):
            self._set_cudagraph_sizes()

    def _sizes_why(self) -> str:
        sched = self.scheduler_config
        return (
            f"capture grid for max_num_seqs={sched.max_num_seqs}, "
            f"max_num_batched_tokens={sched.max_num_batched_tokens}, "
            f"performance_mode={self.performance_mode}, "
            f"ceiling {current_platform.default_max_cudagraph_capture_size()}"
        )

    def _verify_with_model(self) -> None:
        # Models may have supplied their own context-parallel defaults; fill the rest.
        with self._step("rule", "set_dcp_defaults", "context-parallel defaults"):
            self.parallel_config.set_dcp_defaults()
        model = self.model_config
        if model is None:
            return
        model.verify_with_parallel_config(self.parallel_config)
        with self._step("rule", "is_moe_model", "copied from the model"):
            self.parallel_config.is_moe_model = model.is_moe

    def _warn_unused_settings(self) -> None:
        if getattr(self.cache_config, "kv_sharing_fast_prefill", False):
            logger.warning(
                "kv_sharing_fast_prefill needs model-side support to be correct and to save "
                "prefill work."
            )

    def _effective_dp_size(self) -> int:
        model = self.model_config
        if model is None or getattr(model, "is_moe", False):
            return getattr(self.parallel_config, "data_parallel_size", 1)
        return 1

    def _resolve_user_paths(self, user_set_paths: frozenset[str] | None) -> set[str]:
        """The explicit paths (validated), or those inferred from class defaults."""
        names = {f.name for f in dataclasses.fields(self)}
        if user_set_paths is not None:
            unknown = sorted(p for p in user_set_paths if p.split(".", 1)[0] not in names)
            if unknown:
                raise ValueError(
                    f"user_set_paths {unknown} do not name VllmConfig fields; use dotted "
                    "paths such as 'scheduler_config.max_num_seqs'."
                )
            return set(user_set_paths)
        return self._infer_user_paths()

    def _infer_user_paths(self) -> set[str]:
        paths: set[str] = set()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "model_config":
                if value is not None:
                    paths.add("model_config.model")
                continue
            if f.default_factory is not dataclasses.MISSING:
                try:
                    default = f.default_factory()
                except (ValueError, TypeError):  # needs input to build: no default to compare
                    continue
            else:
                default = f.default
            now, then = flatten(value, f.name), flatten(default, f.name)
            paths.update(p for p, v in now.items() if p not in then or then[p] != v)
        return paths

    # -- seed methods ---------------------------------------------------------------
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
        interleave = getattr(parallel, "cp_kv_cache_interleave_size", 1)
        if block_size is not None and getattr(parallel, "decode_context_parallel_size", 1) > 1:
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
    "get_current_vllm_config",
    "get_layers_from_vllm_config",
    "iter_user_paths",
    "set_current_vllm_config",
]
