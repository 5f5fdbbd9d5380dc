"""`ECTransferConfig`: transfer of encoder outputs between instances
(encoder/prefill/decode disaggregation). Not supported by minivllm."""

from __future__ import annotations

from dataclasses import field
from typing import Any, ClassVar, Literal

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors

ECRole = Literal["ec_producer", "ec_consumer", "ec_both"]


@config
class ECTransferConfig(UnsupportedFeature):
    """Configuration for distributed encoder cache transfer."""

    FEATURE: ClassVar[str] = "encoder cache transfer (ec_transfer_config)"

    ec_connector: str | None = None
    """Name of the encoder cache connector."""
    engine_id: str | None = None
    """Unique id of this engine for the connector."""
    ec_role: ECRole | None = None
    """Whether this instance produces encoder outputs, consumes them, or both."""
    ec_rank: int | None = None
    """Rank of this instance in the transfer group."""
    ec_parallel_size: int = 1
    """Instances in the transfer group."""
    ec_ip: str = "127.0.0.1"
    """Address for the transfer connection."""
    ec_port: int = 14579
    """Port for the transfer connection."""
    ec_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    """Connector-specific options."""

    @property
    def is_ec_producer(self) -> bool:
        return self.ec_connector is not None and self.ec_role in ("ec_producer", "ec_both")

    @property
    def is_ec_consumer(self) -> bool:
        return self.ec_connector is not None and self.ec_role in ("ec_consumer", "ec_both")

    @property
    def is_encode_only(self) -> bool:
        """A producer that consumes nothing runs the encoder only."""
        return self.is_ec_producer and not self.is_ec_consumer

    def compute_hash(self) -> str:
        """Every field counts."""
        return hash_factors(get_hash_factors(self, set()))
