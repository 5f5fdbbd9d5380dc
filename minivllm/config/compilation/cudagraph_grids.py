"""The default CUDA graph capture grids.

A batch is padded up to the smallest captured size that holds it, so a grid trades
padding waste (gaps between sizes) against capture time and memory (number of
sizes).  Every grid is sorted, has no duplicates, and ends at its maximum.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minivllm.config.compilation import CompilationConfig


def _walk_grid(limit: int, step: Callable[[int], float]) -> list[int]:
    """Walk 1, ..., ``limit``: from each size, move to the next multiple of the largest
    power of two that is at most ``step(size)`` (at least 1). ``limit`` always ends the
    grid; a limit of 0 gives an empty grid."""
    grid: list[int] = []
    size = 1
    while size < limit:
        grid.append(size)
        stride = 1 << max(0, math.floor(math.log2(max(1.0, step(size)))))
        size = (size // stride + 1) * stride
    return [*grid, limit] if limit else []


def decode_cudagraph_capture_grid(max_requests: int) -> list[int]:
    """Request counts to capture for uniform decode batches, up to ``max_requests``.

    Every count from 1 to 6, then strides of the largest power of two not above
    0.65 * n^(2/3): stride 2 after 6 and 8, 4 from 16, 8 from 48, 16 from 128 and
    32 from 352. At 1024 requests this gives 64 sizes.
    """
    return _walk_grid(max_requests, lambda n: 0.65 * n ** (2 / 3))


def prefill_cudagraph_capture_grid(max_tokens: int, dense_head: bool = False) -> list[int]:
    """Token counts to capture for prefill and mixed batches, up to ``max_tokens``.

    1, 2, 4, then every 8 tokens up to 64, four sizes per doubling up to 1024, every
    256 tokens after that, and every 512 once 7% of the size is above 512. With
    ``dense_head`` every count from 1 to 32 is added. At 8192 tokens this gives
    54 sizes.
    """
    grid = _walk_grid(max_tokens, lambda t: min(t, max(8, t / 4), 0.07 * max(t, 4096)))
    if dense_head:
        grid = sorted({*grid, *(t for t in range(1, 33) if t < max_tokens)})
    return grid


def varlen_decode_cudagraph_capture_grid(max_tokens: int, dense_head: bool = False) -> list[int]:
    """Token counts of adaptive verification's decode graphs, up to ``max_tokens``.

    1, 2, 4 (every count from 1 to 32 with ``dense_head``), 8, then four sizes per
    doubling up to 1024, every 128 tokens up to 4096 and every 256 after that.
    Adaptive verification chooses its verify budget among these sizes, so the grid
    is finer than the prefill grid.
    """
    if max_tokens <= 0:
        return []
    grid = set(range(1, 33)) if dense_head else {1, 2, 4}
    low = 8
    grid.add(low)
    while low < 1024:
        quarter = low // 4
        grid.update(range(low + quarter, 2 * low + 1, quarter))
        low *= 2
    grid.update(range(1024, 4096, 128), range(4096, max_tokens, 256))
    return sorted({s for s in grid if s < max_tokens} | {max_tokens})


def decode_cudagraph_capture_shapes(
    sizes: Iterable[int], query_lens: Mapping[int, int], max_tokens: int
) -> list[tuple[int, int]]:
    """The ``(num_reqs, query_len)`` uniform-decode graphs to capture.

    ``sizes`` are the request counts; ``query_lens`` maps each query length ``q`` to
    the most requests its batches have. For each ``q`` the limit is that many requests
    and at most ``max_tokens // q``. A batch pads to the smallest graph that holds it,
    so the first size at or above the limit is captured at the limit itself and larger
    sizes, which no batch could reach, are left out. Sorted by query length, then
    request count.
    """
    ordered = sorted(set(sizes))
    shapes: set[tuple[int, int]] = set()
    for q, max_reqs in query_lens.items():
        limit = min(max_reqs, max_tokens // q)
        if limit < 1:
            continue
        reachable = ordered[: bisect.bisect_left(ordered, limit) + 1]
        shapes.update((min(n, limit), q) for n in reachable)
    return sorted(shapes, key=lambda shape: (shape[1], shape[0]))


def decode_cudagraph_capture_max_tokens(config: CompilationConfig) -> int:
    """Tokens of the widest uniform decode graph: the recorded
    `max_cudagraph_capture_size` (attention buffers are sized by it), capped by
    `max_decode_cudagraph_capture_tokens` when that budget is set."""
    max_tokens = config.max_cudagraph_capture_size or 0
    return min(max_tokens, config.max_decode_cudagraph_capture_tokens or max_tokens)


__all__ = [
    "decode_cudagraph_capture_grid",
    "decode_cudagraph_capture_max_tokens",
    "decode_cudagraph_capture_shapes",
    "prefill_cudagraph_capture_grid",
    "varlen_decode_cudagraph_capture_grid",
]
