"""`KVTransferConfig`: KV cache connectors (a second KV tier, disaggregated prefill).

A connector moves KV blocks between this engine and something outside its KV pool:
a directory (`ExampleConnector`, vLLM's shared-storage connector), a host-memory and
disk tier (`OffloadingConnector`, what ``--kv-offloading-size`` turns on) or another
engine over TCP (`TcpConnector`).  The engine side lives in `minivllm.kv_transfer`.
"""

from __future__ import annotations

import importlib.util
import uuid
from dataclasses import field
from typing import Any, Literal, get_args

from minivllm.config.utils import config, get_hash_factors, hash_factors

KVProducer = Literal["kv_producer", "kv_both"]
KVConsumer = Literal["kv_consumer", "kv_both"]
KVRole = Literal["kv_producer", "kv_consumer", "kv_both"]
KV_ROLES = get_args(KVRole)
KVLoadFailurePolicy = Literal["recompute", "fail"]

SUPPORTED_CONNECTORS = (
    "ExampleConnector",
    "SharedStorageConnector",
    "OffloadingConnector",
    "TcpConnector",
)
"""The connectors minivllm runs (`SharedStorageConnector` is vLLM's older name of
`ExampleConnector`)."""

REFUSED_CONNECTORS = {
    "NixlConnector": "it needs NIXL and RDMA/GPU memory registration",
    "P2pNcclConnector": "it needs NCCL between GPUs",
    "MooncakeConnector": "it needs the Mooncake transfer engine",
    "MooncakeStoreConnector": "it needs a Mooncake store",
    "MoRIIOConnector": "it needs AMD MoRI-IO",
    "MultiConnector": "minivllm runs one connector per engine",
    "SimpleCPUOffloadConnector": "use OffloadingConnector (--kv-offloading-size)",
    "DecodeBenchConnector": "it is a vLLM benchmarking tool",
    "HiSparseConnector": "it needs HiSparse DSA models",
}
"""vLLM connectors minivllm knows of but cannot run, with the reason."""

_LMCACHE_CONNECTORS = ("LMCacheConnectorV1", "LMCacheMPConnector")


def lmcache_unavailable_reason() -> str | None:
    """Why LMCache cannot run here (None when it is importable)."""
    if importlib.util.find_spec("lmcache") is None:
        return (
            "LMCache is not installed here (it ships CUDA kernels and runs its KV store in "
            "a separate server process); use kv_offloading_backend='native'"
        )
    return (
        "minivllm has no LMCache integration (its connector drives vLLM's GPU worker); "
        "use kv_offloading_backend='native'"
    )


def check_connector_name(name: str) -> None:
    """ValueError for a connector minivllm does not run, with the list it does."""
    if name in SUPPORTED_CONNECTORS:
        return
    choices = ", ".join(SUPPORTED_CONNECTORS)
    if name in _LMCACHE_CONNECTORS:
        raise ValueError(
            f"KV connector {name!r} is not supported by minivllm: {lmcache_unavailable_reason()}"
        )
    if name in REFUSED_CONNECTORS:
        raise ValueError(
            f"KV connector {name!r} is not supported by minivllm: {REFUSED_CONNECTORS[name]}; "
            f"choose one of {choices}."
        )
    raise ValueError(f"Unknown KV connector {name!r}; choose one of {choices}.")


