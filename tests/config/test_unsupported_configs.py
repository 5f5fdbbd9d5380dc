"""Sub-configs of subsystems minivllm lacks, and the small supported ones.

The mechanism (`minivllm.config.utils.UnsupportedFeature`): constructing such a
config with a non-default field raises; `check_supported()` (called by
VllmConfig) also raises for configs whose presence alone enables the feature.
"""

from __future__ import annotations

import dataclasses
import logging as std_logging

import pytest
import torch

from minivllm.config.attention import AttentionConfig, HiSparseConfig
from minivllm.config.device import DeviceConfig
from minivllm.config.kernel import IrOpPriorityConfig, KernelConfig
from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.load import LoadConfig
from minivllm.config.logging import LoggingConfig
from minivllm.config.observability import ObservabilityConfig
from minivllm.config.profiler import ProfilerConfig
from minivllm.config.quantization import GGUFConfig, get_quant_config
from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.unsupported.aux_output import AuxOutputConfig
from minivllm.config.unsupported.diffusion import DiffusionConfig
from minivllm.config.unsupported.ec_manager import EncoderCacheManagerConfig
from minivllm.config.unsupported.ec_transfer import ECTransferConfig
from minivllm.config.unsupported.engram import EngramConfig
from minivllm.config.unsupported.mamba import MambaBackendEnum, MambaConfig
from minivllm.config.unsupported.offload import OffloadConfig, UVAOffloadConfig
from minivllm.config.unsupported.watermark import WatermarkConfig
from minivllm.config.unsupported.weight_transfer import WeightTransferConfig
from minivllm.config.utils import UnsupportedFeature, non_default_fields
from minivllm.config.vllm import VllmConfig
from minivllm.platforms import CpuPlatform, CudaPlatform, override_platform

# (class, a non-default setting, words the error must contain, active when present)
CASES = [
    (ECTransferConfig, {"ec_connector": "X"}, "encoder cache transfer", False),
    (DiffusionConfig, {"canvas_length": 8}, "diffusion", True),
    (EngramConfig, {"storage_device": "cuda"}, "Engram", True),
    (WatermarkConfig, {"alpha": 2.0}, "watermarking", True),
    (WeightTransferConfig, {"backend": "ipc"}, "weight transfer", True),
    (EncoderCacheManagerConfig, {"ec_manager_cls": "a.B"}, "encoder cache manager", False),
    (AuxOutputConfig, {"enable_return_routed_experts": True}, "routed experts", False),
    (MambaConfig, {"backend": MambaBackendEnum.FLASHINFER}, "Mamba", False),
    (OffloadConfig, {"offload_backend": "uva"}, "weight offloading", False),
    (HiSparseConfig, {"device_buffer_ratio": 0.5}, "HiSparse", True),
]


@pytest.mark.parametrize(("cls", "kwargs", "words", "active"), CASES)
def test_non_default_construction_raises(cls, kwargs, words, active) -> None:
    with pytest.raises(ValueError) as e:
        cls(**kwargs)
    msg = str(e.value)
    assert words in msg and "not supported by minivllm" in msg
    # The message names the offending setting.
    assert next(iter(kwargs)) in msg


@pytest.mark.parametrize(("cls", "kwargs", "words", "active"), CASES)
def test_default_construction_and_check_supported(cls, kwargs, words, active) -> None:
    cfg = cls()
    assert issubclass(cls, UnsupportedFeature) and cls.SUPPORTED is False
    if active:
        with pytest.raises(ValueError, match="not supported by minivllm"):
            cfg.check_supported()
    else:
        cfg.check_supported()


@pytest.mark.parametrize(("cls", "kwargs", "words", "active"), CASES)
def test_mutation_after_construction_is_caught(cls, kwargs, words, active) -> None:
    cfg = cls()
    for k, v in kwargs.items():
        setattr(cfg, k, v)
    with pytest.raises(ValueError, match=words.split(" (")[0]):
        cfg.check_supported()


def test_every_case_has_field_docstrings() -> None:
    from minivllm.config.utils import field_docs

    for cls, *_ in CASES:
        docs = field_docs(cls)
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in docs]
        assert not missing, (cls.__name__, missing)


def test_non_default_fields_uses_default_factories() -> None:
    cfg = KVTransferConfig(engine_id=None)
    cfg.engine_id = None  # __post_init__ drew a UUID
    assert non_default_fields(cfg) == {}
    cfg.kv_connector_extra_config["x"] = 1
    assert non_default_fields(cfg) == {"kv_connector_extra_config": {"x": 1}}
    with pytest.raises(ValueError, match="weight offloading"):
        OffloadConfig(uva=UVAOffloadConfig(cpu_offload_gb=1))


def test_speculative_predicates_and_kv_transfer_properties() -> None:
    spec = SpeculativeConfig(num_speculative_tokens=3)
    assert spec.method == "ngram" and not spec.use_eagle() and not spec.uses_draft_model()
    assert spec.max_num_new_slots_for_drafting == 0
    draft = SpeculativeConfig(model="some/draft", num_speculative_tokens=2)
    assert draft.uses_draft_model() and draft.max_num_new_slots_for_drafting == 2
    kv = KVTransferConfig()
    assert not kv.is_kv_transfer_instance and not kv.has_connector("NixlConnector")
    assert not ECTransferConfig().is_encode_only
    assert not AuxOutputConfig().enabled


