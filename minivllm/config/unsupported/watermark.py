"""`WatermarkConfig`: text watermarking during sampling. Not supported by minivllm."""

from __future__ import annotations

from typing import ClassVar

from minivllm.config.utils import UnsupportedFeature, config


@config
class WatermarkConfig(UnsupportedFeature):
    """Configuration for text watermarking."""

    FEATURE: ClassVar[str] = "text watermarking (watermark_config)"
    ACTIVE_WHEN_PRESENT: ClassVar[bool] = True

    algorithm: str = "gumbel"
    """Watermarking scheme (e.g. "gumbel", "dual_key_gumbel")."""
    alpha: float = 1.0
    """Strength parameter of the scheme."""
    key: int = 0
    """Secret key seeding the watermark."""
    allow_target_only_watermarking: bool = False
    """With speculative decoding, watermark target tokens only."""

    @property
    def supports_speculative_decoding(self) -> bool:
        return self.algorithm == "dual_key_gumbel"
