"""The configuration system: one module per config class, as in vLLM's ``vllm.config``.

Everything here is re-exported so ``from minivllm.config import VllmConfig,
CompilationConfig, CUDAGraphMode`` works.  Importing this package loads torch
(ModelConfig resolves dtypes); the torch-free scheduler and KV cache never
import it.
"""

from minivllm.config import compilation
from minivllm.config.attention import AttentionConfig, HiSparseConfig
from minivllm.config.cache import CacheConfig

# The compilation package's names, as listed once in its __all__.
from minivllm.config.compilation import *  # noqa: F403
from minivllm.config.device import DeviceConfig
from minivllm.config.kernel import IrOpPriorityConfig, KernelConfig
from minivllm.config.kv_events import KVEventsConfig
from minivllm.config.kv_transfer import KVTransferConfig
from minivllm.config.load import LoadConfig
from minivllm.config.logging import LoggingConfig
from minivllm.config.lora import LoRAConfig
from minivllm.config.model import ModelConfig
from minivllm.config.observability import ObservabilityConfig
from minivllm.config.optimization import OPTIMIZATION_LEVEL_TO_CONFIG, OptimizationLevel
from minivllm.config.parallel import ParallelConfig
from minivllm.config.profiler import ProfilerConfig
from minivllm.config.quantization import GGUFConfig, QuantizationConfig
from minivllm.config.reasoning import ReasoningConfig
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.speculative import SpeculativeConfig
from minivllm.config.structured_outputs import StructuredOutputsConfig
from minivllm.config.unsupported.aux_output import AuxOutputConfig
from minivllm.config.unsupported.diffusion import DiffusionConfig
from minivllm.config.unsupported.ec_manager import EncoderCacheManagerConfig
from minivllm.config.unsupported.ec_transfer import ECTransferConfig
from minivllm.config.unsupported.engram import EngramConfig
from minivllm.config.unsupported.mamba import MambaConfig
from minivllm.config.unsupported.offload import (
    OffloadConfig,
    PrefetchOffloadConfig,
    UVAOffloadConfig,
)
from minivllm.config.unsupported.watermark import WatermarkConfig
from minivllm.config.unsupported.weight_transfer import WeightTransferConfig
from minivllm.config.vllm import (
    VllmConfig,
    get_cached_compilation_config,
    get_current_vllm_config,
    get_layers_from_vllm_config,
    set_current_vllm_config,
)

__all__ = [
    "OPTIMIZATION_LEVEL_TO_CONFIG",
    "AttentionConfig",
    "AuxOutputConfig",
    "CacheConfig",
    "DeviceConfig",
    "DiffusionConfig",
    "ECTransferConfig",
    "EncoderCacheManagerConfig",
    "EngramConfig",
    "GGUFConfig",
    "HiSparseConfig",
    "IrOpPriorityConfig",
    "KVEventsConfig",
    "KVTransferConfig",
    "KernelConfig",
    "LoRAConfig",
    "LoadConfig",
    "LoggingConfig",
    "MambaConfig",
    "ModelConfig",
    "ObservabilityConfig",
    "OffloadConfig",
    "OptimizationLevel",
    "ParallelConfig",
    "PrefetchOffloadConfig",
    "ProfilerConfig",
    "QuantizationConfig",
    "ReasoningConfig",
    "SchedulerConfig",
    "SpeculativeConfig",
    "StructuredOutputsConfig",
    "UVAOffloadConfig",
    "VllmConfig",
    "WatermarkConfig",
    "WeightTransferConfig",
    "get_cached_compilation_config",
    "get_current_vllm_config",
    "get_layers_from_vllm_config",
    "set_current_vllm_config",
    *compilation.__all__,
]
