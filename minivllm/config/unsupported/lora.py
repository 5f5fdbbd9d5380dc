"""`LoRAConfig`: serving LoRA adapters. Not supported by minivllm."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig

MaxLoRARanks = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]


@config
class LoRAConfig(UnsupportedFeature):
    """Configuration for LoRA adapters."""

    FEATURE: ClassVar[str] = "LoRA (lora_config)"
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = True

    max_lora_rank: int = 16
    """Largest LoRA rank served."""
    max_loras: int = 1
    """Most LoRAs in one batch."""
    fully_sharded_loras: bool = False
    """Shard all LoRA layers over tensor-parallel ranks."""
    max_cpu_loras: int | None = None
    """Most LoRAs cached in host memory (None: ``max_loras``)."""
    lora_dtype: str = "auto"
    """Dtype of LoRA weights ("auto": the model dtype)."""
    default_mm_loras: dict[str, str] | None = None
    """LoRA applied per modality by default."""

    def verify_with_model_config(self, model_config: ModelConfig | None) -> None:
        """LoRA cannot be combined with any model here."""
        self.check_supported()

    def compute_hash(self) -> str:
        """Ranks and sharding shape the LoRA layers."""
        return hash_factors(get_hash_factors(self, set()))
