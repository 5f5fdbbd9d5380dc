"""`CpuDecodeGraph`: on CPU, decode steps run as one compiled graph.

What a CUDA graph is to a GPU decode step, this is to a CPU one.  The compiled
piecewise forward (`minivllm.compilation.backend`) splits the model at every
attention call, and each layer's KV write and attention then run as Python-level
custom ops that gather the context and call SDPA: at batch 1 that per-call
overhead, not arithmetic or weight reading, is most of the step.  Here the
forward of a decode step (every request has exactly one new token, at most
`DECODE_GRAPH_MAX_SEQS` of them) is traced once more, with attention written in
torch ops (`minivllm.attention.decode_graph`: KV write in place, the gather
through the block table fused into the score loop), and compiled by the same
`VllmBackend`, split only after every ``LAYERS_PER_PIECE`` decoder layers
(``minivllm::decode_layer_boundary``): the middle pieces are one graph with other
weights, so compiling costs about what the piecewise forward's does, where one
whole-model graph took Inductor minutes.  int4 GEMMs are calls of minivllm's own
kernel (``minivllm_cpu::q4_gemm``, which takes every row count the graph runs);
other low-bit GEMMs stay the opaque ``minivllm::lowbit_linear`` op, which picks
its kernel by row count at run time.  Llama-family layers whose projections are
all low-bit are traced as minivllm's fused C++ decoder layer instead, all of them
as one call where they all are (`minivllm.model_executor.layers.fused_decoder_layer`).
With LoRA on, the LoRA layers (`minivllm.lora.layers.LoRALinear`) are in the graph
too: a fused layer adds each row's adapter delta in C++ (float32 slots over a
native low-bit base), any other layer is traced with the LoRA layer's own torch
ops (base GEMM, shrink, slot mask, expand).  Either way the adapter slots and the
step's one-hot slot mask are inputs of the graph read in place, never constants:
adapters loaded, unloaded or moved between slots after the trace (or after a
saved trace was loaded) are what the next step computes with.
All of that is the traced copy of the model that `minivllm.model_executor.decode_view`
makes (the model's own code has no decode-graph branch); each step's block tables,
context lengths and slots are the forward context's `DecodeStep`, an argument of
the compiled call.

One trace (a batch of 2 with 2 blocks per request, both marked dynamic) serves
every batch size and context length, and runs without Dynamo's guards, like the
piecewise forward.  It is traced and compiled when the KV cache is bound
(start-up 4/4); with the compile cache on, that trace is saved like the model
forward's and a later start loads it (`minivllm.compilation.traced_call`).  Steps that are not plain decode (prefill chunks, speculative
tokens, more than `DECODE_GRAPH_MAX_SEQS` requests) keep the piecewise forward.

Used in the ``VLLM_COMPILE`` mode on CPU without tensor or pipeline parallelism,
for generating models (with or without LoRA), when every attention layer uses the
CPU backend, the KV cache is not fp8 and ``calculate_kv_scales`` is off;
``MINIVLLM_CPU_DECODE_GRAPH=0`` turns it off.  The saved trace lives under the
config hash, which covers the LoRA config (on or off, ``max_loras``,
``max_lora_rank``, ``lora_dtype``, target modules), and is checked against the
shapes of the traced module's tensors, the LoRA slots and slot mask among them
(`name_lora_mask`), also with an explicit ``cache_dir``: a LoRA engine never loads
the trace of a LoRA-less one, nor one of other slots or ranks.
`decode_graph_wanted` is the one place that decides.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from minivllm import envs
from minivllm.attention.forward_context import DecodeStep, set_forward_context
from minivllm.attention.metadata import AttentionMetadata
from minivllm.attention.paged_kv import is_fp8, resolve_kv_cache_dtype
from minivllm.compilation.backend import VllmBackend
from minivllm.compilation.traced_call import trace_once
from minivllm.config.compilation.modes import CompilationMode
from minivllm.kernels import lowbit_cpu
from minivllm.logger import init_logger
from minivllm.lora.layers import LoRALinear
from minivllm.math_utils import cdiv
from minivllm.model_executor.decode_view import LAYER_BOUNDARY_OP, DecodeView, decode_view
from minivllm.model_executor.layers.quantized_linear import Q4_MAX_TOKENS

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)

DECODE_GRAPH_MAX_SEQS = Q4_MAX_TOKENS
"""Most requests a decode-graph step takes (64); its attention computes every request
over the longest context of the batch (masked), which suits small batches.  The
most rows minivllm's int4 kernel takes, so the graph calls that kernel directly
(`minivllm.model_executor.layers.quantized_linear.q4_kernel_linear`)."""

_MIN_BLOCKS = 2
"""Block-table width is padded to at least this: Dynamo fixes a dimension that
is 1 when traced, and this one must stay dynamic."""


def decode_graph_wanted(vllm_config: VllmConfig, attn_layers: dict[str, Any]) -> str | None:
    """Why the decode graph is not used for this engine, or None when it is."""
    if not envs.cpu_decode_graph():
        return "MINIVLLM_CPU_DECODE_GRAPH=0"
    if envs.batch_invariant():
        return "VLLM_BATCH_INVARIANT=1 (its fused layers round unlike the prefill path)"
    if vllm_config.device_config.device_type != "cpu":
        return "not on CPU"
    if vllm_config.compilation_config.mode != CompilationMode.VLLM_COMPILE:
        return "compilation mode is not VLLM_COMPILE"
    parallel_config = vllm_config.parallel_config
    if parallel_config.tensor_parallel_size > 1 or parallel_config.pipeline_parallel_size > 1:
        return "tensor/pipeline parallelism (the graph is traced for one process)"
    if not attn_layers:
        return "no attention layers"
    model_config = vllm_config.model_config
    if model_config.runner_type == "pooling":
        return "a pooling model (its requests never decode)"
    if is_fp8(resolve_kv_cache_dtype(vllm_config.cache_config.cache_dtype, model_config.dtype)):
        return "fp8 KV cache (the graph's KV write stores values as they are)"
    for layer in attn_layers.values():
        if layer.impl.name != "CPU_SDPA":
            return f"attention backend {layer.impl.name}"
        if layer.calculate_kv_scales:
            return "calculate_kv_scales"
    return None


class CpuDecodeGraph:
    """The compiled decode-step forward of one model (see the module docstring)."""

    def __init__(self, model: nn.Module, vllm_config: VllmConfig, attn_layers: dict[str, Any]):
        self.model = model
        self.attn_layers = attn_layers
        self.dtype: torch.dtype = vllm_config.model_config.dtype
        self.max_seqs = min(DECODE_GRAPH_MAX_SEQS, vllm_config.scheduler_config.max_num_seqs)
        self.block_size = vllm_config.cache_config.block_size
        self.vllm_config = vllm_config
        self.backend: VllmBackend | None = None
        """Compiles the traced graph (made at `warm_up`: its cache directory tells
        whether minivllm's C++ kernels are in the graph)."""
        self.view: DecodeView | None = None
        """The model as the graph traces it (`decode_view`), made at `warm_up`."""
        self.native_attention = False
        """Whether the graph's attention is minivllm's C++ op (its kernels loaded)."""
        self.num_fused_layers = 0
        """Decoder layers that run as minivllm's fused C++ layer in the graph."""
        self._fn: Any = None
        self.ready = False
        self.num_groups = 1
        self.num_steps = 0
        """Decode steps this graph ran (tests and benchmarks read it)."""

    # -- start-up ---------------------------------------------------------------------
    @torch.inference_mode()
    def warm_up(self) -> float:
        """Make the traced copy of the model, trace and compile it (the KV caches
        must be bound); returns seconds spent.

        The trace runs a batch of 2 with 2 blocks each, both dimensions marked
        dynamic, and writes only to the null block (block 0)."""
        start = time.perf_counter()
        self.num_groups = 1 + max(layer.kv_group for layer in self.attn_layers.values())
        self.native_attention = lowbit_cpu.available()
        view, self.num_fused_layers = decode_view(self.model, self.dtype, self.native_attention)
        name_lora_mask(view, self.model)
        self.view = view

        self.backend = VllmBackend(
            self.vllm_config,
            prefix="decode_native" if self.native_attention else "decode",
            splitting_ops=[LAYER_BOUNDARY_OP],
            one_range=True,
        )
        b, groups = 2, range(self.num_groups)
        ids = torch.zeros(b, dtype=torch.long)
        pos = torch.zeros(b, dtype=torch.long)
        lens = torch.ones(b, dtype=torch.int32)
        tables = [torch.zeros(b, _MIN_BLOCKS, dtype=torch.int32) for _ in groups]
        slots = [torch.zeros(b, dtype=torch.long) for _ in groups]
        for t in (ids, pos, lens, *tables, *slots):
            torch._dynamo.mark_dynamic(t, 0)
        for t in tables:
            torch._dynamo.mark_dynamic(t, 1)
        # The caches' block count is left symbolic too: it is not part of the config
        # hash, so a later start that sizes its KV cache otherwise (another
        # --kv-cache-memory-bytes, less free memory) loads the same saved trace and
        # pieces; with the count baked in they failed at the first call.
        caches = {id(layer.kv_cache): layer.kv_cache for layer in self.attn_layers.values()}
        for cache in caches.values():
            if cache is not None and cache.dim() > 1:
                torch._dynamo.mark_dynamic(cache, 1)
        step = DecodeStep(lens, tables, slots)
        with set_forward_context(None, self.attn_layers, decode_step=step) as ctx:
            # Traced once (or its saved trace loaded) and run on the null block.
            # This file marks the dynamic dimensions: its source is part of the
            # saved trace's check.
            self._fn = trace_once(
                view, self.backend, (ids, pos, ctx), extra_modules=frozenset({__name__})
            )
        self.ready = True
        return time.perf_counter() - start

    # -- per step -----------------------------------------------------------------------
    def accepts(self, num_tokens: int, attn_metadata: AttentionMetadata | None) -> bool:
        """Whether this step is a plain decode step the graph can run."""
        return (
            self.ready
            and attn_metadata is not None
            and attn_metadata.max_query_len == 1
            and num_tokens == attn_metadata.num_reqs
            and num_tokens <= self.max_seqs
        )

    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Hidden states of a decode step (`accepts` must have said yes)."""
        n = input_ids.shape[0]
        self.num_steps += 1
        tables, slots = [], []
        for g in range(self.num_groups):
            gmd = (
                attn_metadata
                if attn_metadata.group_metadata is None
                else attn_metadata.group_metadata[g]
            )
            width = max(_MIN_BLOCKS, cdiv(gmd.max_seq_len, self.block_size))
            tables.append(_table(gmd.block_tables, width))
            slots.append(gmd.slot_mapping[:n])
        return self._call(
            input_ids, positions, attn_metadata, DecodeStep(attn_metadata.seq_lens, tables, slots)
        )

    def _call(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        attn_metadata: AttentionMetadata | None,
        step: DecodeStep,
    ) -> torch.Tensor:
        with set_forward_context(attn_metadata, self.attn_layers, decode_step=step) as ctx:
            return self._fn(ids, pos, ctx)


def name_lora_mask(view: nn.Module, model: nn.Module) -> None:
    """Register the LoRA slot mask (`LoRARows.mask`, which the LoRA layers read as an
    attribute) as a buffer of ``view``, so that a saved trace's tensor signature
    (`minivllm.compilation.aot.tensor_signature`) covers the number of slots: slots x
    rank alone would not tell 2 slots of rank 16 from 1 of rank 32."""
    mask = next((m.rows.mask for m in model.modules() if isinstance(m, LoRALinear)), None)
    if mask is not None:
        view.register_buffer("lora_slot_mask", mask, persistent=False)


def _table(block_tables: torch.Tensor, width: int) -> torch.Tensor:
    """The first ``width`` columns of the block tables, contiguous (zeros past the end)."""
    cols = block_tables.shape[1]
    if cols >= width:
        return block_tables[:, :width].contiguous()
    pad = block_tables.new_zeros(block_tables.shape[0], width - cols)
    return torch.cat([block_tables, pad], dim=1)


__all__ = ["DECODE_GRAPH_MAX_SEQS", "CpuDecodeGraph", "decode_graph_wanted", "name_lora_mask"]
