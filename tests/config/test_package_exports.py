"""`minivllm.config` re-exports every config class, in vLLM's ``vllm.config`` module layout."""

from __future__ import annotations

import importlib

import minivllm.config as config


def test_all_names_resolve() -> None:
    assert len(config.__all__) == len(set(config.__all__))
    for name in config.__all__:
        assert getattr(config, name) is not None, name


def test_vllm_module_layout() -> None:
    layout = {
        "minivllm.config.compilation": [
            "CompilationConfig",
            "CompilationMode",
            "CUDAGraphMode",
            "PassConfig",
            "DynamicShapesConfig",
            "DynamicShapesType",
            "decode_cudagraph_capture_grid",
            "prefill_cudagraph_capture_grid",
        ],
        "minivllm.config.cache": ["CacheConfig"],
        "minivllm.config.vllm": [
            "VllmConfig",
            "OptimizationLevel",
            "set_current_vllm_config",
            "get_current_vllm_config",
            "get_cached_compilation_config",
            "get_layers_from_vllm_config",
        ],
        "minivllm.config.model": ["ModelConfig"],
        "minivllm.config.scheduler": ["SchedulerConfig"],
        "minivllm.config.parallel": ["ParallelConfig"],
    }
    for module_name, names in layout.items():
        module = importlib.import_module(module_name)
        for name in names:
            # The package re-export is the very object the module defines.
            assert getattr(config, name) is getattr(module, name), f"{module_name}.{name}"
