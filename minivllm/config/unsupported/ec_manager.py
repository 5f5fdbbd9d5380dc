"""`EncoderCacheManagerConfig`: the encoder-output cache of multimodal models.

minivllm runs text models only, so only the default is accepted.
"""

from __future__ import annotations

from typing import ClassVar

from minivllm.config.utils import UnsupportedFeature, config, hash_factors


@config
class EncoderCacheManagerConfig(UnsupportedFeature):
    """Configuration for a custom encoder cache manager."""

    FEATURE: ClassVar[str] = "custom encoder cache managers (ec_manager_config)"

    ec_manager_cls: str | None = None
    """Qualified name of a custom encoder cache manager class."""
    ec_manager_extra_config: dict[str, object] | None = None
    """Options passed to the custom manager."""

    def compute_hash(self) -> str:
        """The encoder cache does not change the language model graph: no factors."""
        return hash_factors([])
