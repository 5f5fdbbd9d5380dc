"""Resolution steps of `CompilationConfig` that settle splitting ops and the graph mode.

They live here to keep `compilation.py` readable; `CompilationConfig` exposes each one
as a method of the same name, which is what callers use.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, NamedTuple, Protocol

from minivllm.config.attention_support import AttentionCGSupport
from minivllm.config.compilation.modes import CompilationMode, CUDAGraphMode, log_once
from minivllm.logger import init_logger
from minivllm.math_utils import round_up

if TYPE_CHECKING:
    from minivllm.config.compilation import CompilationConfig

logger = init_logger(__name__)

ATTENTION_OPS: tuple[str, ...] = ("minivllm::unified_attention_with_output",)
"""Attention ops, kept outside piecewise graphs (the default splitting ops)."""

KV_CACHE_UPDATE_OPS: tuple[str, ...] = ("minivllm::unified_kv_cache_update",)
"""KV-cache write ops. Their string argument (the layer name) stops Inductor from
reusing one compiled piece for every layer, so the default split leaves them out of
the compiled pieces too."""


def set_splitting_ops_for_v1(
    cfg: CompilationConfig, all2all_backend: str, data_parallel_size: int = 1
) -> None:
    """Settle `splitting_ops` (and the graph modes that depend on them)."""
    if cfg.mode != CompilationMode.VLLM_COMPILE:
        # Only VLLM_COMPILE splits the graph; other modes see the whole graph.
        if cfg.splitting_ops is None:
            cfg.splitting_ops = []
        return

    if cfg.pass_config.fuse_attn_quant and not cfg.use_inductor_graph_partition:
        set_splitting_ops_for_attn_fusion(cfg)
    elif cfg.splitting_ops is None:
        # Keep attention out of the pieces even for full graphs: the full graph is then
        # captured around the piecewise FX graph, which costs less CPU time for batch
        # sizes that were not captured.
        cfg.splitting_ops = list(ATTENTION_OPS)
        if not cfg.use_inductor_graph_partition:
            _disable_kvcache_fusions_for_fx_split(cfg)
            cfg.splitting_ops.extend(KV_CACHE_UPDATE_OPS)
    elif len(cfg.splitting_ops) == 0:
        _drop_piecewise_for_empty_splitting_ops(cfg)

    if (
        all2all_backend == "deepep_high_throughput"
        and data_parallel_size > 1
        and cfg.cudagraph_mode != CUDAGraphMode.NONE
    ):
        logger.info(
            "CUDA graphs are turned off: the deepep_high_throughput all2all kernels cannot "
            "be captured. Use another --all2all-backend (e.g. deepep_low_latency or "
            "allgather_reducescatter) to keep CUDA graphs for decode."
        )
        cfg.cudagraph_mode = CUDAGraphMode.NONE


def _disable_kvcache_fusions_for_fx_split(cfg: CompilationConfig) -> None:
    # The KV-cache write is about to become a splitting op, so a pass fusing into it
    # would never see both halves of its pattern.
    for name, what in (
        ("fuse_rope_kvcache", "RoPE + KV-cache"),
        ("fuse_qk_norm_rope_kvcache", "QK-norm + RoPE + KV-cache"),
    ):
        if getattr(cfg.pass_config, name):
            log_once(
                logger,
                logging.WARNING,
                "%s is turned off: with splitting_ops unset and Inductor graph partition off "
                "the KV-cache update is split out of the graph. Set splitting_ops=[] or "
                "use_inductor_graph_partition=True to keep the %s fusion.",
                name,
                what,
            )
            setattr(cfg.pass_config, name, False)


def _drop_piecewise_for_empty_splitting_ops(cfg: CompilationConfig) -> None:
    # Nothing is split out, so there are no pieces to capture piecewise.
    if cfg.cudagraph_mode == CUDAGraphMode.PIECEWISE:
        log_once(
            logger,
            logging.WARNING,
            "cudagraph_mode PIECEWISE with splitting_ops=[] captures nothing; setting "
            "cudagraph_mode=NONE. Use FULL or FULL_DECODE_ONLY for full graphs.",
        )
        cfg.cudagraph_mode = CUDAGraphMode.NONE
    elif cfg.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE:
        log_once(
            logger,
            logging.WARNING,
            "cudagraph_mode FULL_AND_PIECEWISE with splitting_ops=[] has no pieces; "
            "setting cudagraph_mode=FULL.",
        )
        cfg.cudagraph_mode = CUDAGraphMode.FULL
    cfg.splitting_ops = []


def set_splitting_ops_for_attn_fusion(cfg: CompilationConfig) -> None:
    """Attention + quant fusion needs attention inside the graph: no attention splits."""
    assert cfg.pass_config.fuse_attn_quant, "only called with fuse_attn_quant on"
    if cfg.splitting_ops is None:
        cfg.splitting_ops = []
        if cfg.cudagraph_mode is not None and cfg.cudagraph_mode.has_piecewise_cudagraphs():
            log_once(
                logger,
                logging.WARNING,
                "fuse_attn_quant cannot be combined with piecewise CUDA graphs unless "
                "use_inductor_graph_partition is on; setting splitting_ops=[] and "
                "cudagraph_mode=FULL. Set cudagraph_mode=NONE if the attention backend "
                "cannot be captured.",
            )
            cfg.cudagraph_mode = CUDAGraphMode.FULL
    if cfg.splitting_ops_contain_attention():
        raise ValueError(
            "fuse_attn_quant=True needs attention inside the compiled graph, but "
            f"splitting_ops={cfg.splitting_ops} splits it out; remove the attention ops "
            "from splitting_ops or turn fuse_attn_quant off."
        )


class KVCacheLayout(Protocol):
    """What the graph-mode check reads from the worker's KV cache configuration."""

    @property
    def has_mamba_layers(self) -> bool: ...

    @property
    def num_blocks(self) -> int: ...


