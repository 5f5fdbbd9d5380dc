"""`OffloadConfig`: model weight offloading to host memory. Not supported by minivllm."""

from __future__ import annotations

from dataclasses import field
from typing import ClassVar, Literal

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors

OffloadBackend = Literal["auto", "uva", "prefetch"]


@config
class UVAOffloadConfig:
    """Weights kept in pinned host memory and read through unified addressing."""

    cpu_offload_gb: float = 0
    """GiB of weights per GPU kept in host memory."""
    cpu_offload_params: set[str] = field(default_factory=set)
    """Only offload parameters whose names contain one of these strings."""


@config
class PrefetchOffloadConfig:
    """Weights of groups of layers prefetched from host memory ahead of use."""

    offload_group_size: int = 0
    """Layers per group (0: off)."""
    offload_num_in_group: int = 1
    """Layers offloaded in each group."""
    offload_prefetch_step: int = 1
    """Groups prefetched ahead."""
    offload_params: set[str] = field(default_factory=set)
    """Only offload parameters whose names contain one of these strings."""


@config
class OffloadConfig(UnsupportedFeature):
    """Configuration for offloading model weights to host memory."""

    FEATURE: ClassVar[str] = "model weight offloading (offload_config)"

    offload_backend: OffloadBackend = "auto"
    """Offloading mechanism; "auto" picks from which sub-config is set."""
    uva: UVAOffloadConfig = field(default_factory=UVAOffloadConfig)
    """Settings of UVA offloading."""
    prefetch: PrefetchOffloadConfig = field(default_factory=PrefetchOffloadConfig)
    """Settings of prefetch offloading."""

    def compute_hash(self) -> str:
        """Offloading changes where weights live: every field counts."""
        return hash_factors(get_hash_factors(self, set()))
