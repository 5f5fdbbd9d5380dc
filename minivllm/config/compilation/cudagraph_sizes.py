"""CUDA graph capture sizes and compile ranges of a `VllmConfig`.

The default grid of batch sizes (in tokens) to capture is 1, 2, 4, then every 8
up to 256 and every 16 from 256 on, up to a ceiling of

    min(max_num_seqs * uniform_decode_query_len * 2, platform default)

where the platform default is 512 (1024 on data-center Blackwell), and never above
``max_num_batched_tokens``.  ``max_num_batched_tokens`` itself is captured when it
fits under the ceiling, and so are the uniform decode batch widths (they need not
land on the 8/16 stride).  ``performance_mode="interactivity"`` captures every size
from 1 to 32.  Sizes the user gave are kept, de-duplicated, sorted and cut at
``max_num_batched_tokens``.  A batch runs the smallest captured graph that holds it
and eagerly when it is larger than the largest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

INTERACTIVITY_DENSE_LIMIT = 32
"""With performance_mode 'interactivity', every batch size up to this is captured."""


def decode_request_counts(max_requests: int, platform_ceiling: int) -> list[int]:
    """Request counts whose uniform decode batches get a graph: the default grid over
    requests (1, 2, 4, every 8, every 16 from 256) plus ``max_requests`` itself, with
    at most ``platform_ceiling`` requests."""
    max_requests = min(max_requests, platform_ceiling)
    counts = [n for n in (1, 2, 4) if n <= max_requests]
    counts += range(8, min(max_requests + 1, 256), 8)
    counts += range(256, max_requests + 1, 16)
    return sorted({*counts, max_requests})


def uniform_decode_sizes(
    max_num_seqs: int, decode_query_len: int, max_capture_size: int, platform_ceiling: int
) -> list[int]:
    """Token counts of uniform decode batches to capture, up to ``max_capture_size``.

    With one query per request the widest decode batch is ``max_num_seqs`` tokens.
    With draft tokens (``decode_query_len > 1``) a decode batch is a whole number of
    requests times the query length, so sizes are request counts scaled by it: a
    token-strided entry would rarely be such a multiple and could not be dispatched.
    """
    if decode_query_len > 1:
        return sorted(
            {
                n * decode_query_len
                for n in decode_request_counts(max_num_seqs, platform_ceiling)
                if n * decode_query_len <= max_capture_size
            }
        )
    return [max_num_seqs] if max_num_seqs <= max_capture_size else []


def default_capture_sizes(
    max_capture_size: int,
    max_num_tokens: int,
    performance_mode: str = "balanced",
    decode_sizes: list[int] | tuple[int, ...] = (),
) -> list[int]:
    """The default capture grid up to ``max_capture_size`` (already capped by
    ``max_num_tokens``), with ``max_num_tokens`` and ``decode_sizes`` added where they fit."""
    if performance_mode == "interactivity":
        # Fine-grained graphs for small batches: no padding at all up to 32.
        sizes = list(range(1, min(max_capture_size, INTERACTIVITY_DENSE_LIMIT) + 1))
    else:
        sizes = [n for n in (1, 2, 4) if n <= max_capture_size]
    if max_capture_size >= 8:
        sizes += range(8, min(max_capture_size + 1, 256), 8)
    if max_capture_size >= 256:
        sizes += range(256, max_capture_size + 1, 16)
    if max_num_tokens <= max_capture_size:
        sizes.append(max_num_tokens)
    sizes += [n for n in decode_sizes if n <= max_num_tokens]
    return sorted(set(sizes))


def set_cudagraph_sizes(cfg: VllmConfig) -> None:
    """Resolve ``cudagraph_capture_sizes`` and ``max_cudagraph_capture_size`` in place.

    Raises `ValueError` when the user set both and they disagree.
    """
    from minivllm.platforms import current_platform

    compilation_config = cfg.compilation_config
    model = cfg.model_config
    uses_graphs = (
        model is not None
        and not model.enforce_eager
        and compilation_config.cudagraph_mode != CUDAGraphMode.NONE
    )
    if not uses_graphs:
        compilation_config.max_cudagraph_capture_size = 0
        compilation_config.cudagraph_capture_sizes = []
        compilation_config.post_init_cudagraph_sizes()
        return

    max_num_tokens = cfg.scheduler_config.max_num_batched_tokens
    user_max = compilation_config.max_cudagraph_capture_size
    user_sizes = compilation_config.cudagraph_capture_sizes
    decode_sizes: list[int] = []
    if user_max is None:
        ceiling = current_platform.default_max_cudagraph_capture_size()
        decode_query_len = cfg.uniform_decode_query_len
        max_num_seqs = cfg.scheduler_config.max_num_seqs
        max_capture = min(max_num_seqs * decode_query_len * 2, ceiling)
        # Only the computed default adds decode sizes; an explicit ceiling is kept as is.
        decode_sizes = uniform_decode_sizes(max_num_seqs, decode_query_len, max_capture, ceiling)
    else:
        max_capture = user_max
    max_capture = min(max_num_tokens, max_capture)
    if max_capture < 1:
        raise ValueError(
            f"max_cudagraph_capture_size resolved to {max_capture}; CUDA graphs need it to be "
            "at least 1. Raise it, or set cudagraph_mode=NONE to run without graphs."
        )

    if user_sizes is not None:
        if not user_sizes:
            raise ValueError(
                "cudagraph_capture_sizes is empty while CUDA graphs are on; list at least "
                "one size, leave it unset, or set cudagraph_mode=NONE."
            )
        sizes = sorted(n for n in set(user_sizes) if n <= max_num_tokens)
    else:
        sizes = default_capture_sizes(
            max_capture, max_num_tokens, cfg.performance_mode, decode_sizes
        )

    valid_max = sizes[-1] if sizes else 0
    if user_max is not None and user_max != valid_max:
        if user_sizes is not None:
            raise ValueError(
                f"max_cudagraph_capture_size ({user_max}) must equal the largest of "
                f"cudagraph_capture_sizes within max_num_batched_tokens ({valid_max}); "
                "set only one of them, or make them agree."
            )
        logger.warning("Truncating max_cudagraph_capture_size to %d", valid_max)
    compilation_config.max_cudagraph_capture_size = valid_max
    if user_sizes is not None and len(sizes) < len(user_sizes):
        logger.warning(
            "cudagraph_capture_sizes %s cut to %s (max_num_batched_tokens=%d)",
            user_sizes,
            sizes,
            max_num_tokens,
        )
    compilation_config.cudagraph_capture_sizes = sizes
    compilation_config.post_init_cudagraph_sizes()


def set_compile_ranges(cfg: VllmConfig) -> None:
    """Resolve ``compile_ranges_endpoints``: the token counts at which compiled code is
    specialised.  The last range ends at ``max_num_batched_tokens``; fusions that only
    pay off for small batches add their thresholds; user endpoints inside (1, end) stay.
    """
    compilation_config = cfg.compilation_config
    pass_config = compilation_config.pass_config
    end = cfg.scheduler_config.max_num_batched_tokens
    endpoints: list[int] = [end] if end is not None else []

    def add_threshold(limit: int | None) -> None:
        if limit is not None and end is not None and limit < end:
            endpoints.append(limit)

    if pass_config.fuse_allreduce_rms and cfg.model_config is not None:
        max_bytes = pass_config.flashinfer_max_size(cfg.parallel_config.tensor_parallel_size)
        if max_bytes is not None:
            itemsize = _dtype_itemsize(cfg.model_config.dtype)
            add_threshold(max_bytes // (cfg.model_config.get_hidden_size() * itemsize))
    if pass_config.fuse_rope_kvcache:
        add_threshold(pass_config.rope_kvcache_fusion_max_token_num)
    if pass_config.fuse_qk_norm_rope_kvcache:
        add_threshold(pass_config.rope_kvcache_fusion_max_token_num)

    for x in compilation_config.compile_ranges_endpoints or ():
        if not isinstance(x, int) or x <= 0:
            raise ValueError(
                f"compile_ranges_endpoints must be positive integers, got {x!r}; fix the list."
            )
        if end is not None and 1 < x < end:
            endpoints.append(x)
    compilation_config.compile_ranges_endpoints = sorted(set(endpoints))


def _dtype_itemsize(dtype: object) -> int:
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int):
        return itemsize
    import torch

    return torch.empty((), dtype=getattr(torch, str(dtype).removeprefix("torch."))).element_size()


__all__ = [
    "INTERACTIVITY_DENSE_LIMIT",
    "decode_request_counts",
    "default_capture_sizes",
    "set_compile_ranges",
    "set_cudagraph_sizes",
    "uniform_decode_sizes",
]
