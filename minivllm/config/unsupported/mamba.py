"""`MambaConfig`: Mamba / SSM layer kernels. minivllm runs no Mamba models."""

from __future__ import annotations

import enum
from typing import ClassVar

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors


class MambaBackendEnum(enum.Enum):
    """Kernel family for Mamba state updates."""

    TRITON = "triton"
    FLASHINFER = "flashinfer"


@config
class MambaConfig(UnsupportedFeature):
    """Configuration for Mamba (state-space) layers."""

    FEATURE: ClassVar[str] = "Mamba/SSM models (mamba_config)"

    backend: MambaBackendEnum = MambaBackendEnum.TRITON
    """Kernel family for state updates."""
    enable_stochastic_rounding: bool = False
    """Stochastically round the float16 SSM state cache."""

    def compute_hash(self) -> str:
        """The backend changes the kernels in the graph."""
        return hash_factors(get_hash_factors(self, set()))
