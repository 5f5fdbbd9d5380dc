"""Per-step state of a forward pass, entered with ``with set_forward_context(...)``.

Attention layers read the step's metadata from here rather than taking it as
an argument, so the model code stays plain and a compiled graph can treat
attention as an opaque op.  The state lives in a `contextvars.ContextVar`, not
a module global, and is only set inside the ``with`` block.

Dynamo cannot trace a ``ContextVar`` read, so code compiled as a whole with the
step's tensors inside it (the CPU decode graph, whose attention is inlined) takes
the context as an argument instead and hands it to its modules through a
`ForwardContextHandle` for the length of the call.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from minivllm.attention.metadata import AttentionMetadata
from minivllm.config.compilation.modes import CUDAGraphMode


@dataclass
class ForwardContext:
    """State shared by every layer during one forward pass."""

    attn_metadata: AttentionMetadata | None
    """None during a dummy/profiling run with no KV writes."""
    no_compile_layers: dict[str, Any] = field(default_factory=dict)
    """Attention layers by name (``CompilationConfig.static_forward_context``)."""
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE
    """The graph mode the dispatcher chose for this step: PIECEWISE tells the
    piecewise wrappers to replay (or capture) their graph, FULL marks a whole-forward
    capture, NONE runs eagerly."""
    num_padded_tokens: int | None = None
    """The step's token count after padding to a capture size (None: no padding)."""
    decode_step: DecodeStep | None = None
    """The inputs of a CPU decode-graph step (None for every other forward)."""


@dataclass
class DecodeStep:
    """What the CPU decode graph's inlined attention and fused layers read of one
    decode step (one new token per request); its tensors are graph inputs."""

    seq_lens: torch.Tensor
    """int32 [B]: context length of each request, this step's token included."""
    block_tables: list[torch.Tensor]
    """Per KV cache group, int32 [B, nb]: the blocks holding each request's context
    (``nb * block_size >= max(seq_lens)``; entries past a request's end point at
    the null block and are masked)."""
    slots: list[torch.Tensor]
    """Per KV cache group, int64 [B]: the flat slot this step's K/V go to."""


class ForwardContextHandle:
    """The forward context as modules of a Dynamo-compiled forward read it.

    The compiled forward takes the `ForwardContext` as an argument and sets
    ``context`` for the length of its call; the modules that need the
    step's tensors hold the handle (given them when the forward was built) and read
    ``handle.context``.  Dynamo traces that attribute like the argument itself, so
    each call's tensors are the graph's inputs, and nothing outlives the call.
    """

    def __init__(self) -> None:
        self.context: ForwardContext | None = None

    def decode_step(self) -> DecodeStep:
        """The decode-step inputs of the call under way."""
        ctx = self.context
        assert ctx is not None and ctx.decode_step is not None, "outside a decode-graph call"
        return ctx.decode_step


_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "minivllm_forward_context", default=None
)


@contextmanager
def set_forward_context(
    attn_metadata: AttentionMetadata | None,
    no_compile_layers: dict[str, Any] | None = None,
    decode_step: DecodeStep | None = None,
) -> Iterator[ForwardContext]:
    """Make ``attn_metadata`` (and a decode-graph step's inputs) visible to every
    layer inside the block."""
    ctx = ForwardContext(attn_metadata, dict(no_compile_layers or {}), decode_step=decode_step)
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def get_forward_context() -> ForwardContext:
    """The active context; raises if called outside ``set_forward_context``."""
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError("no forward context: run the model inside set_forward_context()")
    return ctx


def is_forward_context_available() -> bool:
    return _current.get() is not None
