"""Quantization: `QuantizationConfig` objects for ``VllmConfig.quant_config``.

Two weight-only methods, both computed on by the low-bit CPU kernels of
``model_executor/layers/quantized_linear.py``:

- ``gguf`` (`GGUFConfig`): a quantized GGUF file's matrices stay in their
  low-bit form (vLLM's name for it; the default for quantized GGUF files on CPU);
- ``int8_per_channel`` (`Int8PerChannelConfig`): minivllm's own online scheme,
  named like vLLM's load-time ones (``fp8_per_tensor``, ``fp8_per_block``): an
  unquantized HF checkpoint's linear weights are quantized to int8 at load, one
  scale per output channel.

Every other method is refused, both here and by `ModelConfig`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from minivllm.config.load import LoadConfig
    from minivllm.config.model import ModelConfig

SUPPORTED_QUANTIZATION_METHODS = ("gguf", "int8_per_channel")

WEIGHT_ONLY_METHODS = SUPPORTED_QUANTIZATION_METHODS
"""Methods whose activations stay in the model dtype (no output quantization to fuse)."""


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
    """GGUF block-quantized weights, kept low-bit in memory and computed on so."""

    def get_name(self) -> str:
        return "gguf"

    def get_min_capability(self) -> int:
        return 60

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]


class Int8PerChannelConfig(QuantizationConfig):
    """Weight-only int8 computed at load from a float checkpoint (minivllm-specific).

    Every linear layer of the decoder and the LM head gets ``int8 [out, in]``
    weights with one scale per output channel (symmetric: ``max|w| / 127`` of the
    row); the embedding table stays float.  CPU only (torch's int8 CPU kernels).
    """

    def get_name(self) -> str:
        return "int8_per_channel"

    def get_min_capability(self) -> int:
        return 0  # never checked: refused on CUDA

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.float32, torch.bfloat16, torch.float16]


def get_quant_config(
    model_config: ModelConfig, load_config: LoadConfig | None = None
) -> QuantizationConfig:
    """The `QuantizationConfig` for ``model_config.quantization``."""
    method = model_config.quantization
    if method == "gguf":
        return GGUFConfig()
    if method == "int8_per_channel":
        return Int8PerChannelConfig()
    raise ValueError(
        f"quantization method {method!r} is not supported by minivllm (only "
        f"{list(SUPPORTED_QUANTIZATION_METHODS)}: 'gguf' for GGUF files, "
        "'int8_per_channel' for unquantized HF checkpoints)"
    )
