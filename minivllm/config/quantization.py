"""Quantization: `QuantizationConfig` objects for ``VllmConfig.quant_config``.

minivllm's only quantized format is GGUF (``quantization="gguf"``, the default
for quantized GGUF files on CPU: weights stay low-bit); `GGUFConfig` describes
it. Every other method is refused, both here and by `ModelConfig`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from minivllm.config.load import LoadConfig
    from minivllm.config.model import ModelConfig

SUPPORTED_QUANTIZATION_METHODS = ("gguf",)


class QuantizationConfig:
    """What the engine needs to know about a quantization method."""

    weight_block_size: list[int] | None = None
    """Block shape of block-wise scales (None: not block-wise)."""
    use_deep_gemm: bool | None = False
    """DeepGEMM kernels (never used by minivllm)."""

    def get_name(self) -> str:
        raise NotImplementedError

    def get_min_capability(self) -> int:
        """Lowest CUDA compute capability (as 80 for 8.0) the method runs on."""
        raise NotImplementedError

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        raise NotImplementedError

    def has_blocked_weights(self) -> bool:
        return self.weight_block_size is not None

    def maybe_update_config(
        self, model_name: str, hf_config: Any = None, revision: Any = None
    ) -> None:
        """Adjust to the checkpoint (nothing to do for the supported methods)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class GGUFConfig(QuantizationConfig):
    """GGUF block-quantized weights, kept low-bit and computed on by the CPU kernels."""

    def get_name(self) -> str:
        return "gguf"

    def get_min_capability(self) -> int:
        return 60

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]


def get_quant_config(
    model_config: ModelConfig, load_config: LoadConfig | None = None
) -> QuantizationConfig:
    """The `QuantizationConfig` for ``model_config.quantization``."""
    method = model_config.quantization
    if method == "gguf":
        return GGUFConfig()
    raise ValueError(
        f"quantization method {method!r} is not supported by minivllm (only "
        f"{list(SUPPORTED_QUANTIZATION_METHODS)}, for GGUF files: --quantization gguf)"
    )
