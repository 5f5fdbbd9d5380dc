"""`CompilationConfig` and everything that decides how the model is compiled and captured.

- `config`: the `CompilationConfig` class (fields, validators, documented methods).
- `modes`: `CompilationMode` and `CUDAGraphMode`.
- `pass_config`, `dynamic_shapes`: the nested `PassConfig` and `DynamicShapesConfig`.
- `checks`: field validation; `legacy`: the older spellings (``level``, ``use_cudagraph``).
- `cudagraph`, `cudagraph_sizes`, `cudagraph_grids`: graph mode resolution and capture sizes.
- `splitting_ops`: which operators split the graph into pieces.
"""

from minivllm.config.attention_support import AttentionCGSupport
from minivllm.config.compilation.checks import resolve_obj_by_qualname
from minivllm.config.compilation.config import CompilationConfig, Range
from minivllm.config.compilation.cudagraph_grids import (
    decode_cudagraph_capture_grid,
    decode_cudagraph_capture_max_tokens,
    decode_cudagraph_capture_shapes,
    prefill_cudagraph_capture_grid,
    varlen_decode_cudagraph_capture_grid,
)
from minivllm.config.compilation.dynamic_shapes import DynamicShapesConfig, DynamicShapesType
from minivllm.config.compilation.modes import CompilationMode, CUDAGraphMode
from minivllm.config.compilation.pass_config import PassConfig

__all__ = [
    "AttentionCGSupport",
    "CUDAGraphMode",
    "CompilationConfig",
    "CompilationMode",
    "DynamicShapesConfig",
    "DynamicShapesType",
    "PassConfig",
    "Range",
    "decode_cudagraph_capture_grid",
    "decode_cudagraph_capture_max_tokens",
    "decode_cudagraph_capture_shapes",
    "prefill_cudagraph_capture_grid",
    "resolve_obj_by_qualname",
    "varlen_decode_cudagraph_capture_grid",
]
