"""The resolution of a `VllmConfig`, in order, top to bottom.

`VllmConfig.__post_init__` calls `resolve`: it fills what the user left unset and
reconciles the sub-configs with each other and with the platform, in the order of
vLLM's `VllmConfig.__post_init__`: the model hooks and quantization, async
scheduling, enforce_eager and TORCH_COMPILE_DISABLE, platform defaults, the default
compilation mode and custom ops, op priorities, the optimization-level defaults, the
attention backend, static-graph support and CUDA graph capture sizes, the platform's
own checks, compile ranges, splitting ops, the CUDA graph mode the attention backend
supports, the connector ``kv_offloading_size`` stands for, and the hybrid KV cache
manager.  This docstring and `resolve` are the one
statement of that order.  Every step runs inside ``_step(prov, source, rule, why)``, which records
the fields it changed, so ``explain()`` tells who set each value and why.  The
individual rules live in `minivllm.config.vllm_rules`; this module is the order.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from minivllm.config import vllm_rules as rules
from minivllm.config.compilation.modes import CompilationMode
from minivllm.config.optimization import OPTIMIZATION_LEVEL_TO_CONFIG
from minivllm.config.pooler import apply_pooling_rules
from minivllm.config.provenance import Provenance, Source, flatten
from minivllm.config.reasoning import resolve_reasoning
from minivllm.logger import init_logger
from minivllm.platforms import current_platform

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


def resolve(cfg: VllmConfig, user_set_paths: frozenset[str] | None = None) -> Provenance:
    """Resolve ``cfg`` in place, phase by phase in the order of vLLM's
    `VllmConfig.__post_init__`; returns the provenance of every field (who set it,
    which rule changed it and why)."""
    prov = Provenance(cfg)
    prov.mark_user(_resolve_user_paths(cfg, user_set_paths))
    _check_root_fields(cfg)
    _check_supported(cfg)
    resolve_reasoning(cfg)
    _resolve_model(cfg, prov)
    _resolve_scheduling(cfg, prov)
    breakable = _resolve_compile_switches(cfg, prov)
    _resolve_level_defaults(cfg, prov, breakable)
    _resolve_graphs(cfg, prov, breakable)
    _resolve_cache_manager(cfg, prov)
    return prov


def _check_root_fields(cfg: VllmConfig) -> None:
    """The root's own fields: a shutdown timeout that makes sense, an instance id."""
    if cfg.shutdown_timeout < 0:
        raise ValueError(f"shutdown_timeout must be >= 0, got {cfg.shutdown_timeout}.")
    if not cfg.instance_id:
        # A unique name per engine (profiles, traces); the user's choice is kept.
        cfg.instance_id = f"{time.time_ns()}"
    if cfg.performance_mode != "balanced":
        logger.info("Performance mode set to %r.", cfg.performance_mode)


def _resolve_model(cfg: VllmConfig, prov: Provenance) -> None:
    """The model's own hook, the checks against the model, its quantization config."""
    with _step(prov, "rule", "try_verify_and_update_config", "model-specific config hook"):
        cfg.try_verify_and_update_config()
    _verify_with_model(cfg, prov)
    _verify_lora(cfg, prov)
    _check_data_parallel_features(cfg)
    _gguf_with_parallelism(cfg, prov)
    with _step(prov, "rule", "pooling_model", "pooling models: prompts whole, prefix cache"):
        by_user = prov.origin_of("cache_config.enable_prefix_caching").source == "user"
        apply_pooling_rules(cfg, by_user)
    if cfg.quant_config is None and cfg.model_config is not None:
        with _step(prov, "rule", "quant_config", "derived from model_config.quantization"):
            cfg.quant_config = cfg._get_quantization_config(cfg.model_config, cfg.load_config)