def resolve_cudagraph_mode_and_sizes(
    cfg: CompilationConfig,
    min_cg_support: AttentionCGSupport,
    min_cg_attn_backend: str | None,
    uniform_decode_query_len: int = 1,
    use_v2_model_runner: bool = False,
    kv_cache_config: KVCacheLayout | None = None,
    max_num_reqs: int | None = None,
    is_profiling: bool = False,
    piecewise_capture_available: bool = True,
) -> CUDAGraphMode:
    """Downgrade `cudagraph_mode` to what the attention backends and model support, and
    return it (`CompilationConfig.resolve_cudagraph_mode_and_sizes` is this function).
    ``kv_cache_config`` needs ``has_mamba_layers`` and ``num_blocks``."""
    mode = cfg.cudagraph_mode
    if mode is None or mode == CUDAGraphMode.NONE:
        cfg.cudagraph_mode = CUDAGraphMode.NONE
        return CUDAGraphMode.NONE
    backend = _Backend(min_cg_support, min_cg_attn_backend)
    mode = _fit_mixed_batches(cfg, mode, backend)
    mode = _fit_decode_batches(cfg, mode, backend)
    mode = _fit_verification_batches(cfg, mode, backend, uniform_decode_query_len)
    mode = _fit_piecewise_capture(mode, piecewise_capture_available)
    if mode.has_full_cudagraphs() and min_cg_support == AttentionCGSupport.NEVER:
        # Every downgrade above is done: full graphs left now cannot be captured.
        raise ValueError(backend.unsupported(mode) + _USE_PIECEWISE)
    if (
        not use_v2_model_runner
        and mode.decode_mode() == CUDAGraphMode.FULL
        and uniform_decode_query_len > 1
    ):
        # The v1 runner pads decode graphs to whole requests of q tokens.
        cfg.adjust_cudagraph_sizes_for_spec_decode(uniform_decode_query_len)
    if kv_cache_config is not None and max_num_reqs is not None and not is_profiling:
        _check_mamba_state_blocks(mode, kv_cache_config, max_num_reqs)
    cfg.cudagraph_mode = mode
    return mode


_USE_PIECEWISE = "; use cudagraph_mode=PIECEWISE with compilation mode VLLM_COMPILE"


class _Backend(NamedTuple):
    """The least capable attention backend of the model: what graphs it can be in."""

    support: AttentionCGSupport
    name: str | None

    def unsupported(self, mode: CUDAGraphMode, extra: str = "") -> str:
        return (
            f"CUDAGraphMode.{mode.name} is not supported{extra} with the {self.name} "
            f"attention backend (support: {self.support.name})"
        )


def _fit_mixed_batches(
    cfg: CompilationConfig, mode: CUDAGraphMode, backend: _Backend
) -> CUDAGraphMode:
    """Full graphs of mixed (prefill + decode) batches need a backend that captures any
    batch; otherwise keep full graphs for decode batches only."""
    if mode.mixed_mode() != CUDAGraphMode.FULL or backend.support == AttentionCGSupport.ALWAYS:
        return mode
    msg = backend.unsupported(mode)
    if backend.support == AttentionCGSupport.NEVER:
        raise ValueError(msg + _USE_PIECEWISE)
    return _downgrade(cfg, msg, CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY)


