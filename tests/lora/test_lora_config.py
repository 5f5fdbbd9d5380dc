"""`LoRAConfig`: vLLM's fields, defaults and checks; the flags that build it; the hash."""

from __future__ import annotations

import pytest
import torch

from minivllm.args.engine_args import EngineArgs, FlexibleArgumentParser
from minivllm.config.lora import LoRAConfig
from minivllm.config.model import ModelConfig
from minivllm.config.vllm import VllmConfig
from minivllm.lora.request import LoRARequest


@pytest.fixture(scope="module")
def model() -> ModelConfig:
    return ModelConfig()  # the default GGUF model


def test_defaults_follow_vllm() -> None:
    cfg = LoRAConfig()
    assert (cfg.max_lora_rank, cfg.max_loras, cfg.fully_sharded_loras) == (16, 1, False)
    assert cfg.max_cpu_loras == 1  # None resolves to max_loras
    assert cfg.lora_dtype == "auto"
    assert LoRAConfig(max_loras=4).max_cpu_loras == 4


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_lora_rank": 12}, "must be one of [1, 8, 16, 32, 64, 128, 256, 320, 512]"),
        ({"max_loras": 0}, "max_loras (0) must be >= 1"),
        ({"max_loras": 4, "max_cpu_loras": 2}, "max_cpu_loras (2) must be >= max_loras (4)"),
        ({"lora_dtype": "int8"}, "lora_dtype"),
        ({"target_modules": ["lm_head"]}, "['lm_head'] are not LoRA modules"),
        ({"default_mm_loras": {"image": "/x"}}, "multimodal"),
    ],
)
def test_bad_values_are_refused_with_the_fix(kwargs, words) -> None:
    with pytest.raises(ValueError) as exc:
        LoRAConfig(**kwargs)
    assert words in str(exc.value)


def test_verify_with_model_config_resolves_the_dtype(model) -> None:
    cfg = VllmConfig(model_config=model, lora_config=LoRAConfig())
    assert cfg.lora_config is not None and cfg.lora_config.lora_dtype == model.dtype
    named = VllmConfig(model_config=model, lora_config=LoRAConfig(lora_dtype="bfloat16"))
    assert named.lora_config is not None and named.lora_config.lora_dtype is torch.bfloat16


def test_the_config_hash_changes_with_lora(model) -> None:
    plain = VllmConfig(model_config=model).compute_hash()
    with_lora = VllmConfig(model_config=model, lora_config=LoRAConfig()).compute_hash()
    rank32 = VllmConfig(model_config=model, lora_config=LoRAConfig(max_lora_rank=32))
    cpu = VllmConfig(model_config=model, lora_config=LoRAConfig(max_cpu_loras=8))
    assert len({plain, with_lora, rank32.compute_hash()}) == 3
    assert cpu.compute_hash() == with_lora  # the host cache does not shape the graph


def test_flags_build_the_config_only_with_enable_lora() -> None:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    flags = ["--max-loras", "4", "--max-lora-rank", "32", "--max-cpu-loras", "6"]
    on = EngineArgs.from_cli_args(parser.parse_args(["--enable-lora", *flags]))
    cfg = on.create_engine_config().lora_config
    assert cfg is not None
    assert (cfg.max_loras, cfg.max_lora_rank, cfg.max_cpu_loras) == (4, 32, 6)
    off = EngineArgs.from_cli_args(parser.parse_args(flags))
    assert off.create_engine_config().lora_config is None
    keywords = EngineArgs(enable_lora=True, max_loras=2).create_engine_config()
    assert keywords.lora_config is not None and keywords.lora_config.max_loras == 2


def test_a_bad_flag_names_the_flag() -> None:
    with pytest.raises(ValueError, match="max_lora_rank"):
        EngineArgs(enable_lora=True, max_lora_rank=7).create_engine_config()


def test_lora_request_is_vllms() -> None:
    req = LoRARequest("sql", 1, "/adapters/sql")
    assert (req.lora_name, req.lora_int_id, req.lora_path) == ("sql", 1, "/adapters/sql")
    assert (req.name, req.adapter_id, req.path) == ("sql", 1, "/adapters/sql")
    with pytest.raises(ValueError, match="lora_int_id must be > 0"):
        LoRARequest("sql", 0, "/adapters/sql")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from model_helpers import save_random_hf_model

    path = tmp_path_factory.mktemp("tiny")
    save_random_hf_model(path, tie_word_embeddings=False)
    return str(path)


def test_tensor_parallel_is_served_pipeline_parallel_refused(tiny_model) -> None:
    args = dict(model=tiny_model, enable_lora=True, max_lora_rank=8)
    tp = EngineArgs(**args, tensor_parallel_size=2, fully_sharded_loras=True)
    cfg = tp.create_engine_config()
    assert cfg.lora_config is not None and cfg.lora_config.fully_sharded_loras
    assert cfg.parallel_config.tensor_parallel_size == 2
    with pytest.raises(ValueError, match="with pipeline parallelism"):
        EngineArgs(**args, pipeline_parallel_size=2).create_engine_config()


def test_fully_sharded_loras_needs_a_rank_the_tp_ranks_split(tiny_model) -> None:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    flags = ["--model", tiny_model, "--enable-lora", "--fully-sharded-loras", "-tp", "2"]
    args = EngineArgs.from_cli_args(parser.parse_args([*flags, "--max-lora-rank", "1"]))
    with pytest.raises(ValueError, match=r"max_lora_rank \(1\) is not divisible by"):
        args.create_engine_config()
    # Unsharded LoRA takes any rank under TP.
    flags.remove("--fully-sharded-loras")
    args = EngineArgs.from_cli_args(parser.parse_args([*flags, "--max-lora-rank", "1"]))
    assert args.create_engine_config().lora_config is not None
