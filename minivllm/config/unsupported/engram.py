"""`EngramConfig`: n-gram embedding (Engram) storage and sharding. Not supported."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors

if TYPE_CHECKING:
    from minivllm.config.model import ModelConfig
    from minivllm.config.parallel import ParallelConfig


@config
class EngramConfig(UnsupportedFeature):
    """Configuration for n-gram embedding tables (DeepSeek V4.1 Engram)."""

    FEATURE: ClassVar[str] = "Engram n-gram embeddings (engram_config)"
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = True

    storage_device: str = "cpu"
    """Where the n-gram embedding tables live."""
    dp_shared_memory: bool | None = None
    """Share the tables between data-parallel ranks on a node (None: auto)."""

    def verify_model_config(self, model_config: ModelConfig) -> None:
        self.check_supported()

    def resolve_dp_shared_memory(self, parallel_config: ParallelConfig) -> None:
        self.check_supported()

    def verify_parallel_config(self, parallel_config: ParallelConfig) -> None:
        self.check_supported()

    def compute_hash(self) -> str:
        return hash_factors(get_hash_factors(self, set()))
