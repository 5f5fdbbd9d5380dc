"""`VllmConfig.__post_init__`: one test per resolution rule, in the order of
vLLM's `VllmConfig.__post_init__`.

CUDA rules are checked by resolving as an SM90 GPU would, with
``override_platform(CudaPlatform(device_capability=(9, 0)))``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from minivllm.config import vllm_rules as rules
from minivllm.config.compilation.modes import CompilationMode, CUDAGraphMode
from minivllm.config.model import ModelConfig
from minivllm.config.optimization import enable_attn_quant_fusion
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.vllm import OptimizationLevel, VllmConfig
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform

SM90 = CudaPlatform(device_capability=(9, 0))
CPU = CpuPlatform()


@pytest.fixture(scope="module")
def model() -> ModelConfig:
    return ModelConfig()  # the default GGUF (SmolLM2-135M-Instruct)


def build(model: ModelConfig | None, platform: Any = SM90, **kwargs: Any) -> VllmConfig:
    """Resolve a config as ``platform`` would (sub-configs given as dicts are built
    inside the override, so their own post-init sees that platform too)."""
    with override_platform(platform):
        return VllmConfig(model_config=copy.deepcopy(model), **kwargs)


def eager_model(model: ModelConfig) -> ModelConfig:
    m = copy.deepcopy(model)
    m.enforce_eager = True
    return m


# -- compilation mode --------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "mode"),
    [
        (OptimizationLevel.O0, CompilationMode.NONE),
        (OptimizationLevel.O1, CompilationMode.VLLM_COMPILE),
        (OptimizationLevel.O2, CompilationMode.VLLM_COMPILE),
        (OptimizationLevel.O3, CompilationMode.VLLM_COMPILE),
    ],
)
def test_default_mode_follows_the_level(model, level, mode) -> None:
    cfg = build(model, optimization_level=level)
    assert cfg.compilation_config.mode == mode
    assert cfg.explain()["compilation_config.mode"]["rule"] == "default_compilation_mode"


def test_user_mode_is_kept_at_o0(model) -> None:
    cfg = build(model, optimization_level=0, compilation_config={"mode": 3})
    assert cfg.compilation_config.mode == CompilationMode.VLLM_COMPILE


def test_enforce_eager_turns_off_compile_graphs_and_warmup(model) -> None:
    cfg = build(eager_model(model))
    compilation_config = cfg.compilation_config
    assert compilation_config.mode == CompilationMode.NONE
    assert compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert (
        compilation_config.cudagraph_capture_sizes == []
        and compilation_config.max_cudagraph_capture_size == 0
    )
    assert cfg.kernel_config.enable_jit_warmup is False
    assert cfg.explain()["compilation_config.mode"]["rule"] == "enforce_eager"


def test_torch_compile_disable_env(model, monkeypatch) -> None:
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    cfg = build(model)
    assert cfg.compilation_config.mode == CompilationMode.NONE
    assert cfg.explain()["compilation_config.mode"]["rule"] == "TORCH_COMPILE_DISABLE"
    # Without piecewise compilation, FULL_AND_PIECEWISE keeps only the full decode graphs.
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY


def test_ir_torch_wrap_only_for_vllm_compile_with_inductor(model) -> None:
    assert build(model).compilation_config.ir_enable_torch_wrap is True
    assert build(model, optimization_level=0).compilation_config.ir_enable_torch_wrap is False
    eager_backend = build(model, compilation_config={"backend": "eager"})
    assert eager_backend.compilation_config.ir_enable_torch_wrap is False


def test_default_custom_ops(model) -> None:
    assert build(model).compilation_config.custom_ops == ["none"]
    assert build(model, optimization_level=0).compilation_config.custom_ops == ["all"]
    user = build(model, compilation_config={"custom_ops": ["all", "-rms_norm"]})
    assert user.compilation_config.custom_ops == ["all", "-rms_norm"]


# -- CUDA graph mode ---------------------------------------------------------------


def test_cpu_has_no_static_graphs(model) -> None:
    cfg = build(model, CPU, compilation_config={"cudagraph_capture_sizes": [1, 2]})
    compilation_config = cfg.compilation_config
    assert compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert (
        compilation_config.cudagraph_capture_sizes == []
        and compilation_config.max_cudagraph_capture_size == 0
    )
    entry = cfg.explain()["compilation_config.cudagraph_mode"]
    assert entry["source"] == "platform"
    assert entry["reason"] == (
        "cudagraph_mode FULL_AND_PIECEWISE -> NONE: CpuPlatform() has no CUDA graphs "
        "(no static graph mode)"
    )
    # Compilation itself still runs on the CPU.
    assert compilation_config.mode == CompilationMode.VLLM_COMPILE


def test_stock_torch_compile_keeps_only_full_decode_graphs(model) -> None:
    cfg = build(model, compilation_config={"mode": CompilationMode.STOCK_TORCH_COMPILE})
    compilation_config = cfg.compilation_config
    assert compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert compilation_config.cudagraph_capture_sizes and compilation_config.splitting_ops == []
    entry = cfg.explain()["compilation_config.cudagraph_mode"]
    assert entry["rule"] == "_normalize_piecewise_cudagraph_mode"
    assert "FULL_AND_PIECEWISE -> FULL_DECODE_ONLY" in entry["reason"]


def test_piecewise_without_vllm_compile_means_no_graphs(model) -> None:
    cfg = build(model, optimization_level=1, compilation_config={"mode": 2})
    compilation_config = cfg.compilation_config
    assert compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert (
        compilation_config.cudagraph_capture_sizes == []
        and compilation_config.max_cudagraph_capture_size == 0
    )


def test_warmups_on_cuda_with_graphs(model) -> None:
    assert build(model).compilation_config.cudagraph_num_of_warmups == 1
    assert build(eager_model(model)).compilation_config.cudagraph_num_of_warmups == 0


def test_no_model_means_no_capture_sizes() -> None:
    cfg = build(None)
    assert cfg.compilation_config.cudagraph_capture_sizes == []
    assert cfg.compilation_config.max_cudagraph_capture_size == 0


def test_splitting_ops(model) -> None:
    compiled = build(model).compilation_config
    assert compiled.splitting_ops and compiled.splitting_ops_contain_attention()
    assert build(model, optimization_level=0).compilation_config.splitting_ops == []


def test_empty_splitting_ops_turn_piecewise_into_full(model) -> None:
    cfg = build(model, compilation_config={"splitting_ops": []})
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL


# -- scheduling, KV cache -------------------------------------------------------


def test_async_scheduling_defaults_on(model) -> None:
    cfg = build(model)
    assert cfg.scheduler_config.async_scheduling is True
    assert cfg.parallel_config.disable_nccl_for_dp_synchronization is True
    # vLLM's bound counts the early-scheduled second batch of async scheduling.
    assert cfg.max_concurrent_batches == 2
    assert cfg.max_in_flight_tokens == 2 * cfg.scheduler_config.max_num_batched_tokens


def test_async_scheduling_user_choice(model) -> None:
    cfg = build(model, scheduler_config={"async_scheduling": False})
    assert cfg.scheduler_config.async_scheduling is False
    assert cfg.parallel_config.disable_nccl_for_dp_synchronization is False
    assert cfg.max_concurrent_batches == 1


@pytest.mark.parametrize("platform", [CPU, SM90])
def test_hybrid_kv_cache_manager_default(model, platform) -> None:
    cfg = build(model, platform)
    assert cfg.scheduler_config.disable_hybrid_kv_cache_manager is False


def test_hybrid_kv_cache_manager_forced_on_where_unsupported(model) -> None:
    class NoHybridPlatform(CpuPlatform):
        def support_hybrid_kv_cache(self) -> bool:
            return False

    assert build(model, NoHybridPlatform()).scheduler_config.disable_hybrid_kv_cache_manager
    with pytest.raises(ValueError, match="hybrid KV cache manager"):
        build(
            model,
            NoHybridPlatform(),
            scheduler_config={"disable_hybrid_kv_cache_manager": False},
        )


def test_block_size_from_platform_and_cuda_limit(model) -> None:
    cfg = build(model)
    assert cfg.cache_config.block_size == 16
    assert cfg.explain()["cache_config.block_size"]["source"] == "platform"
    with pytest.raises(ValueError, match="at most 32"):
        build(model, cache_config={"block_size": 64})
    assert build(model, CPU, cache_config={"block_size": 64}).cache_config.block_size == 64


def test_gguf_quant_config(model) -> None:
    # The default GGUF runs low-bit (on CPU); "none" dequantizes: no quantization method.
    assert build(model, CPU).quant_config.get_name() == "gguf"
    assert build(ModelConfig(quantization="gguf"), CPU).quant_config.get_name() == "gguf"
    assert build(ModelConfig(quantization="none"), CPU).quant_config is None
    assert build(None).quant_config is None


def test_int8_per_channel_quant_config(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)  # fmt: skip
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(tmp_path)
    int8 = ModelConfig(model=str(tmp_path), quantization="int8_per_channel")
    built = build(int8, CPU)
    assert built.quant_config.get_name() == "int8_per_channel"
    assert not enable_attn_quant_fusion(built)  # weight-only: nothing to fuse
    with pytest.raises(ValueError, match="CPU only.*--device cpu"):
        build(int8, SM90)
    for parallel in ({"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}):
        with pytest.raises(ValueError, match="int8_per_channel.*run on one process"):
            build(int8, CPU, parallel_config=parallel)


def test_default_gguf_dequantizes_under_parallelism(model) -> None:
    pp2 = {"pipeline_parallel_size": 2, "distributed_executor_backend": "mp"}
    dequantized = ModelConfig(quantization="none")
    cfg = build(model, CPU, parallel_config=pp2)
    assert cfg.model_config.quantization is None and cfg.quant_config is None
    why = cfg.explain()["model_config.quantization"]
    assert why["rule"] == "gguf_with_parallelism", why
    # The compile cache key follows the resolved value: the same as asking for "none".
    assert cfg.compute_hash() == build(dequantized, CPU, parallel_config=pp2).compute_hash()
    assert build(model, CPU).compute_hash() != build(dequantized, CPU).compute_hash()
    tp3 = {"tensor_parallel_size": 3, "distributed_executor_backend": "mp"}
    assert build(model, CPU, parallel_config=tp3).model_config.quantization is None
    # Asked for explicitly, low-bit weights under TP/PP are refused with the fix.
    with pytest.raises(ValueError, match="quantization none"):
        build(ModelConfig(quantization="gguf"), CPU, parallel_config=pp2)


def test_debug_dump_path_is_absolute_and_rank_aware(model) -> None:
    cfg = build(model, compilation_config={"debug_dump_path": "dump"})
    assert cfg.compilation_config.debug_dump_path == Path("dump").absolute()
    assert cfg.compile_debug_dump_path() == Path("dump").absolute() / "rank_0_dp_0"
    assert build(model).compile_debug_dump_path() is None


# -- unsupported sub-configs and properties ------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("speculative_config", {"method": "eagle", "num_speculative_tokens": 2}),
        ("kv_transfer_config", {"kv_connector": "NixlConnector", "kv_role": "kv_both"}),
        ("diffusion_config", {}),
    ],
)
def test_unsupported_subconfigs_raise(name, value) -> None:
    with pytest.raises(ValueError, match="not supported"):
        build(None, **{name: value})


def test_derived_properties(model) -> None:
    cfg = build(model)
    assert cfg.num_speculative_tokens == 0
    assert cfg.uniform_decode_query_len == 1
    assert cfg.num_lookahead_tokens == 0
    assert cfg.num_prefill_lookahead_tokens == 0
    assert cfg.use_v2_model_runner is False
    assert cfg.needs_dp_coordinator is False
    assert cfg.use_cumem_cudagraph_pool is False
    assert "SmolLM2" in str(cfg)


def test_instance_id(model) -> None:
    assert build(model).instance_id
    assert build(model, instance_id="mine").instance_id == "mine"


def test_negative_shutdown_timeout() -> None:
    with pytest.raises(ValueError, match="shutdown_timeout"):
        build(None, shutdown_timeout=-1)


# -- rules whose inputs minivllm's sub-configs cannot produce yet ---------------------
# (pooling / encoder-decoder models, pipeline and context parallelism): checked on
# stand-ins so the rule itself stays right when the sub-configs grow.


def _stub(mode: CUDAGraphMode, **model: Any) -> SimpleNamespace:
    model = {"pooler_config": None, "is_encoder_decoder": False, **model}
    return SimpleNamespace(
        model_config=SimpleNamespace(**model),
        compilation_config=SimpleNamespace(cudagraph_mode=mode),
    )


def test_pooling_models_drop_full_graphs() -> None:
    cfg = _stub(CUDAGraphMode.FULL_AND_PIECEWISE, pooler_config=object())
    rules.adjust_cudagraph_mode_for_model(cfg)
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.PIECEWISE


def test_encoder_decoder_models_use_full_decode_only() -> None:
    cfg = _stub(CUDAGraphMode.PIECEWISE, is_encoder_decoder=True)
    rules.adjust_cudagraph_mode_for_model(cfg)
    assert cfg.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY


def test_async_scheduling_off_with_pipeline_parallelism() -> None:
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=None),
        parallel_config=SimpleNamespace(
            distributed_executor_backend="mp",
            pipeline_parallel_size=2,
            prefill_context_parallel_size=1,
            enable_batch_sharded_sampling=None,
        ),
        model_config=None,
        use_v2_model_runner=False,
    )
    with override_platform(SM90):
        rules.resolve_async_scheduling(cfg)
    assert cfg.scheduler_config.async_scheduling is False
    with pytest.raises(ValueError, match="pipeline parallelism with async scheduling"):
        cfg.scheduler_config.async_scheduling = True
        rules.validate_model_runner(cfg)


def test_block_size_must_fit_context_parallel_interleave() -> None:
    cfg = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=16),
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=2, cp_kv_cache_interleave_size=32
        ),
    )
    with pytest.raises(ValueError, match="cp_kv_cache_interleave_size"):
        VllmConfig.validate_block_size(cfg)
    cfg.parallel_config.cp_kv_cache_interleave_size = 8
    VllmConfig.validate_block_size(cfg)


def test_unset_max_num_seqs_follows_a_small_token_budget() -> None:
    cfg = VllmConfig(scheduler_config=SchedulerConfig.default_factory(max_num_batched_tokens=64))
    assert cfg.scheduler_config.max_num_seqs == 64
    assert cfg.scheduler_config.max_num_batched_tokens == 64
