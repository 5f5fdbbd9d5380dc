"""Optimization levels: the per-level defaults table and the fusion predicates."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from minivllm.config import optimization
from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.config.model import ModelConfig
from minivllm.config.optimization import (
    OPTIMIZATION_LEVEL_TO_CONFIG,
    OptimizationLevel,
    enable_act_fusion,
    enable_allreduce_rms_fusion,
    enable_attn_quant_fusion,
    enable_mla_dual_rms_norm_fusion,
    enable_norm_fusion,
    enable_qk_norm_rope_kvcache,
    enable_rope_kvcache_fusion,
    flatten_level_defaults,
)
from minivllm.config.vllm import VllmConfig
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform

SM90 = CudaPlatform(device_capability=(9, 0))
PASS = "compilation_config.pass_config."

# notes/optimization-levels.md; "pred" marks a predicate-valued default.
NOTES_TABLE: dict[str, tuple[Any, Any, Any]] = {
    "compilation_config.cudagraph_mode": (
        CUDAGraphMode.NONE,
        CUDAGraphMode.PIECEWISE,
        CUDAGraphMode.FULL_AND_PIECEWISE,
    ),
    "compilation_config.use_inductor_graph_partition": (False, False, False),
    PASS + "fuse_norm_quant": (False, "pred", "pred"),
    PASS + "fuse_act_quant": (False, "pred", "pred"),
    PASS + "fuse_allreduce_rms": (False, False, "pred"),
    PASS + "fuse_attn_quant": (False, False, "pred"),
    PASS + "fuse_act_padding": (False, "pred", "pred"),
    PASS + "fuse_mla_dual_rms_norm": (False, "pred", "pred"),
    PASS + "fuse_rope_kvcache": (False, False, "pred"),
    PASS + "fuse_qk_norm_rope_kvcache": (False, False, "pred"),
    PASS + "enable_qk_norm_rope_fusion": (False, False, False),
    PASS + "fuse_rope_kvcache_cat_mla": (False, False, "pred"),
    "kernel_config.enable_flashinfer_autotune": (False, True, True),
}


@pytest.fixture(scope="module")
def model() -> ModelConfig:
    return ModelConfig()


def build(model: ModelConfig, level: int, platform: Any = SM90, **kwargs: Any) -> VllmConfig:
    with override_platform(platform):
        return VllmConfig(model_config=copy.deepcopy(model), optimization_level=level, **kwargs)


@pytest.mark.parametrize("level", list(OptimizationLevel))
def test_table_matches_the_notes(level: OptimizationLevel) -> None:
    column = min(int(level), 2)
    table = flatten_level_defaults(OPTIMIZATION_LEVEL_TO_CONFIG[level])
    assert set(table) == set(NOTES_TABLE)
    for path, values in NOTES_TABLE.items():
        expected = values[column]
        if expected == "pred":
            assert callable(table[path]), path
        else:
            assert table[path] == expected, path


def test_o3_is_o2() -> None:
    assert (
        OPTIMIZATION_LEVEL_TO_CONFIG[OptimizationLevel.O3]
        == OPTIMIZATION_LEVEL_TO_CONFIG[OptimizationLevel.O2]
    )


def get_path(cfg: VllmConfig, path: str) -> Any:
    obj: Any = cfg
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("level", list(OptimizationLevel))
def test_each_level_with_nothing_set(model, level: OptimizationLevel) -> None:
    cfg = build(model, level)
    explained = cfg.explain()
    column = min(int(level), 2)
    for path, values in NOTES_TABLE.items():
        value = get_path(cfg, path)
        assert value is not None, path
        if values[column] != "pred":
            assert value == values[column], path
    # A plain GGUF model on one SM90 GPU has no fusion that pays off.
    for path in NOTES_TABLE:
        if path.startswith(PASS):
            assert get_path(cfg, path) is False, path
            assert explained[path]["source"] == "level", path
    assert explained["compilation_config.cudagraph_mode"]["source"] == "level"


@pytest.mark.parametrize("level", [0, 1, 2])
def test_user_set_fields_are_untouched(model, level: int) -> None:
    user = {
        "compilation_config.cudagraph_mode",
        "compilation_config.mode",
        "compilation_config.pass_config.fuse_norm_quant",
    }
    cfg = build(
        model,
        level,
        compilation_config={
            "mode": 3,
            "cudagraph_mode": "FULL",
            "pass_config": {"fuse_norm_quant": True},
        },
        kernel_config={"enable_flashinfer_autotune": level == 0},
        user_set_paths=user | {"kernel_config.enable_flashinfer_autotune"},
    )
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL
    assert cfg.compilation_config.pass_config.fuse_norm_quant is True
    assert cfg.kernel_config.enable_flashinfer_autotune is (level == 0)
    explained = cfg.explain()
    for path in user:
        assert explained[path]["source"] == "user"


def test_level_fills_predicate_from_user_custom_ops(model) -> None:
    ops = {"custom_ops": ["none", "+rms_norm", "+silu_and_mul"]}
    o1 = build(model, 1, compilation_config=ops)
    assert o1.compilation_config.pass_config.fuse_norm_quant is True
    assert o1.compilation_config.pass_config.fuse_act_quant is True
    o0 = build(model, 0, compilation_config=ops)
    assert o0.compilation_config.pass_config.fuse_norm_quant is False


@pytest.mark.parametrize("level", [1, 2, 3])
def test_cuda_without_inductor_prefers_the_cuda_rms_norm(model, level: int) -> None:
    # vLLM's CUDA platform puts its CUDA RMSNorm first when Inductor does not compile
    # (mode NONE), and a non-native head turns norm+quant fusion on, custom ops or not.
    eager = {"mode": 0, "custom_ops": ["none"]}
    cfg = build(model, level, compilation_config=eager)
    assert cfg.kernel_config.ir_op_priority.rms_norm[0] == "vllm_c"
    assert cfg.compilation_config.pass_config.fuse_norm_quant is True
    # Under Inductor the plain torch op comes first and leaves the fusion off.
    compiled = build(model, level)
    assert compiled.kernel_config.ir_op_priority.rms_norm == ["native"]
    assert compiled.compilation_config.pass_config.fuse_norm_quant is False
    # The CPU platform never prefers a CUDA kernel.
    on_cpu = build(model, level, CpuPlatform(), compilation_config=eager)
    assert on_cpu.compilation_config.pass_config.fuse_norm_quant is False
    # O0 leaves every fusion off whatever the priority.
    assert (
        build(model, 0, compilation_config=eager).compilation_config.pass_config.fuse_norm_quant
        is False
    )


def test_cpu_levels_resolve_graph_mode_to_none(model) -> None:
    for level in OptimizationLevel:
        cfg = build(model, level, CpuPlatform())
        assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.NONE


# -- predicates ------------------------------------------------------------------


class _CC:
    """A compilation config stand-in for predicate tests."""

    def __init__(self, ops: list[str], partition: bool = False, kv_split: bool = True) -> None:
        self.custom_ops = ops
        self.use_inductor_graph_partition = partition
        self._kv_split = kv_split

    def is_custom_op_enabled(self, op: str) -> bool:
        if "all" in self.custom_ops:
            return f"-{op}" not in self.custom_ops
        return f"+{op}" in self.custom_ops

    def splitting_ops_contain_kv_cache_update(self) -> bool:
        return self._kv_split


def _cfg(
    ops: list[str] | None = None,
    tp: int = 1,
    quantization: str | None = None,
    **compilation_fields: Any,
):
    return SimpleNamespace(
        compilation_config=_CC(ops or ["none"], **compilation_fields),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        model_config=SimpleNamespace(
            quantization=quantization,
            get_hidden_size=lambda: 576,
            is_nvfp4_quantized=lambda: False,
        ),
        kernel_config=SimpleNamespace(
            ir_op_priority=SimpleNamespace(rms_norm=["native"], fused_add_rms_norm=["native"])
        ),
    )


def test_norm_and_act_fusion_follow_custom_ops() -> None:
    assert not enable_norm_fusion(_cfg())
    assert enable_norm_fusion(_cfg(["none", "+rms_norm"]))
    assert enable_norm_fusion(_cfg(["none", "+quant_fp8"]))
    assert enable_norm_fusion(_cfg(["all"]))
    assert not enable_act_fusion(_cfg(["all", "-silu_and_mul", "-quant_fp8"]))
    assert enable_act_fusion(_cfg(["none", "+silu_and_mul"]))


@pytest.mark.parametrize(
    ("capability", "tp", "expected"),
    [
        ((9, 0), 2, True),
        ((10, 0), 4, True),
        ((9, 0), 1, False),
        ((8, 0), 2, False),
        ((12, 0), 2, False),
    ],
)
def test_allreduce_rms_fusion(monkeypatch, capability, tp, expected) -> None:
    monkeypatch.setattr(optimization, "_has_flashinfer", lambda: True)
    with override_platform(CudaPlatform(device_capability=capability)):
        assert enable_allreduce_rms_fusion(_cfg(tp=tp)) is expected
    with override_platform(CpuPlatform()):
        assert enable_allreduce_rms_fusion(_cfg(tp=tp)) is False


def test_allreduce_rms_fusion_needs_flashinfer(monkeypatch) -> None:
    monkeypatch.setattr(optimization, "_has_flashinfer", lambda: False)
    with override_platform(SM90):
        assert enable_allreduce_rms_fusion(_cfg(tp=2)) is False


def test_rocm_only_fusions_are_off() -> None:
    cfg = _cfg(["all"], partition=True, kv_split=False)
    assert not enable_mla_dual_rms_norm_fusion(cfg)
    assert not enable_qk_norm_rope_kvcache(cfg)
    assert not enable_rope_kvcache_fusion(cfg)


def test_rope_kvcache_mla_fusion_needs_kv_update_in_graph() -> None:
    assert not optimization.enable_rope_kvcache_mla_fusion(_cfg())
    assert optimization.enable_rope_kvcache_mla_fusion(_cfg(partition=True))
    assert optimization.enable_rope_kvcache_mla_fusion(_cfg(kv_split=False))


def test_attn_quant_fusion_only_for_output_quantized_models() -> None:
    assert not enable_attn_quant_fusion(_cfg())
    assert not enable_attn_quant_fusion(_cfg(quantization="gguf"))
    assert enable_attn_quant_fusion(_cfg(quantization="fp8"))
