"""`AuxOutputConfig`: auxiliary per-token outputs (routed MoE experts)."""

from __future__ import annotations

from typing import ClassVar

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors


@config
class AuxOutputConfig(UnsupportedFeature):
    """Configuration for auxiliary execution outputs."""

    FEATURE: ClassVar[str] = "auxiliary outputs / routed experts (aux_output_config)"

    enable_return_routed_experts: bool = False
    """Return the experts each token was routed to (MoE models only)."""

    @property
    def enabled(self) -> bool:
        """Whether any auxiliary output is requested."""
        return self.enable_return_routed_experts

    def compute_hash(self) -> str:
        """Returning routed experts adds outputs to the graph."""
        return hash_factors(get_hash_factors(self, set()))
