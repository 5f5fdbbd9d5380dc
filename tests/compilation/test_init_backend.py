"""`init_backend`: the torch.compile backend each compilation mode gets (vLLM's
``CompilationConfig.init_backend``, which minivllm keeps in the compilation layer)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from minivllm.compilation import backend as backend_module
from minivllm.compilation.backend import init_backend
from minivllm.config.compilation import CompilationConfig, CompilationMode


def config_of(**compilation: Any) -> Any:
    return types.SimpleNamespace(compilation_config=CompilationConfig(**compilation))


def test_init_backend_needs_a_mode() -> None:
    with pytest.raises(ValueError, match="No compilation mode is set"):
        init_backend(config_of())
    with pytest.raises(ValueError, match="NONE"):
        init_backend(config_of(mode=0))


def custom_backend(graph: Any, example_inputs: Any) -> Any:
    """A stand-in torch.compile backend."""
    return graph


@pytest.mark.parametrize("mode", [1, 2])
def test_init_backend_for_whole_graph_modes(mode: int) -> None:
    assert init_backend(config_of(mode=mode, backend="eager")) == "eager"
    backend = init_backend(config_of(mode=mode, backend=f"{__name__}.custom_backend"))
    assert backend is custom_backend


def test_init_backend_for_vllm_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    created: list[tuple[Any, dict[str, Any]]] = []

    class FakeBackend:
        def __init__(self, vllm_config: Any, **kwargs: Any) -> None:
            created.append((vllm_config, kwargs))

    monkeypatch.setattr(backend_module, "VllmBackend", FakeBackend)
    cfg = config_of(mode=CompilationMode.VLLM_COMPILE)
    backend = init_backend(cfg, prefix="enc", is_encoder=True)
    assert isinstance(backend, FakeBackend)
    assert created == [(cfg, {"prefix": "enc", "is_encoder": True, "use_aot_compile": True})]
