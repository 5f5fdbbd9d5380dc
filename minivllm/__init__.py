"""minivllm: a small, readable LLM inference and serving engine.

``from minivllm import LLM, SamplingParams`` works as in vLLM.  Heavy modules
(torch, the engine) load on first use, so ``minivllm config`` starts fast.
"""

from __future__ import annotations

import os
from typing import Any

# libgomp threads spin-wait by default; on a busy machine that slowed decode 5-10x
# here.  This must happen before torch is imported; a user's own value wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
