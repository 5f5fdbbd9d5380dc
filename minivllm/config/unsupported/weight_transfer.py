"""`WeightTransferConfig`: receiving weight updates during RL training. Not supported."""

from __future__ import annotations

from typing import ClassVar

from minivllm.config.utils import UnsupportedFeature, config


@config
class WeightTransferConfig(UnsupportedFeature):
    """Configuration for weight transfer from a trainer."""

    FEATURE: ClassVar[str] = "weight transfer for RL training (weight_transfer_config)"
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = True

    backend: str = "nccl"
    """Transport weights arrive over."""