def _resolve_scheduling(cfg: VllmConfig, prov: Provenance) -> None:
    """Async scheduling, and the features that cannot run with the parallelism asked."""
    with _step(prov, "rule", "async_scheduling", "async scheduling default"):
        rules.resolve_async_scheduling(cfg)
    with _step(prov, "rule", "nccl_for_dp_sync", "follows async_scheduling"):
        rules.resolve_nccl_for_dp_sync(cfg)
    if (
        cfg.observability_config.per_request_spec_decode_metrics != "none"
        and cfg.speculative_config is None
    ):
        raise ValueError(
            "per_request_spec_decode_metrics needs speculative decoding, which is off; "
            "set it to 'none'."
        )
    parallel_config = cfg.parallel_config
    model_config = cfg.model_config
    if model_config is not None and model_config.quantization == "int8_per_channel":
        _check_int8_per_channel(cfg)
    if cfg.speculative_config is not None and parallel_config.world_size > 1:
        # The verification path keeps sampled tokens on the output rank only.
        raise ValueError(
            "speculative decoding is not supported by minivllm yet with tensor or pipeline "
            f"parallelism (tensor_parallel_size={parallel_config.tensor_parallel_size}, "
            f"pipeline_parallel_size={parallel_config.pipeline_parallel_size}); drop "
            "--speculative-config or run on one process."
        )


def _resolve_compile_switches(cfg: VllmConfig, prov: Provenance) -> bool:
    """What turns compilation off (enforce_eager, TORCH_COMPILE_DISABLE) and the custom
    ops quantized weights need; returns whether breakable CUDA graphs are on."""
    rules.warn_turing_fp32(cfg)
    with _step(prov, "rule", "enforce_eager", "enforce_eager turns compile and graphs off"):
        rules.apply_enforce_eager(cfg)
    with _step(prov, "rule", "TORCH_COMPILE_DISABLE", "TORCH_COMPILE_DISABLE is set"):
        rules.apply_torch_compile_disable(cfg)
    with _step(prov, "rule", "breakable_cudagraph", "breakable CUDA graphs need no compile"):
        breakable = rules.breakable_cudagraph_enabled(cfg)
    rules.warn_inductor_disabled(cfg, breakable)
    with _step(prov, "rule", "blocked_weights_quant_fp8", "block-quantized weights"):
        # The CUDA fp8 quant kernel beats the native one for block-wise scales.
        if cfg.quant_config is not None and cfg.quant_config.has_blocked_weights():
            if "-quant_fp8" not in cfg.compilation_config.custom_ops:
                cfg.compilation_config.custom_ops.append("+quant_fp8")
    return breakable


def _resolve_level_defaults(cfg: VllmConfig, prov: Provenance, breakable: bool) -> None:
    """Platform defaults, the compilation mode, custom ops and op priorities, then the
    optimization level's defaults (its fusion predicates read all of those)."""
    with _step(prov, "platform", "apply_config_platform_defaults", _platform_why()):
        current_platform.apply_config_platform_defaults(cfg)
    level = f"-O{int(cfg.optimization_level)}"
    with _step(prov, "rule", "default_compilation_mode", f"default mode at {level}"):
        rules.default_compilation_mode(cfg)
    with _step(prov, "rule", "ir_enable_torch_wrap", "on only for VLLM_COMPILE + inductor"):
        rules.default_ir_torch_wrap(cfg)
    with _step(prov, "rule", "default_custom_ops", "base custom-op mode for this backend"):
        rules.default_custom_ops(cfg)
    # Op priorities: after mode and backend are known, before the fusion predicates.
    with _step(prov, "platform", "kernel_config.set_platform_defaults", "kernel defaults"):
        cfg.kernel_config.set_platform_defaults(cfg)
    with _step(prov, "level", "_apply_optimization_level_defaults", f"default of {level}"):
        cfg._apply_optimization_level_defaults(OPTIMIZATION_LEVEL_TO_CONFIG[cfg.optimization_level])
    assert cfg.kernel_config.enable_flashinfer_autotune is not None, "every level sets it"
    with _step(prov, "rule", "_normalize_piecewise_cudagraph_mode", _piecewise_why(cfg)):
        cfg._normalize_piecewise_cudagraph_mode(breakable_cudagraph_enabled=breakable)
    with _step(prov, "rule", "fast_moe_cold_start", "superseded on torch >= 2.11"):
        rules.resolve_fast_moe_cold_start(cfg)


