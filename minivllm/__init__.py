"""minivllm: a small, readable LLM inference and serving engine.

``from minivllm import LLM, SamplingParams`` works as in vLLM.  Heavy modules
(torch, the engine) load on first use, so ``minivllm config`` starts fast.
"""

from __future__ import annotations

from typing import Any

from minivllm import envs

# How long idle OpenMP threads spin before sleeping.  libgomp's default (~300k spins)
# made decode 2-30x slower when another process wanted the same cores; sleeping at once
# (OMP_WAIT_POLICY=PASSIVE) made it 1.2-1.45x slower on an idle machine, since every
# parallel region then waits for a futex wake-up.  A short spin keeps most of the speed
# and costs ~1.2x under contention (`benchmarks/omp_wait.py`, README "Machine notes").
# It must be set before torch loads libgomp; a user's own choice wins.
envs.set_default_omp_spin()
# Inductor's kernels go with minivllm's compile cache, not to /tmp (see the function).
envs.set_default_inductor_cache_dir()

__version__ = "0.1.0"

_LAZY = {
    "LLM": "minivllm.entrypoints.llm",
    "SamplingParams": "minivllm.sampling_params",
    "RequestOutput": "minivllm.outputs",
    "CompletionOutput": "minivllm.outputs",
    "EngineArgs": "minivllm.args.engine_args",
    "VllmConfig": "minivllm.config.vllm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'minivllm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = ["__version__", *_LAZY]
