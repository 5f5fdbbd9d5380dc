"""CUDA graphs: which graph a batch replays (dispatch) and how graphs are captured.

`CudagraphDispatcher` maps a batch to ``(runtime mode, padded token count)``:
uniform decode batches take ``cudagraph_mode.decode_mode()`` and other batches
``mixed_mode()``, padded up to the next capture size; a batch above the largest
capture size runs eagerly.  It is plain Python and runs (and is tested) on CPU.

`PiecewiseCudaGraphWrapper` captures one compiled piece per size (attention runs
eagerly between pieces); `FullCudaGraphRunner` captures the whole forward,
attention included, for the FULL runtime mode.  Both share one memory pool and
are only built on CUDA.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from minivllm.attention.forward_context import get_forward_context, is_forward_context_available
from minivllm.compilation.counter import compilation_counter
from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.logger import init_logger

logger = init_logger(__name__)


@dataclasses.dataclass(frozen=True)
class BatchDescriptor:
    """What the dispatcher needs to know about a batch."""

    num_tokens: int
    uniform_decode: bool = False
    """Every request has exactly ``uniform_decode_query_len`` query tokens."""


class CudagraphDispatcher:
    """Maps a batch to the graph that serves it, from the capture sizes and the mode."""

    def __init__(self, cudagraph_mode: CUDAGraphMode, capture_sizes: list[int]) -> None:
        self.cudagraph_mode = cudagraph_mode
        self.capture_sizes = sorted(set(capture_sizes)) if cudagraph_mode else []
        self.max_size = self.capture_sizes[-1] if self.capture_sizes else 0

    def padded_size(self, num_tokens: int) -> int | None:
        """The smallest capture size holding ``num_tokens``; None above the largest."""
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else None

    def dispatch(self, batch: BatchDescriptor) -> tuple[CUDAGraphMode, int]:
        """``(runtime mode, padded size)``; ``(NONE, num_tokens)`` for an eager batch."""
        if not self.cudagraph_mode or batch.num_tokens <= 0:
            return CUDAGraphMode.NONE, batch.num_tokens
        padded = self.padded_size(batch.num_tokens)
        if padded is None:
            return CUDAGraphMode.NONE, batch.num_tokens
        mode = self.cudagraph_mode
        runtime = mode.decode_mode() if batch.uniform_decode else mode.mixed_mode()
        if runtime == CUDAGraphMode.NONE:
            return CUDAGraphMode.NONE, batch.num_tokens
        return runtime, padded

    def capture_plan(self) -> list[tuple[CUDAGraphMode, int, bool]]:
        """``(runtime mode, size, uniform decode)`` of every graph to capture, largest size
        first so smaller graphs reuse the pool memory of larger ones."""
        plan: list[tuple[CUDAGraphMode, int, bool]] = []
        for size in reversed(self.capture_sizes):
            for uniform in (False, True):
                runtime, padded = self.dispatch(BatchDescriptor(size, uniform))
                entry = (runtime, padded, uniform)
                if runtime != CUDAGraphMode.NONE and entry not in plan:
                    # FULL decode and FULL mixed graphs differ (attention metadata);
                    # piecewise graphs do not depend on the batch's composition.
                    if (
                        runtime == CUDAGraphMode.PIECEWISE
                        and (runtime, padded, not uniform) in plan
                    ):
                        continue
                    plan.append(entry)
        return plan


class GraphPool:
    """One CUDA memory pool, and one stream, shared by every captured graph of a model.

    Warm-ups and captures all run on ``stream``: libraries such as cuBLAS set up
    per-stream state (handles, workspaces) on their first call, which must not happen
    while a graph is being captured (it fails with CUBLAS_STATUS_INTERNAL_ERROR).
    """

    def __init__(self) -> None:
        self.handle = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()

    def run(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` eagerly on the capture stream (a warm-up), ordered after prior work."""
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        return out

    def capture(self, graph: Any, fn: Callable[[], Any]) -> Any:
        """Capture ``fn()`` into ``graph`` on the capture stream; returns its output."""
        with torch.cuda.graph(graph, pool=self.handle, stream=self.stream):
            return fn()