def _resolve_graphs(cfg: VllmConfig, prov: Provenance, breakable: bool) -> None:
    """The attention backend, what graphs the platform and the backend can capture,
    capture sizes, compile ranges and the split points of the compiled graph."""
    _resolve_attention_backend(cfg, prov)
    _resolve_static_graphs(cfg, prov)
    _warn_unused_settings(cfg)
    with _step(prov, "platform", "check_and_update_config", _platform_why()):
        current_platform.check_and_update_config(cfg)
    with _step(prov, "rule", "_normalize_piecewise_cudagraph_mode", _piecewise_why(cfg)):
        cfg._normalize_piecewise_cudagraph_mode(breakable_cudagraph_enabled=breakable)
    rules.validate_model_runner(cfg)
    with _step(prov, "rule", "_set_compile_ranges", "compile ranges end at the token budget"):
        cfg._set_compile_ranges()
    with _step(prov, "rule", "set_splitting_ops_for_v1", "graph split points for this mode"):
        cfg.compilation_config.set_splitting_ops_for_v1(
            all2all_backend=cfg.parallel_config.all2all_backend,
            # Data parallelism only couples the ranks' graphs for MoE models.
            data_parallel_size=_effective_dp_size(cfg),
        )
    backend = cfg.attention_config.backend
    assert backend is not None, "_resolve_attention_backend chose one"
    why = rules.attention_cudagraph_why(backend)
    with _step(prov, "rule", "resolve_cudagraph_mode_and_sizes", why):
        rules.apply_attention_cudagraph_support(cfg)
    rules.check_final_cudagraph_mode(cfg, breakable)


def _resolve_cache_manager(cfg: VllmConfig, prov: Provenance) -> None:
    """The hybrid KV cache manager, then the last checks and the enabled passes' log."""
    with _step(prov, "rule", "_post_init_kv_transfer_config", "kv_offloading_size is set"):
        rules.post_init_kv_transfer_config(cfg)
    rules.check_kv_connector(cfg)
    with _step(prov, "rule", "hybrid_kv_cache_manager", _hma_why()):
        rules.resolve_hybrid_kv_cache_manager(cfg)
    with _step(prov, "rule", "debug_dump_path", "made absolute"):
        rules.absolutize_debug_dump_path(cfg)
    cfg.compilation_config.pass_config.log_enabled_passes()
    cfg.validate_block_size()


def _verify_lora(cfg: VllmConfig, prov: Provenance) -> None:
    """LoRA: the adapter dtype from the model's; tensor parallelism yes, pipeline
    parallelism not yet."""
    lora = cfg.lora_config
    if lora is None:
        return
    with _step(prov, "rule", "lora_dtype", "LoRA dtype 'auto' follows the model dtype"):
        lora.verify_with_model_config(cfg.model_config)
    parallel_config = cfg.parallel_config
    if parallel_config.pipeline_parallel_size > 1:
        raise ValueError(
            "LoRA is not supported by minivllm yet with pipeline parallelism "
            f"(pipeline_parallel_size={parallel_config.pipeline_parallel_size}); drop "
            "--enable-lora or use --tensor-parallel-size alone."
        )
    lora.verify_with_parallel_config(parallel_config.tensor_parallel_size)


def _check_data_parallel_features(cfg: VllmConfig) -> None:
    """The replicas of internal data parallelism run generation only, for now: the
    features whose engine calls or per-rank endpoints the front end does not route
    yet are refused with the reason."""
    parallel = cfg.parallel_config
    if not parallel.internal_data_parallel:
        return
    used = []
    if cfg.lora_config is not None:
        used.append("LoRA (--enable-lora)")
    if cfg.model_config is not None and cfg.model_config.runner_type == "pooling":
        used.append("pooling models (--runner pooling)")
    if cfg.kv_transfer_config is not None and cfg.kv_transfer_config.kv_connector is not None:
        used.append(f"the KV connector {cfg.kv_transfer_config.kv_connector}")
    events = cfg.kv_events_config
    if events is not None and events.enable_kv_cache_events:
        used.append("KV cache events (one endpoint per replica is not set up)")
    if used:
        raise ValueError(
            f"data_parallel_size={parallel.data_parallel_size} is not supported by minivllm "
            f"yet with {', '.join(used)}; run one replica per server instead "
            "(--data-parallel-rank, external load balancing) or drop --data-parallel-size."
        )


