"""The deprecated fields of the older CompilationConfig: translation, warnings, conflicts."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import TypeAdapter

from minivllm.config.compilation import CompilationConfig, CompilationMode, CUDAGraphMode
from minivllm.platforms import CpuPlatform, override_platform

ADAPTER = TypeAdapter(CompilationConfig)


def _via_constructor(**kwargs: Any) -> CompilationConfig:
    return CompilationConfig(**kwargs)


def _via_dict(**kwargs: Any) -> CompilationConfig:
    return ADAPTER.validate_python(kwargs)


BUILDERS = pytest.mark.parametrize("build", [_via_constructor, _via_dict], ids=["ctor", "dict"])


@pytest.fixture(autouse=True)
def _cpu() -> Any:
    with override_platform(CpuPlatform()) as platform:
        yield platform


@BUILDERS
@pytest.mark.parametrize(
    "level, mode",
    [
        (0, CompilationMode.NONE),
        (1, CompilationMode.STOCK_TORCH_COMPILE),
        (2, CompilationMode.DYNAMO_TRACE_ONCE),
        (3, CompilationMode.VLLM_COMPILE),
        ("PIECEWISE", CompilationMode.VLLM_COMPILE),
        ("no_compilation", CompilationMode.NONE),
        ("3", CompilationMode.VLLM_COMPILE),
    ],
)
def test_level_becomes_mode(
    build: Callable[..., CompilationConfig], level: Any, mode: CompilationMode
) -> None:
    with pytest.deprecated_call(match="level is deprecated"):
        cfg = build(level=level)
    assert cfg.mode is mode
    assert cfg.level is None  # translated, then forgotten


@BUILDERS
def test_level_and_same_mode_agree(build: Callable[..., CompilationConfig]) -> None:
    with pytest.deprecated_call():
        assert build(level=3, mode="VLLM_COMPILE").mode is CompilationMode.VLLM_COMPILE


@BUILDERS
def test_level_and_different_mode_conflict(build: Callable[..., CompilationConfig]) -> None:
    with (
        pytest.deprecated_call(),
        pytest.raises(ValueError, match="level=3 and mode=NONE disagree"),
    ):
        build(level=3, mode=0)


def test_invalid_level() -> None:
    with pytest.deprecated_call(), pytest.raises(ValueError, match="Invalid compilation level 9"):
        CompilationConfig(level=9)


@BUILDERS
def test_use_cudagraph_false_means_none(build: Callable[..., CompilationConfig]) -> None:
    with pytest.deprecated_call(match="use_cudagraph is deprecated"):
        cfg = build(use_cudagraph=False)
    assert cfg.cudagraph_mode is CUDAGraphMode.NONE
    assert cfg.use_cudagraph is None
    with pytest.deprecated_call():
        assert (
            build(use_cudagraph=False, cudagraph_mode="NONE").cudagraph_mode is CUDAGraphMode.NONE
        )


@BUILDERS
def test_use_cudagraph_true_leaves_mode_unset(build: Callable[..., CompilationConfig]) -> None:
    with pytest.deprecated_call():
        assert build(use_cudagraph=True).cudagraph_mode is None
    with pytest.deprecated_call():
        assert build(use_cudagraph=True, cudagraph_mode="FULL").cudagraph_mode is CUDAGraphMode.FULL


@BUILDERS
def test_use_cudagraph_false_conflicts_with_a_graph_mode(
    build: Callable[..., CompilationConfig],
) -> None:
    with pytest.deprecated_call(), pytest.raises(ValueError, match="mutually exclusive"):
        build(use_cudagraph=False, cudagraph_mode="PIECEWISE")


@BUILDERS
def test_full_cuda_graph_means_full(build: Callable[..., CompilationConfig]) -> None:
    with pytest.deprecated_call(match="full_cuda_graph is deprecated"):
        cfg = build(full_cuda_graph=True)
    assert cfg.cudagraph_mode is CUDAGraphMode.FULL
    assert cfg.full_cuda_graph is None
    # A mode with full graphs is compatible (and becomes FULL, as before).
    with pytest.deprecated_call():
        assert build(full_cuda_graph=True, cudagraph_mode="FULL_DECODE_ONLY").cudagraph_mode is (
            CUDAGraphMode.FULL
        )
    with pytest.deprecated_call():
        assert build(full_cuda_graph=False).cudagraph_mode is None


@BUILDERS
@pytest.mark.parametrize("mode", ["NONE", "PIECEWISE"])
def test_full_cuda_graph_conflicts_with_a_mode_without_full_graphs(
    build: Callable[..., CompilationConfig], mode: str
) -> None:
    with pytest.deprecated_call(), pytest.raises(ValueError, match="mutually exclusive"):
        build(full_cuda_graph=True, cudagraph_mode=mode)


def test_use_cudagraph_false_and_full_cuda_graph_conflict() -> None:
    with pytest.deprecated_call(), pytest.raises(ValueError, match="full_cuda_graph"):
        CompilationConfig(use_cudagraph=False, full_cuda_graph=True)


@BUILDERS
@pytest.mark.parametrize("flag, backend", [(True, "inductor"), (False, "eager")])
def test_use_inductor_sets_backend(
    build: Callable[..., CompilationConfig], flag: bool, backend: str
) -> None:
    with pytest.deprecated_call(match="use_inductor is deprecated"):
        cfg = build(use_inductor=flag, mode=3)
    assert cfg.backend == backend
    assert cfg.use_inductor is None
    with pytest.deprecated_call():
        assert build(use_inductor=flag, backend=backend).backend == backend


def test_use_inductor_conflicts_with_another_backend() -> None:
    with pytest.deprecated_call(), pytest.raises(ValueError, match="use_inductor"):
        CompilationConfig(use_inductor=False, backend="inductor")


def test_old_config_equals_new_config() -> None:
    with pytest.deprecated_call():
        old = ADAPTER.validate_python(
            {"level": 3, "use_inductor": False, "full_cuda_graph": True, "custom_ops": ["none"]}
        )
    new = CompilationConfig(mode=3, backend="eager", cudagraph_mode="FULL", custom_ops=["none"])
    assert old.compute_hash() == new.compute_hash()
    assert repr(old) == repr(new)


def test_deprecation_is_also_logged(caplog: pytest.LogCaptureFixture) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with caplog.at_level(logging.WARNING, logger="minivllm"):
            CompilationConfig(level=3)
    assert "level is deprecated" in caplog.text


def test_new_spellings_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        CompilationConfig(mode=3, cudagraph_mode="FULL", backend="eager")