def _runtime_mode() -> tuple[CUDAGraphMode, int | None]:
    if not is_forward_context_available():
        return CUDAGraphMode.NONE, None
    ctx = get_forward_context()
    return ctx.cudagraph_runtime_mode, ctx.num_padded_tokens


@dataclasses.dataclass
class _Captured:
    graph: Any
    output: Any
    static_inputs: list[Any] | None


class PiecewiseCudaGraphWrapper:
    """Captures and replays one compiled piece per padded size (PIECEWISE mode).

    Inputs of a piece are outputs of earlier pieces, weights, or the runner's
    persistent input buffers, so they sit at the same addresses on every replay;
    ``cudagraph_copy_inputs`` copies them into graph-owned buffers instead, for
    callers that do not keep their buffers.
    """

    def __init__(
        self,
        runnable: Callable[..., Any],
        pool: GraphPool,
        num_warmups: int,
        copy_inputs: bool,
        capture_sizes: list[int],
    ) -> None:
        self.runnable = runnable
        self.pool = pool
        self.num_warmups = num_warmups
        self.copy_inputs = copy_inputs
        self.capture_sizes = set(capture_sizes)
        self.graphs: dict[int, _Captured] = {}
        self.capturing = False

    def __call__(self, *args: Any) -> Any:
        mode, size = _runtime_mode()
        if mode != CUDAGraphMode.PIECEWISE or size not in self.capture_sizes:
            return self.runnable(*args)
        entry = self.graphs.get(size)
        if entry is None:
            if not self.capturing:
                raise RuntimeError(f"no piecewise CUDA graph captured for {size} tokens")
            return self._capture(size, args)
        if entry.static_inputs is not None:
            for dst, src in zip(entry.static_inputs, args, strict=True):
                if isinstance(dst, torch.Tensor) and dst.data_ptr() != src.data_ptr():
                    dst.copy_(src)
        entry.graph.replay()
        return entry.output

    def _capture(self, size: int, args: tuple[Any, ...]) -> Any:
        for _ in range(self.num_warmups):
            self.pool.run(lambda: self.runnable(*args))
        static = None
        if self.copy_inputs:
            static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            args = tuple(static)
        graph = torch.cuda.CUDAGraph()
        output = self.pool.capture(graph, lambda: self.runnable(*args))
        self.graphs[size] = _Captured(graph, output, static)
        compilation_counter.num_cudagraph_captured += 1
        return output


class FullCudaGraphRunner:
    """Captures the whole forward (attention included) per padded size (FULL mode).

    ``forward`` must read its inputs from persistent buffers (the runner copies each
    batch's ids, positions and attention metadata into them before replay).
    """

    def __init__(self, forward: Callable[[int, bool], torch.Tensor], pool: GraphPool) -> None:
        self.forward = forward
        self.pool = pool
        self.graphs: dict[tuple[int, bool], _Captured] = {}

    def has(self, size: int, uniform: bool) -> bool:
        return (size, uniform) in self.graphs

    def capture(self, size: int, uniform: bool, num_warmups: int) -> None:
        for _ in range(num_warmups):
            self.pool.run(lambda: self.forward(size, uniform))
        graph = torch.cuda.CUDAGraph()
        output = self.pool.capture(graph, lambda: self.forward(size, uniform))
        self.graphs[(size, uniform)] = _Captured(graph, output, None)
        compilation_counter.num_cudagraph_captured += 1

    def replay(self, size: int, uniform: bool) -> torch.Tensor:
        entry = self.graphs[(size, uniform)]
        entry.graph.replay()
        return entry.output


def log_capture(num_graphs: int, seconds: float, free_before: int, free_after: int) -> None:
    """One line with what capture cost, as the issue asks."""
    logger.info(
        "captured %d CUDA graphs in %.2f s using %.3f GiB",
        num_graphs,
        seconds,
        (free_before - free_after) / (1 << 30),
    )


def timer() -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


__all__ = [
    "BatchDescriptor",
    "CudagraphDispatcher",
    "FullCudaGraphRunner",
    "GraphPool",
    "PiecewiseCudaGraphWrapper",
    "log_capture",
]