def _fit_decode_batches(
    cfg: CompilationConfig, mode: CUDAGraphMode, backend: _Backend
) -> CUDAGraphMode:
    """Full decode graphs need some full-graph support; without it, piecewise graphs
    where attention is compiled in pieces, else none."""
    if mode.decode_mode() != CUDAGraphMode.FULL or backend.support != AttentionCGSupport.NEVER:
        return mode
    msg = backend.unsupported(mode)
    if cfg.mode == CompilationMode.VLLM_COMPILE and (
        cfg.splitting_ops_contain_attention() or cfg.use_inductor_graph_partition
    ):
        mode = CUDAGraphMode.PIECEWISE
        reason = "attention is compiled piecewise"
    else:
        mode = CUDAGraphMode.NONE
        reason = "attention is not compiled piecewise"
    logger.warning("%s; setting cudagraph_mode=%s because %s", msg, mode.name, reason)
    return mode


def _fit_verification_batches(
    cfg: CompilationConfig, mode: CUDAGraphMode, backend: _Backend, query_len: int
) -> CUDAGraphMode:
    """Speculative-decoding verification batches (``query_len`` > 1 tokens a request)
    in full graphs need uniform-batch support."""
    if (
        mode.decode_mode() != CUDAGraphMode.FULL
        or query_len <= 1
        or backend.support.value >= AttentionCGSupport.UNIFORM_BATCH.value
    ):
        return mode
    msg = backend.unsupported(mode, " with speculative decoding")
    return _downgrade(cfg, msg, CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE)


def _downgrade(
    cfg: CompilationConfig,
    why: str,
    attention_split_out: CUDAGraphMode,
    attention_compiled_in: CUDAGraphMode,
) -> CUDAGraphMode:
    """The mode to fall back to, by whether the splitting ops keep attention out of the
    compiled pieces (then it runs between piecewise graphs); logged with ``why``."""
    if cfg.splitting_ops_contain_attention():
        mode = attention_split_out
    else:
        mode = attention_compiled_in
    logger.warning("%s; setting cudagraph_mode=%s", why, mode.name)
    return mode


def _fit_piecewise_capture(mode: CUDAGraphMode, available: bool) -> CUDAGraphMode:
    """Piecewise graphs need something to capture in pieces (a compiled submodule or
    breakable CUDA graphs); without it only the full-graph part of the mode is kept."""
    if available or not mode.requires_piecewise_compilation():
        return mode
    fallback = mode.without_piecewise()
    log_once(
        logger,
        logging.WARNING,
        "cudagraph_mode %s needs piecewise capture, but the model has neither a "
        "compiled submodule nor breakable CUDA graphs; using %s.",
        mode,
        fallback,
    )
    return fallback


def _check_mamba_state_blocks(
    mode: CUDAGraphMode, kv_cache_config: KVCacheLayout, max_num_reqs: int
) -> None:
    """Each sequence of a full-graph decode batch of a Mamba model needs its own state
    block, so the batch cannot be wider than the blocks there are."""
    if (
        mode.has_full_cudagraphs()
        and kv_cache_config.has_mamba_layers
        and max_num_reqs > kv_cache_config.num_blocks
    ):
        raise ValueError(
            f"max_num_seqs ({max_num_reqs}) exceeds available Mamba cache blocks "
            f"({kv_cache_config.num_blocks}). Each decode sequence needs one Mamba cache "
            "block, so CUDA graph capture cannot proceed. Lower max_num_seqs to at most "
            f"{kv_cache_config.num_blocks} or increase gpu_memory_utilization."
        )


def adjust_cudagraph_sizes_for_spec_decode(
    cfg: CompilationConfig, uniform_decode_query_len: int
) -> None:
    """Round capture sizes up to multiples of ``uniform_decode_query_len`` (whole requests)."""
    multiple = uniform_decode_query_len
    if not cfg.cudagraph_capture_sizes or multiple <= 1:
        return
    max_size = cfg.max_cudagraph_capture_size
    assert max_size is not None, "max_cudagraph_capture_size is set with the capture sizes"
    rounded = sorted(
        {
            round_up(size, multiple)
            for size in cfg.cudagraph_capture_sizes
            if round_up(size, multiple) <= max_size
        }
    )
    if not rounded and multiple <= max_size:
        # Every size rounded past the max, but one whole request still fits.
        rounded = [multiple]
    if not rounded:
        raise ValueError(
            f"No CUDA graph capture size is left after rounding to a multiple of {multiple} "
            f"(num_speculative_tokens + 1). Lower num_speculative_tokens "
            f"({uniform_decode_query_len - 1}) or raise max_cudagraph_capture_size "
            f"({max_size}) or cudagraph_capture_sizes ({cfg.cudagraph_capture_sizes})."
        )
    cfg.max_cudagraph_capture_size = rounded[-1]
    cfg.cudagraph_capture_sizes = rounded


__all__ = [
    "ATTENTION_OPS",
    "KV_CACHE_UPDATE_OPS",
    "adjust_cudagraph_sizes_for_spec_decode",
    "resolve_cudagraph_mode_and_sizes",
    "set_splitting_ops_for_attn_fusion",
    "set_splitting_ops_for_v1",
]
