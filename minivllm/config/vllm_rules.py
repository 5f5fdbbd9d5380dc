"""The named resolution rules that `VllmConfig.__post_init__` applies, in order.

Each rule reads and updates one `VllmConfig` in place; `minivllm.config.resolution`
runs each inside a provenance step so ``--explain`` can say which rule set a field,
and states their order (that of vLLM's ``VllmConfig.__post_init__``).

Rules of vLLM's ``VllmConfig.__post_init__`` that are NOT here, because they need a subsystem minivllm does
not have and the config that would switch it on cannot be set (its sub-config's
``check_supported`` raises `ValueError`, which `VllmConfig` calls first):

- speculative decoding: dynamic-SD cudagraph override and DP fallback,
  ``_set_max_num_scheduled_tokens``, async scheduling per SD method, cascade
  attention off with async SD, EAGLE with fast prefill or chunked local
  attention, DFlash/DSpark runner checks, adaptive verification;
- NIXL / EC transfer: NIXL DCP asserts, connector-requires-PIECEWISE (minivllm's
  connectors move KV outside the forward pass); the KV-events warnings are
  `KVEventsConfig.warn_inert`, called with the unused-settings warnings;
- DBO / micro-batching, DeepEP and MoonEP all2all backends, EPLB (MoE);
- multimodal encoders: encoder-only instances, mm processor / video devices,
  encoder CUDA graphs, ``language_model_only``, ``torch_shm``;
- Mamba / ReplaySSM / RecoverSSM, engram, HiSparse, diffusion scheduler,
  watermarking, reasoning token ids, aux outputs;
- Model Runner V2 (its stock-torch.compile graph rule and unsupported list),
  sampling and trace replay (V2 only), the Proton profiler checks;
- breakable CUDA graphs auto-enabled per architecture or for batch invariance
  (an explicit ``use_breakable_cudagraph=True`` is still honoured), DeepGEMM,
  VLLM_BATCH_INVARIANT, NCCL graph registration for the cuMem pool, Whisper,
  weight untying for sharded loads, and the per-architecture hooks of
  MODELS_CONFIG_MAP (minivllm's models need none).

Rules reading pipeline / data / context parallel sizes are kept although
`ParallelConfig` currently refuses sizes above 1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from minivllm import envs
from minivllm.config.attention import ATTENTION_CG_SUPPORT
from minivllm.config.attention_support import AttentionCGSupport
from minivllm.config.compilation.modes import CompilationMode, CUDAGraphMode
from minivllm.config.optimization import OptimizationLevel
from minivllm.logger import init_logger
from minivllm.platforms import current_platform

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


def resolve_async_scheduling(cfg: VllmConfig) -> None:
    """Default ``async_scheduling`` on unless something cannot overlap; reject an
    explicit True that cannot work."""
    sched = cfg.scheduler_config
    backend = cfg.parallel_config.distributed_executor_backend
    executor_ok = current_platform.supports_async_scheduling(backend)
    if sched.async_scheduling:
        if not executor_ok:
            raise ValueError(
                f"the {backend!r} executor does not support async scheduling; "
                "use --no-async-scheduling or another --distributed-executor-backend."
            )
        return
    if sched.async_scheduling is not None:
        return
    model = cfg.model_config
    if model is not None and model.runner_type == "pooling":
        # Overlap only helps decode loops; pooling requests finish in one step.
        sched.async_scheduling = False
    elif not executor_ok:
        logger.warning("Async scheduling is off: the %r executor does not support it.", backend)
        sched.async_scheduling = False
    elif cfg.parallel_config.pipeline_parallel_size > 1 and not cfg.use_v2_model_runner:
        logger.warning("Async scheduling is off: it does not combine with pipeline parallelism.")
        sched.async_scheduling = False
    else:
        sched.async_scheduling = True


def resolve_nccl_for_dp_sync(cfg: VllmConfig) -> None:
    """With async scheduling, DP ranks synchronise over a CPU group instead of NCCL."""
    parallel = cfg.parallel_config
    if parallel.disable_nccl_for_dp_synchronization is None:
        parallel.disable_nccl_for_dp_synchronization = bool(cfg.scheduler_config.async_scheduling)


def apply_enforce_eager(cfg: VllmConfig) -> None:
    """``enforce_eager``: no torch.compile, no CUDA graphs, no JIT kernel warm-up."""
    model = cfg.model_config
    if model is None or not model.enforce_eager:
        return
    cfg.compilation_config.mode = CompilationMode.NONE
    cfg.compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    kernel = cfg.kernel_config
    # Fault tolerance keeps the warm-up: JIT compiles mid-inference would delay
    # the detection of failed peers past its deadline.
    if not cfg.parallel_config.enable_fault_tolerance:
        kernel.enable_jit_warmup = False
    logger.warning(
        "enforce_eager is set: torch.compile and CUDA graphs are off "
        "(the same as -cc.mode=none -cc.cudagraph_mode=none)."
    )


def apply_torch_compile_disable(cfg: VllmConfig) -> None:
    """``TORCH_COMPILE_DISABLE=1`` turns compilation off, as PyTorch itself would."""
    if envs.torch_compile_disable():
        logger.warning("TORCH_COMPILE_DISABLE is set: compilation mode set to NONE.")
        cfg.compilation_config.mode = CompilationMode.NONE


def breakable_cudagraph_enabled(cfg: VllmConfig) -> bool:
    """Breakable CUDA graphs replace compilation: their mode is NONE."""
    enabled = cfg.compilation_config.use_breakable_cudagraph is True
    if enabled:
        cfg.compilation_config.mode = CompilationMode.NONE
    return enabled


def default_compilation_mode(cfg: VllmConfig) -> None:
    """An unset mode is VLLM_COMPILE above -O0 and NONE at -O0."""
    compilation_config = cfg.compilation_config
    if compilation_config.mode is None:
        above_o0 = cfg.optimization_level > OptimizationLevel.O0
        compilation_config.mode = CompilationMode.VLLM_COMPILE if above_o0 else CompilationMode.NONE


def default_ir_torch_wrap(cfg: VllmConfig) -> None:
    """Torch wrapping of IR ops is only needed for the custom Inductor lowering."""
    compilation_config = cfg.compilation_config
    if compilation_config.ir_enable_torch_wrap is None:
        compilation_config.ir_enable_torch_wrap = (
            compilation_config.mode == CompilationMode.VLLM_COMPILE
            and compilation_config.backend == "inductor"
        )


def default_custom_ops(cfg: VllmConfig) -> None:
    """With Inductor compiling, plain torch ops fuse better than custom kernels, so the
    base mode is 'none'; otherwise 'all' custom kernels are used."""
    compilation_config = cfg.compilation_config
    if "all" in compilation_config.custom_ops or "none" in compilation_config.custom_ops:
        return
    inductor = (
        compilation_config.backend == "inductor" and compilation_config.mode != CompilationMode.NONE
    )
    compilation_config.custom_ops.append("none" if inductor else "all")


def warn_inductor_disabled(cfg: VllmConfig, breakable: bool) -> None:
    compilation_config = cfg.compilation_config
    if not breakable and (
        compilation_config.backend == "eager"
        or (
            compilation_config.mode is not None
            and compilation_config.mode != CompilationMode.VLLM_COMPILE
        )
    ):
        logger.info("Inductor compilation is off: Inductor-only optimizations are ignored.")


def normalize_piecewise_cudagraph_mode(cfg: VllmConfig, breakable: bool) -> None:
    """Piecewise graphs need VLLM_COMPILE's split graph; otherwise drop the piecewise part
    (FULL_AND_PIECEWISE -> FULL_DECODE_ONLY, PIECEWISE -> NONE)."""
    compilation_config = cfg.compilation_config
    if (
        compilation_config.cudagraph_mode.requires_piecewise_compilation()
        and compilation_config.mode != CompilationMode.VLLM_COMPILE
        and not breakable
    ):
        fallback = compilation_config.cudagraph_mode.without_piecewise()
        logger.info(
            "cudagraph_mode %s needs compilation mode VLLM_COMPILE, not %s; using %s.",
            compilation_config.cudagraph_mode,
            compilation_config.mode.name,
            fallback,
        )
        compilation_config.cudagraph_mode = fallback
        if fallback == CUDAGraphMode.NONE:
            compilation_config.max_cudagraph_capture_size = 0
            compilation_config.cudagraph_capture_sizes = []


def resolve_fast_moe_cold_start(cfg: VllmConfig) -> None:
    """torch >= 2.11 hoists opaque objects, which supersedes fast MoE cold start."""
    compilation_config = cfg.compilation_config
    if _torch_at_least(2, 11):
        compilation_config.fast_moe_cold_start = False
    elif compilation_config.fast_moe_cold_start is None:
        # Unsafe when a draft model has MoE layers; no drafts exist in minivllm.
        compilation_config.fast_moe_cold_start = cfg.speculative_config is None


def _torch_at_least(major: int, minor: int) -> bool:
    import torch

    parts = torch.__version__.split("+")[0].split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (IndexError, ValueError):
        return True


def adjust_cudagraph_mode_for_model(cfg: VllmConfig) -> None:
    """Pooling models cannot use full graphs; encoder-decoder models only full decode."""
    model = cfg.model_config
    compilation_config = cfg.compilation_config
    if model is None:
        return
    if compilation_config.cudagraph_mode.has_full_cudagraphs() and model.pooler_config:
        logger.warning("Pooling models do not support full CUDA graphs; using PIECEWISE.")
        compilation_config.cudagraph_mode = CUDAGraphMode.PIECEWISE
    elif model.is_encoder_decoder and compilation_config.cudagraph_mode not in (
        CUDAGraphMode.NONE,
        CUDAGraphMode.FULL_DECODE_ONLY,
    ):
        logger.info("Encoder-decoder models only support FULL_DECODE_ONLY CUDA graphs.")
        compilation_config.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY


def apply_eager_cudagraphs(cfg: VllmConfig) -> None:
    """Under enforce_eager no graph is captured; otherwise each graph warms up once."""
    compilation_config = cfg.compilation_config
    model = cfg.model_config
    if model is not None and model.enforce_eager:
        compilation_config.cudagraph_mode = CUDAGraphMode.NONE
        compilation_config.max_cudagraph_capture_size = 0
        compilation_config.cudagraph_capture_sizes = []
    else:
        compilation_config.cudagraph_num_of_warmups = 1


def disable_static_graphs(cfg: VllmConfig) -> None:
    """A platform without static graphs captures nothing."""
    compilation_config = cfg.compilation_config
    compilation_config.cudagraph_mode = CUDAGraphMode.NONE
    compilation_config.max_cudagraph_capture_size = 0
    compilation_config.cudagraph_capture_sizes = []
    compilation_config.post_init_cudagraph_sizes()


def attention_cudagraph_why(backend: str) -> str:
    """Why `apply_attention_cudagraph_support` changes the graph mode for ``backend``."""
    support = ATTENTION_CG_SUPPORT[backend]
    what = {
        AttentionCGSupport.NEVER: "no full graphs; piecewise ones at most",
        AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE: "full graphs of 1-token decodes only",
        AttentionCGSupport.UNIFORM_BATCH: "full graphs of uniform batches only",
        AttentionCGSupport.ALWAYS: "full graphs of any batch",
    }[support]
    return f"attention backend {backend} has CUDA graph support {support.name} ({what})"


def apply_attention_cudagraph_support(cfg: VllmConfig) -> None:
    """Downgrade ``cudagraph_mode`` to what the attention backend that will run can
    capture (`CompilationConfig.resolve_cudagraph_mode_and_sizes`; vLLM does it in the
    worker, minivllm before anything is built, so the resolved mode is what runs).
    A mode downgraded to NONE captures nothing, so its capture sizes go too."""
    compilation_config = cfg.compilation_config
    backend = cfg.attention_config.backend
    assert backend is not None, "resolve_attention_backend runs first"
    before = compilation_config.cudagraph_mode
    mode = compilation_config.resolve_cudagraph_mode_and_sizes(
        ATTENTION_CG_SUPPORT[backend],
        backend,
        uniform_decode_query_len=cfg.uniform_decode_query_len,
        use_v2_model_runner=cfg.use_v2_model_runner,
        max_num_reqs=cfg.scheduler_config.max_num_seqs,
    )
    if mode == CUDAGraphMode.NONE and before not in (None, CUDAGraphMode.NONE):
        compilation_config.max_cudagraph_capture_size = 0
        compilation_config.cudagraph_capture_sizes = []


def validate_model_runner(cfg: VllmConfig) -> None:
    """Features the (V1-style) model runner of minivllm cannot run."""
    parallel = cfg.parallel_config
    unsupported: list[str] = []
    if parallel.prefill_context_parallel_size > 1:
        unsupported.append("prefill context parallel")
    if parallel.pipeline_parallel_size > 1 and cfg.scheduler_config.async_scheduling:
        unsupported.append("pipeline parallelism with async scheduling")
    if parallel.enable_batch_sharded_sampling:
        unsupported.append("batch-sharded sampling")
    if unsupported:
        raise ValueError(
            f"the model runner does not support {', '.join(unsupported)}; turn "
            "these off (e.g. --no-async-scheduling with pipeline parallelism)."
        )


def check_final_cudagraph_mode(cfg: VllmConfig, breakable: bool) -> None:
    """Last consistency check of the graph mode on CUDA."""
    if not current_platform.is_cuda_alike():
        return
    compilation_config = cfg.compilation_config
    model = cfg.model_config
    if (
        compilation_config.cudagraph_mode.has_full_cudagraphs()
        and not compilation_config.cudagraph_mode.has_piecewise_cudagraphs()
        and model is not None
        and not model.disable_cascade_attn
    ):
        logger.warning(
            "No piecewise CUDA graph for cascade attention: batches that use it run eagerly."
        )
    assert not compilation_config.cudagraph_mode.requires_piecewise_compilation() or (
        compilation_config.mode == CompilationMode.VLLM_COMPILE or breakable
    ), f"piecewise cudagraph_mode {compilation_config.cudagraph_mode} left without VLLM_COMPILE"


def resolve_hybrid_kv_cache_manager(cfg: VllmConfig) -> None:
    """The hybrid KV cache manager is used unless the platform or the model rules it out;
    an explicit request for it that cannot be honoured is an error."""
    need_disable = not current_platform.support_hybrid_kv_cache()
    model = cfg.model_config
    if model is not None and model.attention_chunk_size is not None:
        # Chunked local attention regresses with the hybrid manager.
        logger.warning("Chunked local attention: the hybrid KV cache manager is turned off.")
        need_disable = True
    if cfg.kv_transfer_config is not None and cfg.kv_transfer_config.kv_connector is not None:
        # minivllm's connectors move one block table per request (no HMA support).
        need_disable = True
    sched = cfg.scheduler_config
    if sched.disable_hybrid_kv_cache_manager is None:
        sched.disable_hybrid_kv_cache_manager = need_disable
    elif sched.disable_hybrid_kv_cache_manager is False and need_disable:
        raise ValueError(
            "the hybrid KV cache manager was explicitly enabled but cannot be used here "
            f"(platform {current_platform!r}, or chunked local attention); drop "
            "--no-disable-hybrid-kv-cache-manager and let minivllm decide."
        )


def post_init_kv_transfer_config(cfg: VllmConfig) -> None:
    """``kv_offloading_size`` resolves into an OffloadingConnector ``KVTransferConfig``
    (the seeds' ``_post_init_kv_transfer_config``); "lmcache" is refused."""
    from minivllm.config.kv_transfer import KVTransferConfig, resolve_kv_offloading

    cache = cfg.cache_config
    if cache.kv_offloading_size is None:
        return
    extra = resolve_kv_offloading(cache.kv_offloading_size, cache.kv_offloading_backend)
    if cfg.kv_transfer_config is None:
        cfg.kv_transfer_config = KVTransferConfig()
    cfg.kv_transfer_config.kv_connector = "OffloadingConnector"
    cfg.kv_transfer_config.kv_connector_extra_config.update(extra)
    cfg.kv_transfer_config.kv_role = "kv_both"


def check_kv_connector(cfg: VllmConfig) -> None:
    """A connector runs on one process and needs the prompt's block hashes."""
    kv = cfg.kv_transfer_config
    if kv is None or kv.kv_connector is None:
        return
    parallel = cfg.parallel_config
    if parallel.world_size > 1:
        raise ValueError(
            f"KV connector {kv.kv_connector} is not supported by minivllm yet with tensor or "
            f"pipeline parallelism (tensor_parallel_size={parallel.tensor_parallel_size}, "
            f"pipeline_parallel_size={parallel.pipeline_parallel_size}); run on one process."
        )
    if cfg.speculative_config is not None:
        raise ValueError(
            f"KV connector {kv.kv_connector} is not supported by minivllm yet with "
            "speculative decoding; drop --speculative-config."
        )
    verify_kv_transfer_compat(cfg)


def verify_kv_transfer_compat(cfg: VllmConfig) -> None:
    """The seeds' ``_verify_kv_transfer_compat``: CUDA's expandable segments may remap
    the KV cache's pages under a connector that registered them."""
    kv = cfg.kv_transfer_config
    if kv is None or kv.kv_connector is None:
        return
    if "expandable_segments:True" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return
    if cfg.model_config is not None and cfg.model_config.enable_cumem_allocator:
        return
    raise ValueError(
        f"KV connector {kv.kv_connector} is incompatible with "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless enable_cumem_allocator is "
        "on: the allocator may remap the KV cache's memory under the connector. Unset "
        "expandable_segments:True or enable the cumem allocator."
    )


def absolutize_debug_dump_path(cfg: VllmConfig) -> None:
    compilation_config = cfg.compilation_config
    if compilation_config.debug_dump_path:
        compilation_config.debug_dump_path = Path(
            os.path.expanduser(compilation_config.debug_dump_path)
        ).absolute()


def warn_turing_fp32(cfg: VllmConfig) -> None:
    model = cfg.model_config
    if (
        model is not None
        and cfg.scheduler_config.enable_chunked_prefill
        and str(model.dtype).endswith("float32")
        and current_platform.get_device_capability() == (7, 5)
    ):
        logger.warning(
            "Turing tensor cores have no float32 matmul; chunked prefill kernels use "
            "'ieee' input precision."
        )


__all__ = [
    "absolutize_debug_dump_path",
    "adjust_cudagraph_mode_for_model",
    "apply_attention_cudagraph_support",
    "apply_eager_cudagraphs",
    "apply_enforce_eager",
    "apply_torch_compile_disable",
    "attention_cudagraph_why",
    "breakable_cudagraph_enabled",
    "check_final_cudagraph_mode",
    "default_compilation_mode",
    "default_custom_ops",
    "default_ir_torch_wrap",
    "disable_static_graphs",
    "normalize_piecewise_cudagraph_mode",
    "resolve_async_scheduling",
    "resolve_fast_moe_cold_start",
    "resolve_hybrid_kv_cache_manager",
    "resolve_nccl_for_dp_sync",
    "validate_model_runner",
    "warn_inductor_disabled",
    "warn_turing_fp32",
]