@config
class KVTransferConfig:
    """Configuration for distributed KV cache transfer."""

    kv_connector: str | None = None
    """Name of the KV connector: "ExampleConnector" (alias "SharedStorageConnector"),
    "OffloadingConnector" or "TcpConnector"; None: no connector."""
    engine_id: str | None = None
    """Unique id of this engine for the connector (a random UUID when unset)."""
    kv_buffer_device: str = "cuda"
    """Device of the transfer buffer; minivllm stages transfers in host memory, so
    this only has to name a known device ("cuda", "cpu" or "xpu")."""
    kv_buffer_size: float = 1e9
    """Size of the transfer buffer in bytes (vLLM's TorchDistributedConnector; kept
    for compatibility, minivllm's connectors size their buffers themselves)."""
    kv_role: KVRole | None = None
    """Whether this instance produces KV ("kv_producer"), consumes it
    ("kv_consumer"), or both ("kv_both"); required with a connector."""
    kv_rank: int | None = None
    """Rank of this instance in the transfer group (0: prefill, 1: decode)."""
    kv_parallel_size: int = 1
    """Instances in the transfer group."""
    kv_ip: str = "127.0.0.1"
    """Address the TcpConnector's producer listens on and advertises."""
    kv_port: int = 14579
    """Port the TcpConnector's producer serves KV blocks on."""
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)
    """Connector-specific options: "shared_storage_path" (ExampleConnector);
    "cpu_bytes_to_use", "disk_path", "disk_bytes_to_use" (OffloadingConnector);
    "transfer_timeout_s", "send_ttl_s" (TcpConnector)."""
    kv_connector_module_path: str | None = None
    """Module to import a custom connector from (refused: minivllm runs only its own)."""
    kv_load_failure_policy: KVLoadFailurePolicy = "fail"
    """What happens to a request whose KV fails to load: "fail" ends it with an
    error, "recompute" computes the missing tokens itself."""

    def __post_init__(self) -> None:
        if self.engine_id is None:
            self.engine_id = str(uuid.uuid4())
        if self.kv_role is not None and self.kv_role not in KV_ROLES:
            raise ValueError(f"Unsupported kv_role {self.kv_role!r}; choose one of {KV_ROLES}.")
        if self.kv_connector is not None and self.kv_role is None:
            raise ValueError(
                f"kv_role is required when kv_connector is set; choose one of {KV_ROLES}."
            )
        if self.kv_load_failure_policy not in get_args(KVLoadFailurePolicy):
            raise ValueError(
                f"kv_load_failure_policy must be 'recompute' or 'fail', got "
                f"{self.kv_load_failure_policy!r}."
            )
        self.check_supported()

    def check_supported(self) -> None:
        """ValueError for a connector (or setting) minivllm cannot run."""
        if self.kv_connector_module_path is not None:
            raise ValueError(
                "kv_connector_module_path is not supported by minivllm: it runs only its "
                f"own connectors ({', '.join(SUPPORTED_CONNECTORS)}); drop the module path."
            )
        if self.kv_connector is not None:
            check_connector_name(self.kv_connector)
        if self.kv_buffer_device not in ("cuda", "cpu", "xpu"):
            raise ValueError(
                f"kv_buffer_device must be 'cuda', 'cpu' or 'xpu', got {self.kv_buffer_device!r}."
            )
        if not 0 < self.kv_port < 65536:
            raise ValueError(f"kv_port must be a TCP port (1-65535), got {self.kv_port}.")

    @property
    def is_kv_transfer_instance(self) -> bool:
        return self.kv_connector is not None and self.kv_role in KV_ROLES

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in get_args(KVProducer)

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in get_args(KVConsumer)

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
        """The connectors run outside the compiled graph: no field changes it, but a
        changed connector still gets its own hash, as before (every field counts)."""
        return hash_factors(get_hash_factors(self, {"engine_id"}))


def resolve_kv_offloading(cache_kv_offloading_size: float | None, backend: str) -> dict[str, Any]:
    """The connector settings ``--kv-offloading-size`` stands for (the seeds'
    ``_post_init_kv_transfer_config``): the native backend is the OffloadingConnector
    with ``cpu_bytes_to_use``; LMCache is refused with the reason."""
    assert cache_kv_offloading_size is not None
    if backend == "lmcache":
        raise ValueError(
            f"kv_offloading_backend='lmcache' is not supported by minivllm: "
            f"{lmcache_unavailable_reason()}."
        )
    return {"cpu_bytes_to_use": cache_kv_offloading_size * (1 << 30)}
