"""Per-step state of a forward pass, entered with ``with set_forward_context(...)``.

Attention layers read the step's metadata from here rather than taking it as
an argument, so the model code stays plain and a compiled graph can treat
attention as an opaque op.  The state lives in a `contextvars.ContextVar`, not
a module global, and is only set inside the ``with`` block.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

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


_current: contextvars.ContextVar[ForwardContext | None] = contextvars.ContextVar(
    "minivllm_forward_context", default=None
)


@contextmanager
def set_forward_context(
    attn_metadata: AttentionMetadata | None, no_compile_layers: dict[str, Any] | None = None
) -> Iterator[ForwardContext]:
    """Make ``attn_metadata`` visible to every layer inside the block."""
    ctx = ForwardContext(attn_metadata, dict(no_compile_layers or {}))
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
