"""CompilationConfig: fields, defaults, parsing and post-init validation."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from minivllm.config.compilation import (
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    DynamicShapesConfig,
    DynamicShapesType,
    PassConfig,
)
from minivllm.config.utils import field_docs
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform

ADAPTER = TypeAdapter(CompilationConfig)

# Every field of vLLM's CompilationConfig with its documented default (before VllmConfig resolves it).
DEFAULTS: dict[str, Any] = {
    "mode": None,
    "debug_dump_path": None,
    "cache_dir": "",
    "compile_cache_save_format": "binary",
    "custom_ops": [],
    "ir_enable_torch_wrap": None,
    "splitting_ops": None,
    "compile_mm_encoder": False,
    "cudagraph_mm_encoder": False,
    "encoder_cudagraph_token_budgets": [],
    "encoder_cudagraph_max_vision_items_per_batch": 0,
    "encoder_cudagraph_max_frames_per_batch": None,
    "cudagraph_decoder_replay": True,
    "decoder_replay_cudagraph_capture_sizes": [],
    "decoder_replay_trim_threshold": 768,
    "compile_sizes": None,
    "compile_ranges_endpoints": None,
    "inductor_passes": {},
    "cudagraph_mode": None,
    "use_breakable_cudagraph": None,
    "cudagraph_num_of_warmups": 0,
    "cudagraph_capture_sizes": None,
    "prefill_cudagraph_capture_token_sizes": None,
    "max_prefill_cudagraph_capture_tokens": None,
    "decode_cudagraph_capture_request_sizes": None,
    "max_decode_cudagraph_capture_requests": None,
    "max_decode_cudagraph_capture_tokens": None,
    "cudagraph_copy_inputs": False,
    "cudagraph_specialize_lora": True,
    "use_inductor_graph_partition": None,
    "max_cudagraph_capture_size": None,
    "local_cache_dir": None,
    "fast_moe_cold_start": None,
    "enabled_custom_ops": Counter(),
    "disabled_custom_ops": Counter(),
    "traced_files": set(),
    "compilation_time": 0.0,
    "encoder_compilation_time": 0.0,
    "static_forward_context": {},
    "static_all_moe_layers": [],
    # Deprecated spellings: unset unless given.
    "level": None,
    "use_inductor": None,
    "use_cudagraph": None,
    "full_cuda_graph": None,
}
# Fields whose default is filled in by post-init.
RESOLVED = {"backend", "inductor_compile_config", "pass_config", "dynamic_shapes_config"}
RUNTIME_ONLY = {
    "local_cache_dir",
    "enabled_custom_ops",
    "disabled_custom_ops",
    "traced_files",
    "compilation_time",
    "encoder_compilation_time",
    "static_forward_context",
    "static_all_moe_layers",
}


@pytest.fixture
def cpu() -> Any:
    with override_platform(CpuPlatform()) as platform:
        yield platform


@pytest.fixture
def cuda() -> Any:
    with override_platform(CudaPlatform(device_capability=(9, 0))) as platform:
        yield platform


def test_every_field_has_its_documented_default(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MINIVLLM_COMPILE_CACHE_SAVE_FORMAT", raising=False)
    cfg = CompilationConfig()
    names = {f.name for f in dataclasses.fields(cfg)}
    assert names == set(DEFAULTS) | RESOLVED
    for name, default in DEFAULTS.items():
        assert getattr(cfg, name) == default, name
    assert cfg.backend == "inductor"  # the CPU platform's compile backend
    assert cfg.pass_config == PassConfig()
    assert cfg.dynamic_shapes_config == DynamicShapesConfig()
    assert cfg.dynamic_shapes_config.type is DynamicShapesType.BACKED


def test_runtime_fields_are_not_init_arguments() -> None:
    init_false = {f.name for f in dataclasses.fields(CompilationConfig) if not f.init}
    assert init_false == RUNTIME_ONLY
    with pytest.raises(ValidationError, match="compilation_time"):
        CompilationConfig(compilation_time=1.0)  # type: ignore[call-arg]


def test_every_field_has_a_docstring() -> None:
    docs = field_docs(CompilationConfig)
    missing = [f.name for f in dataclasses.fields(CompilationConfig) if not docs.get(f.name)]
    assert missing == []
    pass_docs = field_docs(PassConfig)
    assert all(pass_docs.get(f.name) for f in dataclasses.fields(PassConfig))


def test_unknown_field_names_the_field() -> None:
    with pytest.raises(ValueError, match="cudagraph_modes"):
        CompilationConfig(cudagraph_modes="FULL")  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="bogus_field"):
        ADAPTER.validate_python({"bogus_field": 1})


# -- mode -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value, expected",
    [
        (0, CompilationMode.NONE),
        (1, CompilationMode.STOCK_TORCH_COMPILE),
        (2, CompilationMode.DYNAMO_TRACE_ONCE),
        (3, CompilationMode.VLLM_COMPILE),
        ("vllm_compile", CompilationMode.VLLM_COMPILE),
        ("Dynamo_Trace_Once", CompilationMode.DYNAMO_TRACE_ONCE),
        ("NONE", CompilationMode.NONE),
        ("3", CompilationMode.VLLM_COMPILE),
        (CompilationMode.STOCK_TORCH_COMPILE, CompilationMode.STOCK_TORCH_COMPILE),
    ],
)
def test_mode_parsing(value: Any, expected: CompilationMode) -> None:
    assert CompilationConfig(mode=value).mode is expected
    assert ADAPTER.validate_python({"mode": value}).mode is expected


@pytest.mark.parametrize("bad", ["fast", 4, -1, "7"])
def test_invalid_mode_lists_the_valid_names(bad: Any) -> None:
    with pytest.raises(ValueError) as info:
        CompilationConfig(mode=bad)
    for name in ("NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"):
        assert name in str(info.value)


# -- cudagraph_mode -----------------------------------------------------------------------
@pytest.mark.parametrize("mode", list(CUDAGraphMode))
def test_cudagraph_mode_from_string_any_case(mode: CUDAGraphMode) -> None:
    assert CompilationConfig(cudagraph_mode=mode.name.lower()).cudagraph_mode is mode
    assert CompilationConfig(cudagraph_mode=mode.name.title()).cudagraph_mode is mode
    assert ADAPTER.validate_python({"cudagraph_mode": mode.name}).cudagraph_mode is mode
    assert CompilationConfig(cudagraph_mode=mode).cudagraph_mode is mode


def test_invalid_cudagraph_mode_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match="FULL_AND_PIECEWISE") as info:
        CompilationConfig(cudagraph_mode="partial")
    assert "partial" in str(info.value)


# -- pass_config ------------------------------------------------------------------------------
def test_pass_config_from_dict(cuda: Any) -> None:
    cfg = CompilationConfig(pass_config={"fuse_norm_quant": True, "eliminate_noops": False})
    assert isinstance(cfg.pass_config, PassConfig)
    assert cfg.pass_config.fuse_norm_quant is True
    assert cfg.pass_config.eliminate_noops is False
    cfg2 = ADAPTER.validate_python({"pass_config": {"rope_kvcache_fusion_max_token_num": 64}})
    assert cfg2.pass_config.rope_kvcache_fusion_max_token_num == 64


def test_pass_config_unknown_key() -> None:
    with pytest.raises(ValueError, match="fuse_everything"):
        CompilationConfig(pass_config={"fuse_everything": True})


def test_dynamic_shapes_from_dict() -> None:
    cfg = ADAPTER.validate_python({"dynamic_shapes_config": {"type": "unbacked"}})
    assert cfg.dynamic_shapes_config.type is DynamicShapesType.UNBACKED


# -- custom_ops grammar ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "ops",
    [
        [],
        ["all"],
        ["none"],
        ["none", "+rms_norm", "+silu_and_mul"],
        ["all", "-rms_norm"],
        ["+a", "-b"],
    ],
)
def test_valid_custom_ops(ops: list[str]) -> None:
    assert CompilationConfig(custom_ops=ops).custom_ops == ops


@pytest.mark.parametrize("bad", ["rms_norm", "+", "-", "", "*op", "All"])
def test_invalid_custom_op_syntax(bad: str) -> None:
    with pytest.raises(ValueError, match="Invalid syntax"):
        CompilationConfig(custom_ops=["none", bad])


@pytest.mark.parametrize("ops", [["all", "none"], ["all", "all"], ["none", "+x", "none"]])
def test_at_most_one_base_mode(ops: list[str]) -> None:
    with pytest.raises(ValueError, match="only one base mode"):
        CompilationConfig(custom_ops=ops)


def test_op_cannot_be_both_enabled_and_disabled() -> None:
    with pytest.raises(ValueError, match="both enable and disable .*a, b"):
        CompilationConfig(custom_ops=["all", "+b", "-a", "+a", "-b", "+c"])


OP_NAMES = st.sampled_from(["rms_norm", "silu_and_mul", "rotary_embedding", "quant_fp8"])
ENTRIES = st.one_of(
    st.sampled_from(["all", "none"]),
    st.builds(lambda sign, op: sign + op, st.sampled_from("+-"), OP_NAMES),
    st.text(max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(ENTRIES, max_size=6))
def test_custom_ops_grammar_property(ops: list[str]) -> None:
    """Accepted exactly when every entry is well-formed, there is at most one base mode,
    and no op is both enabled and disabled; then is_custom_op_enabled agrees."""
    well_formed = all(op in ("all", "none") or (len(op) >= 2 and op[0] in "+-") for op in ops)
    bases = [op for op in ops if op in ("all", "none")]
    enabled = {op[1:] for op in ops if op.startswith("+")}
    disabled = {op[1:] for op in ops if op.startswith("-")}
    valid = well_formed and len(bases) <= 1 and not (enabled & disabled)
    if not valid:
        with pytest.raises(ValueError):
            CompilationConfig(custom_ops=list(ops))
        return
    cfg = CompilationConfig(custom_ops=list(ops))
    for op in ["rms_norm", "silu_and_mul", "quant_fp8"]:
        if len(bases) != 1:
            with pytest.raises(ValueError, match="exactly one base mode"):
                cfg.is_custom_op_enabled(op)
        elif bases[0] == "all":
            assert cfg.is_custom_op_enabled(op) == (op not in disabled)
        else:
            assert cfg.is_custom_op_enabled(op) == (op in enabled)


# -- backend -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["", "eager", "inductor"])
def test_vllm_compile_accepts_eager_and_inductor(backend: str, cpu: Any) -> None:
    cfg = CompilationConfig(mode=3, backend=backend)
    assert cfg.backend == (backend or "inductor")


def test_vllm_compile_rejects_other_backends() -> None:
    with pytest.raises(ValueError, match="Invalid backend for piecewise compilation: 'aot_eager'"):
        CompilationConfig(mode="VLLM_COMPILE", backend="aot_eager")


@pytest.mark.parametrize("mode", [None, 0, 1, 2])
def test_other_modes_accept_any_backend(mode: int | None) -> None:
    assert CompilationConfig(mode=mode, backend="aot_eager").backend == "aot_eager"


# -- sizes ---------------------------------------------------------------------------------
def test_decoder_replay_sizes_must_be_positive() -> None:
    assert CompilationConfig(decoder_replay_cudagraph_capture_sizes=[128, 256])
    with pytest.raises(ValueError, match="decoder_replay_cudagraph_capture_sizes must be positive"):
        CompilationConfig(decoder_replay_cudagraph_capture_sizes=[128, 0])


def test_encoder_budgets_must_be_positive() -> None:
    assert CompilationConfig(encoder_cudagraph_token_budgets=[2048, 4096])
    with pytest.raises(ValueError, match="encoder_cudagraph_token_budgets must be positive"):
        CompilationConfig(encoder_cudagraph_token_budgets=[2048, -1])


def test_encoder_batch_limits_must_be_non_negative_when_capturing() -> None:
    with pytest.raises(ValueError, match="max_vision_items_per_batch"):
        CompilationConfig(
            cudagraph_mm_encoder=True, encoder_cudagraph_max_vision_items_per_batch=-1
        )
    with pytest.raises(ValueError, match="max_frames_per_batch"):
        CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_max_frames_per_batch=-2)
    # Without encoder capture the limits are not used, so they are not checked.
    CompilationConfig(encoder_cudagraph_max_vision_items_per_batch=-1)
    CompilationConfig(cudagraph_mm_encoder=True, encoder_cudagraph_max_frames_per_batch=0)


@pytest.mark.parametrize(
    "name, bad, ok",
    [
        ("decoder_replay_trim_threshold", -1, 0),
        ("max_prefill_cudagraph_capture_tokens", -1, 0),
        ("max_decode_cudagraph_capture_requests", -1, 0),
        ("max_decode_cudagraph_capture_tokens", 0, 1),
    ],
)
def test_field_lower_bounds(name: str, bad: int, ok: int) -> None:
    with pytest.raises(ValidationError, match=name):
        CompilationConfig(**{name: bad})
    assert getattr(CompilationConfig(**{name: ok}), name) == ok


def test_compile_sizes_accept_only_the_capture_sizes_string() -> None:
    CompilationConfig(compile_sizes=[1, 8, "cudagraph_capture_sizes"])
    with pytest.raises(ValueError, match="compile_sizes"):
        CompilationConfig(compile_sizes=[1, "all_sizes"])


# -- compile cache format ------------------------------------------------------------------
def test_compile_cache_save_format(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CompilationConfig(compile_cache_save_format="unpacked").compile_cache_save_format == (
        "unpacked"
    )
    with pytest.raises(ValueError, match="'binary' or 'unpacked'"):
        CompilationConfig(compile_cache_save_format="zip")  # type: ignore[arg-type]
    monkeypatch.setenv("MINIVLLM_COMPILE_CACHE_SAVE_FORMAT", "unpacked")
    assert CompilationConfig().compile_cache_save_format == "unpacked"
    monkeypatch.setenv("MINIVLLM_COMPILE_CACHE_SAVE_FORMAT", "tarball")
    with pytest.raises(ValueError, match="MINIVLLM_COMPILE_CACHE_SAVE_FORMAT"):
        CompilationConfig()


# -- inductor options ----------------------------------------------------------------------
def test_inductor_defaults_on_cpu(cpu: Any) -> None:
    cfg = CompilationConfig()
    assert cfg.inductor_compile_config["enable_auto_functionalized_v2"] is False
    assert "combo_kernels" not in cfg.inductor_compile_config  # not supported on CPU
    assert CompilationConfig(
        inductor_compile_config={"enable_auto_functionalized_v2": True}
    ).inductor_compile_config["enable_auto_functionalized_v2"]


def test_inductor_loops_serial_on_few_cpu_cores(cpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from minivllm.config.compilation import checks

    monkeypatch.setattr(checks, "usable_cpu_cores", lambda: 2)
    assert CompilationConfig().inductor_compile_config["cpp.threads"] == 1
    user = CompilationConfig(inductor_compile_config={"cpp.threads": 2})
    assert user.inductor_compile_config["cpp.threads"] == 2
    monkeypatch.setattr(checks, "usable_cpu_cores", lambda: 16)
    assert "cpp.threads" not in CompilationConfig().inductor_compile_config


def test_combo_kernels_on_cuda(cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_DETERMINISTIC", raising=False)
    config = CompilationConfig().inductor_compile_config
    assert config["combo_kernels"] is True
    assert config["benchmark_combo_kernel"] is True
    deterministic = CompilationConfig(inductor_compile_config={"deterministic": True})
    assert deterministic.inductor_compile_config["benchmark_combo_kernel"] is False
    user = CompilationConfig(inductor_compile_config={"combo_kernels": False})
    assert user.inductor_compile_config == {
        "combo_kernels": False,
        "enable_auto_functionalized_v2": False,
    }


def my_pass(graph: Any) -> None:
    """A stand-in Inductor pass for the tests below."""


def test_inductor_passes_by_name_and_callable() -> None:
    by_name = CompilationConfig(inductor_passes={"p": f"{__name__}.my_pass"})
    assert by_name.inductor_compile_config["p"] is my_pass
    direct = CompilationConfig(inductor_passes={"q": my_pass})
    assert direct.inductor_compile_config["q"] is my_pass
    with pytest.raises(ValueError, match="cannot resolve"):
        CompilationConfig(inductor_passes={"r": f"{__name__}.no_such_pass"})


def test_rope_fusions_enable_the_rotary_embedding_op(cuda: Any) -> None:
    cfg = CompilationConfig(pass_config={"enable_qk_norm_rope_fusion": True})
    assert cfg.custom_ops == ["+rotary_embedding"]
    again = CompilationConfig(
        custom_ops=["none", "+rotary_embedding"], pass_config={"enable_qk_norm_rope_fusion": True}
    )
    assert again.custom_ops == ["none", "+rotary_embedding"]
    # On CPU the fusion is turned off first, so the op is not forced on.
    with override_platform(CpuPlatform()):
        assert CompilationConfig(pass_config={"enable_qk_norm_rope_fusion": True}).custom_ops == []


def test_type_adapter_dumps_and_reloads_user_fields() -> None:
    cfg = CompilationConfig(mode=3, cudagraph_mode="FULL", custom_ops=["none", "+rms_norm"])
    runtime = {f.name: True for f in dataclasses.fields(cfg) if not f.init}
    data = ADAPTER.dump_python(cfg, exclude=runtime)
    again = ADAPTER.validate_python(data)
    assert again.compute_hash() == cfg.compute_hash()
    assert ADAPTER.dump_json(cfg)  # JSON-able
