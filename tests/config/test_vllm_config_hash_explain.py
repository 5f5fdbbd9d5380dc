"""`VllmConfig.compute_hash`, provenance (`explain`) and the current-config context."""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
import threading
from typing import Any

import pytest

from minivllm.config.compilation.modes import CUDAGraphMode
from minivllm.config.model import ModelConfig
from minivllm.config.vllm import (
    VllmConfig,
    get_cached_compilation_config,
    get_current_model_prefix,
    get_current_vllm_config,
    get_current_vllm_config_or_none,
    get_layers_from_vllm_config,
    set_current_vllm_config,
)
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform

SM90 = CudaPlatform(device_capability=(9, 0))


@pytest.fixture(scope="module")
def model() -> ModelConfig:
    return ModelConfig()


def build(model: ModelConfig | None, platform: Any = SM90, **kwargs: Any) -> VllmConfig:
    with override_platform(platform):
        return VllmConfig(model_config=copy.deepcopy(model), **kwargs)


# -- hash --------------------------------------------------------------------------


def test_hash_is_ten_hex_chars_and_stable(model) -> None:
    h = build(model).compute_hash()
    assert re.fullmatch(r"[0-9a-f]{10}", h)
    assert build(model).compute_hash() == h


def test_hash_includes_the_version(model) -> None:
    cfg = build(model)
    assert cfg.compute_hash(include_version=False) != cfg.compute_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"optimization_level": 0},  # acts through the compilation config
        {"compilation_config": {"mode": 1}},
        {"cache_config": {"cache_dtype": "fp8"}},
        {"additional_config": {"k": 1}},
    ],
)
def test_hash_changes_with_included_factors(model, change) -> None:
    assert build(model, **change).compute_hash() != build(model).compute_hash()


def test_hash_changes_with_the_model(model) -> None:
    eager = copy.deepcopy(model)
    eager.enforce_eager = True
    assert build(eager).compute_hash() != build(model).compute_hash()
    assert build(None).compute_hash() != build(model).compute_hash()


@pytest.mark.parametrize(
    "change",
    [
        {"instance_id": "abc"},
        {"shutdown_timeout": 30},
        {"logging_config": {"disable_log_stats": True}},
        {"compilation_config": {"debug_dump_path": "/tmp/dump"}},
    ],
)
def test_hash_ignores_non_graph_settings(model, change) -> None:
    assert build(model, **change).compute_hash() == build(model).compute_hash()


# -- provenance ----------------------------------------------------------------------


def test_explicit_user_paths(model) -> None:
    cfg = build(
        model,
        compilation_config={"cudagraph_mode": "PIECEWISE"},
        scheduler_config={"max_num_seqs": 20},
        user_set_paths={"compilation_config.cudagraph_mode", "scheduler_config.max_num_seqs"},
    )
    explained = cfg.explain()
    assert explained["compilation_config.cudagraph_mode"] == {
        "value": "PIECEWISE",
        "source": "user",
    }
    assert explained["scheduler_config.max_num_seqs"] == {"value": 20, "source": "user"}
    assert explained["compilation_config.pass_config.fuse_norm_quant"]["source"] == "level"
    assert explained["compilation_config.mode"]["source"] == "rule"
    assert explained["cache_config.block_size"]["source"] == "platform"
    assert explained["cache_config.gpu_memory_utilization"] == {"value": 0.9, "source": "default"}


def test_user_set_value_changed_by_a_rule_says_why(model) -> None:
    cfg = build(
        model,
        CpuPlatform(),
        compilation_config={"cudagraph_mode": "PIECEWISE"},
        user_set_paths={"compilation_config.cudagraph_mode"},
    )
    entry = cfg.explain()["compilation_config.cudagraph_mode"]
    assert entry["source"] == "platform"
    assert entry["rule"] == "support_static_graph_mode"
    assert entry["reason"].startswith("cudagraph_mode PIECEWISE -> NONE")
    assert cfg.provenance.origins["compilation_config.cudagraph_mode"].before == "PIECEWISE"


def test_user_paths_are_inferred_from_class_defaults(model) -> None:
    cfg = build(model, compilation_config={"cudagraph_mode": "PIECEWISE"}, optimization_level=1)
    explained = cfg.explain()
    assert explained["compilation_config.cudagraph_mode"]["source"] == "user"
    assert explained["optimization_level"]["source"] == "user"
    assert explained["model_config.model"]["source"] == "user"
    assert explained["performance_mode"]["source"] == "default"


def test_unknown_user_path_is_rejected() -> None:
    with pytest.raises(ValueError, match="user_set_paths"):
        build(None, user_set_paths={"no_such_config.x"})


def test_provenance_is_not_a_field_and_not_dumped(model) -> None:
    cfg = build(model)
    names = {f.name for f in dataclasses.fields(cfg)}
    assert "_provenance" not in names and "user_set_paths" not in names
    assert not any(path.startswith("_") for path in cfg.explain())


# -- current config ------------------------------------------------------------------


def test_set_current_vllm_config_is_scoped_and_nests() -> None:
    outer, inner = build(None), build(None, optimization_level=0)
    assert get_current_vllm_config_or_none() is None
    with set_current_vllm_config(outer, prefix="main"):
        assert get_current_vllm_config() is outer
        assert get_cached_compilation_config() is outer.compilation_config
        with set_current_vllm_config(inner, prefix="draft"):
            assert get_current_vllm_config() is inner
            assert get_current_model_prefix() == "draft"
        assert get_current_vllm_config() is outer and get_current_model_prefix() == "main"
    assert get_current_vllm_config_or_none() is None


def test_current_config_is_restored_after_an_error() -> None:
    with pytest.raises(RuntimeError), set_current_vllm_config(build(None)):
        raise RuntimeError("boom")
    assert get_current_vllm_config_or_none() is None


def test_current_config_is_per_thread() -> None:
    seen: list[object] = []
    with set_current_vllm_config(build(None)):
        thread = threading.Thread(target=lambda: seen.append(get_current_vllm_config_or_none()))
        thread.start()
        thread.join()
    assert seen == [None]


def test_default_config_when_none_is_set(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="minivllm"):
        cfg = get_current_vllm_config()
    assert isinstance(cfg, VllmConfig) and cfg.model_config is None
    assert "not set" in caplog.text


def test_get_layers_from_vllm_config() -> None:
    class Attn:
        pass

    class Other:
        pass

    cfg = build(None)
    a0, a1 = Attn(), Attn()
    cfg.compilation_config.static_forward_context.update({"l0": a0, "l1": a1, "x": Other()})
    assert get_layers_from_vllm_config(cfg, Attn) == {"l0": a0, "l1": a1}
    assert get_layers_from_vllm_config(cfg, Attn, ["l1", "x", "missing"]) == {"l1": a1}
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