def _check_supported(cfg: VllmConfig) -> None:
    """Every sub-config re-checks that minivllm can honour it; the sub-configs of
    subsystems minivllm lacks (LoRA, speculative decoding, KV transfer, ...) raise
    `ValueError` here when set."""
    for f in dataclasses.fields(cfg):
        # Optional sub-configs may be None, and not every config class has the check.
        check = getattr(getattr(cfg, f.name), "check_supported", None)
        if callable(check):
            check()


def _check_int8_per_channel(cfg: VllmConfig) -> None:
    """int8_per_channel runs on torch's CPU int8 kernels, in one process."""
    device = cfg.device_config.device_type
    if device != "cpu":
        raise ValueError(
            f"quantization='int8_per_channel' runs on CPU only (its int8 kernels are "
            f"torch's CPU ones), not on {device!r}; drop --quantization or use --device cpu."
        )
    parallel_config = cfg.parallel_config
    if parallel_config.world_size > 1:
        raise ValueError(
            "quantization='int8_per_channel' is not supported by minivllm yet with tensor "
            f"or pipeline parallelism (tensor_parallel_size={parallel_config.tensor_parallel_size}, "
            f"pipeline_parallel_size={parallel_config.pipeline_parallel_size}); drop --quantization or "
            "run on one process."
        )


def _step(prov: Provenance, source: Source, rule: str, why: str) -> AbstractContextManager[None]:
    return prov.step(source, rule, _reason(why))


def _platform_why() -> str:
    return f"{current_platform!r} platform rule"


def _piecewise_why(cfg: VllmConfig) -> str:
    mode = cfg.compilation_config.mode
    name = mode.name if isinstance(mode, CompilationMode) else mode
    return f"piecewise CUDA graphs need VLLM_COMPILE, mode is {name}"


def _hma_why() -> str:
    if not current_platform.support_hybrid_kv_cache():
        return f"{current_platform!r} has no hybrid KV cache support"
    return "hybrid KV cache manager default"


def _resolve_attention_backend(cfg: VllmConfig, prov: Provenance) -> None:
    """Check the user's attention backend, or record the one the platform runs."""
    attention = cfg.attention_config
    device_type = cfg.device_config.device_type
    if attention.backend is not None:
        current_platform.check_attention_backend(attention.backend, device_type)
        return
    choice = current_platform.choose_attention_backend(device_type)
    with _step(prov, "platform", "choose_attention_backend", choice.reason):
        attention.backend = choice.name


def _resolve_static_graphs(cfg: VllmConfig, prov: Provenance) -> None:
    if not current_platform.support_static_graph_mode():
        why = f"{current_platform!r} has no CUDA graphs (no static graph mode)"
        with _step(prov, "platform", "support_static_graph_mode", why):
            rules.disable_static_graphs(cfg)
        return
    device_type = cfg.device_config.device_type
    if device_type != "cuda":
        why = f"the device is {device_type}, and CUDA graphs need a CUDA device"
        with _step(prov, "rule", "device_type", why):
            rules.disable_static_graphs(cfg)
        return
    with _step(prov, "rule", "cudagraph_mode_for_model", "unsupported by this kind of model"):
        rules.adjust_cudagraph_mode_for_model(cfg)
    eager = cfg.model_config is not None and cfg.model_config.enforce_eager
    why = (
        "enforce_eager turns CUDA graphs off"
        if eager
        else "graphs are captured, so each size gets one warm-up run first"
    )
    with _step(prov, "rule", "enforce_eager_cudagraphs", why):
        rules.apply_eager_cudagraphs(cfg)
    with _step(prov, "rule", "_set_cudagraph_sizes", _sizes_why(cfg)):
        cfg._set_cudagraph_sizes()


