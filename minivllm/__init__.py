"""minivllm: a small, readable LLM inference and serving engine.

``from minivllm import LLM, SamplingParams`` works as in vLLM.  Heavy modules
(torch, the engine) load on first use, so ``minivllm config`` starts fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "LLM": "minivllm.entrypoints.llm",
    "SamplingParams": "minivllm.sampling_params",
    "RequestOutput": "minivllm.outputs",
    "CompletionOutput": "minivllm.outputs",
    "EngineArgs": "minivllm.engine.arg_utils",
    "VllmConfig": "minivllm.config.vllm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["__version__", *_LAZY]
