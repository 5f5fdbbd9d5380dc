"""`ForwardRunner`: runs the model forward of one step, compiled and graph-captured as
the `CompilationConfig` says.

The model runner hands it a step's flat inputs and attention metadata; it asks the
`CudagraphDispatcher` which graph serves the batch, pads the batch to that size
(padding tokens: id 0, position 0, slot -1, so nothing is written to the KV
cache), replays the captured graph or calls the compiled forward, and returns the
hidden states of the real tokens.  On CPU the dispatcher always answers NONE and
this is the compiled (or eager) forward inside the forward context.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from minivllm.attention.forward_context import set_forward_context
from minivllm.attention.metadata import AttentionMetadata
from minivllm.compilation.backend import VllmBackend
from minivllm.compilation.wrapper import ModelForward, build_model_forward
from minivllm.config.attention import ATTENTION_CG_SUPPORT
from minivllm.config.attention_support import AttentionCGSupport
from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.logger import init_logger
from minivllm.math_utils import cdiv
from minivllm.worker.cudagraph import (
    BatchDescriptor,
    CudagraphDispatcher,
    FullCudaGraphRunner,
    GraphPool,
    PiecewiseCudaGraphWrapper,
    log_capture,
    timer,
)
from minivllm.worker.decode_graph import CpuDecodeGraph, decode_graph_wanted

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

WARMUP_TRACE_TOKENS = 8
"""Token count of the start-up run that traces the model: at least 2, so the token
dimension is traced as a symbol, and small, so the eager part of it is quick on CPU."""


def pad_step_inputs(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    attn_metadata: AttentionMetadata | None,
    num_padded: int,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata | None]:
    """The step's inputs padded to ``num_padded`` tokens; padding writes no KV."""
    n = input_ids.shape[0]
    extra = num_padded - n
    assert extra >= 0, "padding can only grow a batch"
    if extra == 0:
        return input_ids, positions, attn_metadata
    zeros = input_ids.new_zeros(extra)
    input_ids = torch.cat([input_ids, zeros])
    positions = torch.cat([positions, positions.new_zeros(extra)])
    if attn_metadata is not None:
        attn_metadata = _pad_slots(attn_metadata, extra)
    return input_ids, positions, attn_metadata


def _pad_slots(attn_metadata: AttentionMetadata, extra: int) -> AttentionMetadata:
    """``md`` with ``extra`` padding slots (-1), in every KV cache group."""
    slots = torch.cat(
        [attn_metadata.slot_mapping, attn_metadata.slot_mapping.new_full((extra,), -1)]
    )
    if attn_metadata.group_metadata is None:
        return dataclasses.replace(attn_metadata, slot_mapping=slots)
    rest = [_pad_slots(g, extra) for g in attn_metadata.group_metadata[1:]]
    first = dataclasses.replace(attn_metadata, slot_mapping=slots, group_metadata=None)
    first.group_metadata = (first, *rest)
    return first


