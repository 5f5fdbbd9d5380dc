"""The scheduler half of the configured connector (torch-free: the scheduler imports it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from minivllm.kv_transfer.base import KVConnectorScheduler

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig


def make_scheduler_connector(vllm_config: VllmConfig) -> KVConnectorScheduler | None:
    """The connector's scheduler half, or None when no connector is configured."""
    kv = getattr(vllm_config, "kv_transfer_config", None)  # a test's partial config lacks it
    if kv is None or kv.kv_connector is None:
        return None
    name = kv.kv_connector
    if name in ("ExampleConnector", "SharedStorageConnector"):
        from minivllm.kv_transfer.storage import ExampleConnectorScheduler

        return ExampleConnectorScheduler(vllm_config)
    if name == "OffloadingConnector":
        from minivllm.kv_transfer.offloading import OffloadingConnectorScheduler

        return OffloadingConnectorScheduler(vllm_config)
    if name == "TcpConnector":
        from minivllm.kv_transfer.tcp import TcpConnectorScheduler

        return TcpConnectorScheduler(vllm_config)
    raise AssertionError(f"KVTransferConfig let through connector {name!r}")
