"""CompilationConfig.compute_hash (ignored vs hashed factors, cross-process) and __repr__."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from minivllm.config.compilation import CompilationConfig, CUDAGraphMode
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform


@pytest.fixture(autouse=True)
def _cpu() -> Any:
    with override_platform(CpuPlatform()) as platform:
        yield platform


# Documented as not shaping the compiled graph: changing them keeps the hash.
IGNORED_CHANGES: dict[str, Any] = {
    "debug_dump_path": Path("/tmp/dump"),
    "cache_dir": "/tmp/cache",
    "local_cache_dir": "/tmp/cache/rank0",
    "traced_files": {"model.py"},
    "compilation_time": 12.5,
    "encoder_compilation_time": 3.0,
    "enabled_custom_ops": Counter({"rms_norm": 2}),
    "disabled_custom_ops": Counter({"silu_and_mul": 1}),
    "static_forward_context": {"layers.0.attn": object()},
}

# A sample of hashed fields, including both sub-configs.
HASHED_CHANGES: dict[str, Any] = {
    "mode": 3,
    "backend": "eager",
    "custom_ops": ["none", "+rms_norm"],
    "splitting_ops": [],
    "cudagraph_mode": "PIECEWISE",
    "cudagraph_capture_sizes": [1, 2, 4],
    "max_cudagraph_capture_size": 4,
    "compile_sizes": [8],
    "compile_ranges_endpoints": [256],
    "inductor_compile_config": {"max_autotune": True},
    "use_inductor_graph_partition": True,
    "decoder_replay_trim_threshold": 1024,
    "compile_cache_save_format": "unpacked",
    "pass_config": {"fuse_norm_quant": True},
    "dynamic_shapes_config": {"type": "unbacked"},
}


@pytest.mark.parametrize("name", list(IGNORED_CHANGES))
def test_ignored_factor_keeps_the_hash(name: str) -> None:
    cfg = CompilationConfig()
    before = cfg.compute_hash()
    setattr(cfg, name, IGNORED_CHANGES[name])
    assert cfg.compute_hash() == before


def test_ignored_init_fields_through_the_constructor() -> None:
    base = CompilationConfig().compute_hash()
    assert CompilationConfig(cache_dir="/x", debug_dump_path="/y").compute_hash() == base


@pytest.mark.parametrize("name", list(HASHED_CHANGES))
def test_hashed_field_changes_the_hash(name: str) -> None:
    assert (
        CompilationConfig(**{name: HASHED_CHANGES[name]}).compute_hash()
        != CompilationConfig().compute_hash()
    )


def test_runtime_only_moe_layers_are_hashed() -> None:
    # static_all_moe_layers is not in the documented ignore list, so it counts.
    cfg = CompilationConfig()
    before = cfg.compute_hash()
    cfg.static_all_moe_layers = ["layers.0.mlp"]
    assert cfg.compute_hash() != before


def test_pass_config_change_after_init_changes_the_hash() -> None:
    cfg = CompilationConfig()
    before = cfg.compute_hash()
    cfg.pass_config.eliminate_noops = False
    assert cfg.compute_hash() != before


def test_hash_is_a_sha256_hex_digest() -> None:
    digest = CompilationConfig().compute_hash()
    assert len(digest) == 64 and int(digest, 16) >= 0


_SCRIPT = textwrap.dedent(
    """
    from minivllm.config.compilation import CompilationConfig
    from minivllm.platforms import CpuPlatform, override_platform
    with override_platform(CpuPlatform()):
        print(CompilationConfig(
            mode=3, cudagraph_mode="FULL_AND_PIECEWISE", custom_ops=["none", "+rms_norm"],
            compile_sizes=[1, 8], splitting_ops=["minivllm::unified_attention_with_output"],
            pass_config={"fuse_norm_quant": True}, inductor_compile_config={"b": 1, "a": 2},
        ).compute_hash())
    """
)


def test_hash_is_stable_across_processes() -> None:
    expected = CompilationConfig(
        mode=3,
        cudagraph_mode="FULL_AND_PIECEWISE",
        custom_ops=["none", "+rms_norm"],
        compile_sizes=[1, 8],
        splitting_ops=["minivllm::unified_attention_with_output"],
        pass_config={"fuse_norm_quant": True},
        inductor_compile_config={"a": 2, "b": 1},
    ).compute_hash()
    for seed in ("0", "12345"):  # different str hash seeds must not matter
        out = subprocess.run(
            [sys.executable, "-c", _SCRIPT],
            capture_output=True,
            text=True,
            check=True,
            env={**_env(), "PYTHONHASHSEED": seed},
        )
        assert out.stdout.strip().splitlines()[-1] == expected


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.pop("MINIVLLM_COMPILE_CACHE_SAVE_FORMAT", None)
    return env


# -- repr --------------------------------------------------------------------------------
def test_repr_of_default_config_is_empty() -> None:
    assert repr(CompilationConfig()) == "{}"
    assert str(CompilationConfig()) == "{}"


def test_repr_shows_only_non_default_fields() -> None:
    cfg = CompilationConfig(mode=3, cudagraph_mode=CUDAGraphMode.FULL, cache_dir="/tmp/c")
    text = repr(cfg)
    assert text == "{'mode': 'VLLM_COMPILE', 'cache_dir': '/tmp/c', 'cudagraph_mode': 'FULL'}"


def test_repr_shows_only_non_default_pass_config_fields() -> None:
    with override_platform(CudaPlatform(device_capability=(9, 0))):
        cfg = CompilationConfig(pass_config={"fuse_norm_quant": True})
        text = repr(cfg)
    assert "'pass_config': {'fuse_norm_quant': True}" in text
    assert "eliminate_noops" not in text


def test_repr_leaves_out_runtime_state() -> None:
    cfg = CompilationConfig()
    cfg.enabled_custom_ops["rms_norm"] += 1
    cfg.traced_files.add("model.py")
    cfg.compilation_time = 4.0
    cfg.static_forward_context["x"] = object()
    cfg.inductor_compile_config["post_grad_custom_post_pass"] = object()
    assert repr(cfg) == "{}"
