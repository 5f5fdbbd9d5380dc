"""How far an attention backend supports full CUDA graphs.

`CompilationConfig.resolve_cudagraph_mode_and_sizes` downgrades the requested
`CUDAGraphMode` to what the weakest attention backend in the model allows;
`VllmConfig` resolution calls it with the level of the backend that will run
(`minivllm.config.attention.ATTENTION_CG_SUPPORT`).
"""

from __future__ import annotations

import enum


class AttentionCGSupport(enum.Enum):
    """Full-CUDA-graph support of an attention backend; a larger value supports more."""

    ALWAYS = 3
    """Any batch, mixed prefill and decode included, can be captured in a full graph."""
    UNIFORM_BATCH = 2
    """Uniform batches (every request with the same query length, e.g. spec-decode
    verification) can be captured."""
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    """Only uniform batches of one-token decodes can be captured."""
    NEVER = 0
    """No full graphs; only piecewise graphs with attention left outside."""


__all__ = ["AttentionCGSupport"]