# -- supported small configs -----------------------------------------------------
def test_attention_config() -> None:
    assert AttentionConfig(backend="torch_sdpa").backend == "CPU_SDPA"  # vLLM's name
    with pytest.raises(ValueError, match="flash_attn_version"):
        AttentionConfig(flash_attn_version=3)
    with pytest.raises(ValueError, match="HiSparse"):
        AttentionConfig(hisparse_config=HiSparseConfig())
    sdpa = AttentionConfig(backend="CPU_SDPA")
    assert sdpa.compute_hash() != AttentionConfig().compute_hash()


def test_kernel_config() -> None:
    k = KernelConfig()
    assert k.ir_op_priority.rms_norm == []  # unset: the platform fills it when resolving
    assert k.enable_flashinfer_autotune is None and k.enable_jit_warmup
    empty = KernelConfig()
    empty.set_platform_defaults(None)  # type: ignore[arg-type]  # the CPU platform's
    assert empty.ir_op_priority.fused_add_rms_norm == ["native"]
    # The platform's names are appended after the user's, never repeated.
    given = KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=["vllm_c"]))
    given.set_platform_defaults(None)  # type: ignore[arg-type]
    assert given.ir_op_priority.rms_norm == ["vllm_c", "native"]
    with pytest.raises(ValueError, match="aiter"):
        KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=["aiter"]))
    # Autotuning and warm-up do not change the graph.
    assert KernelConfig(
        enable_jit_warmup=False, enable_flashinfer_autotune=True
    ).compute_hash() == (k.compute_hash())


def test_observability_config() -> None:
    assert ObservabilityConfig().per_request_spec_decode_metrics == "none"
    # vLLM's values parse; without speculative decoding only "none" resolves.
    for value in ("summary", "detailed"):
        metrics = ObservabilityConfig(per_request_spec_decode_metrics=value)
        assert metrics.per_request_spec_decode_metrics == value
        with pytest.raises(ValueError, match="needs speculative decoding"):
            VllmConfig(observability_config=metrics)
    with pytest.raises(ValueError, match="detailed"):
        ObservabilityConfig(per_request_spec_decode_metrics="full")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="OpenTelemetry"):
        ObservabilityConfig(otlp_traces_endpoint="http://x")
    with pytest.raises(ValueError, match="kv_cache_metrics_sample"):
        ObservabilityConfig(kv_cache_metrics_sample=0)


def test_profiler_config(tmp_path) -> None:
    assert ProfilerConfig().profiler is None
    assert ProfilerConfig(profiler="torch", torch_profiler_dir=str(tmp_path)).profiler == "torch"
    with pytest.raises(ValueError, match="torch_profiler_dir"):
        ProfilerConfig(profiler="torch")
    with pytest.raises(ValueError, match="Proton"):
        ProfilerConfig(profiler="proton")


def test_logging_config_and_no_stdlib_shadowing() -> None:
    assert LoggingConfig().log_level is None
    with pytest.raises(ValueError, match="log_stats_interval_s"):
        LoggingConfig(log_stats_interval_s=0)
    # minivllm.config.logging must not hide the standard library's logging.
    assert std_logging.getLogger is not None and hasattr(std_logging, "StreamHandler")


def test_load_config(default_model_config) -> None:
    assert LoadConfig().load_format == "auto"
    with pytest.raises(ValueError, match="never downloads"):
        LoadConfig(download_dir="/tmp/x")
    with pytest.raises(ValueError):
        LoadConfig(load_format="bitsandbytes")  # type: ignore[arg-type]
    assert LoadConfig().resolve_load_format(default_model_config) == "gguf"
    assert LoadConfig(load_format="dummy").resolve_load_format(default_model_config) == "dummy"
    with pytest.raises(ValueError, match="load_format='auto'"):
        LoadConfig(load_format="safetensors").resolve_load_format(default_model_config)


def test_device_config() -> None:
    with override_platform(CpuPlatform()):
        assert DeviceConfig().device_type == "cpu"
        assert DeviceConfig(device="cpu").torch_device == torch.device("cpu")
        with pytest.raises(ValueError, match="no CUDA GPU"):
            DeviceConfig(device="cuda")
    with override_platform(CudaPlatform(device_capability=(9, 0))):
        assert DeviceConfig().device_type == "cuda"
        assert DeviceConfig(device="cuda:1").torch_device == torch.device("cuda:1")
    with pytest.raises(ValueError, match="invalid device"):
        DeviceConfig(device="tpu")


def test_quantization(default_model_config) -> None:
    # The default GGUF (quantized) runs low-bit unless "none" is asked for.
    assert default_model_config.quantization == "gguf"
    from minivllm.config.model import ModelConfig

    qc = get_quant_config(ModelConfig(quantization="gguf"))
    assert isinstance(qc, GGUFConfig) and qc.get_name() == "gguf"
    assert torch.float32 in qc.get_supported_act_dtypes()
    assert not qc.has_blocked_weights()


@pytest.fixture(scope="module")
def default_model_config():
    from minivllm.config.model import ModelConfig

    return ModelConfig()


def test_unknown_field_of_a_refused_subsystem_gets_the_refusal() -> None:
    # A field of a newer vLLM: the feature is refused whatever its fields.
    with pytest.raises(ValueError) as exc:
        WatermarkConfig(some_newer_vllm_field=1)  # type: ignore[call-arg]
    assert "watermarking" in str(exc.value) and "not supported by minivllm" in str(exc.value)
    assert "some_newer_vllm_field=1" in str(exc.value)
    assert "Unexpected keyword argument" not in str(exc.value)
