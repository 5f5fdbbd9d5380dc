"""`KVTransferConfig`: KV cache transfer between instances (disaggregated
prefill, KV offloading connectors). Not supported by minivllm."""

from __future__ import annotations

from dataclasses import field
from typing import Any, ClassVar, Literal

from minivllm.config.utils import UnsupportedFeature, config, get_hash_factors, hash_factors

KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@config
class KVTransferConfig(UnsupportedFeature):
    """Configuration for distributed KV cache transfer."""

    FEATURE: ClassVar[str] = "KV transfer connectors (kv_transfer_config)"

    kv_connector: str | None = None
    """Name of the KV connector (e.g. "NixlConnector")."""
    engine_id: str | None = None
    """Unique id of this engine for the connector."""
    kv_buffer_device: str = "cuda"
    """Device of the transfer buffer."""
    kv_buffer_size: float = 1e9
    """Size of the transfer buffer in bytes."""
    kv_role: KVRole | None = None
    """Whether this instance produces KV, consumes it, or both."""
    kv_rank: int | None = None
    """Rank of this instance in the transfer group."""
    kv_parallel_size: int = 1
    """Instances in the transfer group."""
    kv_ip: str = "127.0.0.1"
    """Address for the transfer connection."""
    kv_port: int = 14579
    """Port for the transfer connection."""
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    """Connector-specific options."""
    kv_connector_module_path: str | None = None
    """Module to import the connector from."""
    kv_load_failure_policy: Literal["recompute", "fail"] = "fail"
    """What to do when loading remote KV fails."""

    @property
    def is_kv_transfer_instance(self) -> bool:
        return self.kv_connector is not None and self.kv_role in KV_ROLES

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_consumer", "kv_both")

    def has_connector(self, name: str) -> bool:
        """Whether ``name`` is the connector (or one of a MultiConnector's)."""
        if self.kv_connector == name:
            return True
        if self.kv_connector == "MultiConnector":
            connectors = self.kv_connector_extra_config.get("connectors", [])
            return any(c.get("kv_connector") == name for c in connectors)
        return False

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)

    def compute_hash(self) -> str:
        """The connector hooks into attention layers: every field counts."""
        return hash_factors(get_hash_factors(self, set()))