def _sizes_why(cfg: VllmConfig) -> str:
    sched = cfg.scheduler_config
    return (
        f"capture grid for max_num_seqs={sched.max_num_seqs}, "
        f"max_num_batched_tokens={sched.max_num_batched_tokens}, "
        f"performance_mode={cfg.performance_mode}, "
        f"ceiling {current_platform.default_max_cudagraph_capture_size()}"
    )


def _verify_with_model(cfg: VllmConfig, prov: Provenance) -> None:
    # Models may have supplied their own context-parallel defaults; fill the rest.
    with _step(prov, "rule", "set_dcp_defaults", "context-parallel defaults"):
        cfg.parallel_config.set_dcp_defaults()
    model = cfg.model_config
    if model is None:
        return
    model.verify_with_parallel_config(cfg.parallel_config)
    with _step(prov, "rule", "is_moe_model", "copied from the model"):
        cfg.parallel_config.is_moe_model = model.is_moe
    with _step(prov, "rule", "sliding_window", "copied from the model"):
        cfg.cache_config.sliding_window = model.get_sliding_window()
    window = cfg.cache_config.sliding_window
    if cfg.speculative_config is not None and window is not None:
        # Sliding-window layers free blocks that the draft path would still read.
        raise ValueError(
            "speculative decoding is not supported by minivllm yet on a model with "
            f"sliding-window attention (window {window}); drop --speculative-config, or "
            "set disable_sliding_window=True to run every layer with full attention."
        )


def _warn_unused_settings(cfg: VllmConfig) -> None:
    if cfg.kv_events_config is not None:
        cfg.kv_events_config.warn_inert(cfg.cache_config.enable_prefix_caching)
    if cfg.cache_config.kv_sharing_fast_prefill:
        logger.warning(
            "kv_sharing_fast_prefill needs model-side support to be correct and to save "
            "prefill work."
        )


def _effective_dp_size(cfg: VllmConfig) -> int:
    model = cfg.model_config
    if model is None or model.is_moe:
        return cfg.parallel_config.data_parallel_size
    return 1


def _gguf_with_parallelism(cfg: VllmConfig, prov: Provenance) -> None:
    """The low-bit GGUF path runs on one process: under TP/PP the default "gguf"
    becomes dequantized weights, an explicit one is refused."""
    model_config, parallel_config = cfg.model_config, cfg.parallel_config
    if (
        model_config is None
        or model_config.quantization != "gguf"
        or parallel_config.world_size == 1
    ):
        return
    why = (
        f"tensor_parallel_size={parallel_config.tensor_parallel_size}, "
        f"pipeline_parallel_size={parallel_config.pipeline_parallel_size}"
    )
    with _step(prov, "rule", "gguf_with_parallelism", f"low-bit GGUF runs on one rank ({why})"):
        if model_config.dequantize_default_gguf(why):
            return
    raise ValueError(
        "quantization='gguf' (low-bit weights) is not supported by minivllm yet with "
        f"tensor or pipeline parallelism ({why}); use --quantization none to dequantize "
        "the file, or run on one process."
    )


def _resolve_user_paths(cfg: VllmConfig, user_set_paths: frozenset[str] | None) -> set[str]:
    """The explicit paths (validated), or those inferred from class defaults."""
    names = {f.name for f in dataclasses.fields(cfg)}
    if user_set_paths is not None:
        unknown = sorted(p for p in user_set_paths if p.split(".", 1)[0] not in names)
        if unknown:
            raise ValueError(
                f"user_set_paths {unknown} do not name VllmConfig fields; use dotted "
                "paths such as 'scheduler_config.max_num_seqs'."
            )
        return set(user_set_paths)
    return _infer_user_paths(cfg)


def _infer_user_paths(cfg: VllmConfig) -> set[str]:
    paths: set[str] = set()
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
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


__all__ = ["resolve"]