class ForwardRunner:
    """Compiled forward + CUDA graph dispatch/capture for one model."""

    def __init__(
        self,
        model: nn.Module,
        vllm_config: VllmConfig,
        attn_layers: dict[str, Any],
        device: torch.device,
        dispatcher: CudagraphDispatcher | None = None,
    ) -> None:
        self.model = model
        self.vllm_config = vllm_config
        self.attn_layers = attn_layers
        self.device = device
        compilation_config = vllm_config.compilation_config
        self.compilation_config = compilation_config
        self.model_forward: ModelForward = build_model_forward(model, vllm_config)
        self.max_num_tokens: int = vllm_config.scheduler_config.max_num_batched_tokens
        # VllmConfig resolution settled the mode for this device and attention backend
        # (see `minivllm config --explain`); the runner runs it as it is.
        mode = compilation_config.cudagraph_mode or CUDAGraphMode.NONE
        if dispatcher is None:
            assert not mode or device.type == "cuda", f"{mode} resolved for {device.type}"
            assert not mode.has_full_cudagraphs() or all(
                ATTENTION_CG_SUPPORT[layer.impl.name] != AttentionCGSupport.NEVER
                for layer in attn_layers.values()
            ), f"{mode} resolved for an attention backend without full CUDA graphs"
        self.dispatcher = dispatcher or CudagraphDispatcher(
            mode, compilation_config.cudagraph_capture_sizes or []
        )
        self._piece_wrappers: list[PiecewiseCudaGraphWrapper] = []
        self._full: FullCudaGraphRunner | None = None
        self._pool: GraphPool | None = None
        if self.dispatcher.capture_sizes and device.type == "cuda":
            self._setup_cuda()
        self.decode_graph: CpuDecodeGraph | None = None
        why_not = decode_graph_wanted(vllm_config, attn_layers)
        if why_not is None:
            self.decode_graph = CpuDecodeGraph(model, vllm_config, attn_layers)
        else:
            logger.debug("CPU decode graph off: %s", why_not)

    # -- start-up -----------------------------------------------------------------
    def _setup_cuda(self) -> None:
        compilation_config = self.compilation_config
        mode = self.dispatcher.cudagraph_mode
        self._pool = GraphPool()
        size = self.dispatcher.max_size
        self._ids = torch.zeros(size, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(size, dtype=torch.long, device=self.device)
        backend = self.model_forward.backend
        if mode.has_piecewise_cudagraphs() and isinstance(backend, VllmBackend):
            backend.piece_wrapper = self._wrap_piece
        if mode.has_full_cudagraphs():
            # The attention backend owns the metadata tensors its kernels read in a graph.
            block_size = self.vllm_config.cache_config.block_size
            max_blocks = cdiv(self.vllm_config.model_config.max_model_len, block_size)
            backend_impl = next(iter(self.attn_layers.values())).impl
            self._graph_buffers = backend_impl.make_graph_buffers(
                self.vllm_config.scheduler_config.max_num_seqs, max_blocks, size, self.device
            )
            self._full = FullCudaGraphRunner(self._full_forward, self._pool)
        del compilation_config

    def _wrap_piece(self, piece: Any, index: int, num_pieces: int) -> Any:
        assert self._pool is not None
        compilation_config = self.compilation_config
        wrapper = PiecewiseCudaGraphWrapper(
            piece,
            self._pool,
            compilation_config.cudagraph_num_of_warmups,
            compilation_config.cudagraph_copy_inputs,
            self.dispatcher.capture_sizes,
        )
        self._piece_wrappers.append(wrapper)
        return wrapper

    @torch.inference_mode()
    def compile_and_warm_up(self) -> float:
        """Trace/compile the forward and every compile size now; returns seconds spent
        (also stored in ``compilation_config.compilation_time`` and logged)."""
        if not self.model_forward.is_compiled:
            return 0.0
        compilation_config = self.compilation_config
        sizes = [min(self.max_num_tokens, WARMUP_TRACE_TOKENS)]
        sizes += [
            int(s) for s in compilation_config.compile_sizes or [] if int(s) <= self.max_num_tokens
        ]
        logger.info(
            "start-up 2/4: compiling the model (mode %s; the first start compiles, ~20 s on a "
            "CPU; later starts load the compile cache; -O0 skips compiling)",
            compilation_config.mode.name if compilation_config.mode is not None else "NONE",
        )
        start = timer()
        for n in dict.fromkeys(sizes):
            self._dummy_forward(max(n, 1))
        elapsed = timer() - start
        compilation_config.compilation_time += elapsed
        logger.info(
            "torch.compile (mode %s, backend %r) took %.2f s at start-up",
            compilation_config.mode.name if compilation_config.mode is not None else "NONE",
            compilation_config.backend,
            elapsed,
        )
        return elapsed

    def _dummy_forward(self, n: int, at_position_zero: bool = False) -> torch.Tensor:
        """A cache-less forward of ``n`` tokens; ``at_position_zero`` puts every token at
        position 0, for ``n`` beyond max_model_len (the captures' sizes may be)."""
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        if at_position_zero:
            pos = torch.zeros(n, dtype=torch.long, device=self.device)
        else:
            pos = torch.arange(n, dtype=torch.long, device=self.device)
        with set_forward_context(None, self.attn_layers):
            return self.model_forward(ids, pos)

    @torch.inference_mode()
    def capture_cudagraphs(self) -> int:
        """Capture every graph of the capture plan (CUDA only); returns how many."""
        if self.decode_graph is not None:
            self._warm_up_decode_graph(self.decode_graph)
        plan = self.dispatcher.capture_plan()
        if not plan or self.device.type != "cuda" or self._pool is None:
            return 0
        warmups = self.compilation_config.cudagraph_num_of_warmups
        logger.info("start-up 4/4: capturing %d CUDA graphs", len(plan))
        free_before = torch.cuda.mem_get_info(self.device)[0]
        start = timer()
        # One eager run on the capture stream first, whatever cudagraph_num_of_warmups
        # says: -O0 has had no forward at all yet, and the first GEMM on a stream sets up
        # cuBLAS state that cannot be created inside a capture.
        largest = max(size for _, size, _ in plan)
        self._pool.run(lambda: self._dummy_forward(largest, at_position_zero=True))
        for w in self._piece_wrappers:
            w.capturing = True
        try:
            for mode, size, uniform in plan:
                if mode == CUDAGraphMode.FULL:
                    assert self._full is not None
                    self._graph_buffers.fill(None, size)
                    self._full.capture(size, uniform, warmups)
                else:
                    self._ids[:size].zero_()
                    self._pos[:size].zero_()
                    with set_forward_context(None, self.attn_layers) as ctx:
                        ctx.cudagraph_runtime_mode = CUDAGraphMode.PIECEWISE
                        ctx.num_padded_tokens = size
                        self.model_forward(self._ids[:size], self._pos[:size])
        finally:
            for w in self._piece_wrappers:
                w.capturing = False
        torch.cuda.synchronize(self.device)
        log_capture(
            len(plan), timer() - start, free_before, torch.cuda.mem_get_info(self.device)[0]
        )
        return len(plan)

    def _warm_up_decode_graph(self, graph: CpuDecodeGraph) -> None:
        logger.info(
            "start-up 4/4: compiling the CPU decode graph (decode steps of 1-%d requests)",
            graph.max_seqs,
        )
        seconds = graph.warm_up()
        self.compilation_config.compilation_time += seconds
        logger.info(
            "CPU decode graph compiled in %.2f s (%d decoder layers fused)",
            seconds,
            graph.num_fused_layers,
        )

    # -- FULL graphs --------------------------------------------------------------
    def _full_forward(self, size: int, uniform: bool) -> torch.Tensor:
        with set_forward_context(self._graph_buffers.metadata(size), self.attn_layers) as ctx:
            ctx.cudagraph_runtime_mode = CUDAGraphMode.FULL
            ctx.num_padded_tokens = size
            return self.model_forward(self._ids[:size], self._pos[:size])

    # -- per step -----------------------------------------------------------------
    def _stage_inputs(
        self, input_ids: torch.Tensor, positions: torch.Tensor, padded: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the step's ids and positions into the captured graphs' input buffers
        (graph inputs must sit at the addresses they were captured at), padding rows
        zeroed; returns the first ``padded`` rows of each."""
        n = input_ids.shape[0]
        self._ids[:n].copy_(input_ids)
        self._ids[n:padded].zero_()
        self._pos[:n].copy_(positions)
        self._pos[n:padded].zero_()
        return self._ids[:padded], self._pos[:padded]

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attn_metadata: AttentionMetadata | None,
    ) -> torch.Tensor:
        """Hidden states ``[num_tokens, H]`` of the step's real tokens."""
        n = input_ids.shape[0]
        if self.decode_graph is not None and self.decode_graph.accepts(n, attn_metadata):
            assert attn_metadata is not None
            return self.decode_graph.run(input_ids, positions, attn_metadata)
        uniform = attn_metadata is not None and attn_metadata.max_query_len == 1
        mode, padded = self.dispatcher.dispatch(BatchDescriptor(n, uniform))
        if (
            mode == CUDAGraphMode.FULL
            and self._full is not None
            and self._full.has(padded, uniform)
            # The graph buffers hold one block table: models with several KV cache
            # groups (sliding windows) run outside FULL graphs.
            and (attn_metadata is None or attn_metadata.group_metadata is None)
        ):
            self._stage_inputs(input_ids, positions, padded)
            self._graph_buffers.fill(attn_metadata, padded)
            return self._full.replay(padded, uniform)[:n]
        if mode == CUDAGraphMode.NONE:
            with set_forward_context(attn_metadata, self.attn_layers):
                return self.model_forward(input_ids, positions)
        if self._pool is not None:
            ids, pos = self._stage_inputs(input_ids, positions, padded)
            _, _, attn_metadata = pad_step_inputs(input_ids, positions, attn_metadata, padded)
        else:
            ids, pos, attn_metadata = pad_step_inputs(input_ids, positions, attn_metadata, padded)
        with set_forward_context(attn_metadata, self.attn_layers) as ctx:
            ctx.cudagraph_runtime_mode = CUDAGraphMode.PIECEWISE
            ctx.num_padded_tokens = padded
            return self.model_forward(ids, pos)[:n]


__all__ = ["WARMUP_TRACE_TOKENS", "ForwardRunner", "pad_step_inputs"]
