"""The worker half of the configured connector."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from minivllm.kv_transfer.layout import KVLayout
from minivllm.kv_transfer.worker import KVConnectorWorker

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig
    from minivllm.scheduler.output import ModelRunnerOutput, SchedulerOutput


def make_worker_connector(vllm_config: VllmConfig) -> KVConnectorWorker | None:
    """The connector's worker half, or None when no connector is configured."""
    kv = vllm_config.kv_transfer_config
    if kv is None or kv.kv_connector is None:
        return None
    layout = KVLayout.from_config(vllm_config)
    name = kv.kv_connector
    if name in ("ExampleConnector", "SharedStorageConnector"):
        from minivllm.kv_transfer.keyed_worker import ExampleConnectorWorker
        from minivllm.kv_transfer.storage import storage_root

        return ExampleConnectorWorker(layout, str(storage_root(vllm_config)))
    if name == "OffloadingConnector":
        from minivllm.kv_transfer.keyed_worker import OffloadingConnectorWorker
        from minivllm.kv_transfer.offloading import offload_dirs

        root = offload_dirs(vllm_config)
        return OffloadingConnectorWorker(layout, None if root is None else str(root))
    if name == "TcpConnector":
        from minivllm.kv_transfer.tcp_worker import TcpConnectorWorker

        return TcpConnectorWorker(layout, kv)
    raise AssertionError(f"KVTransferConfig let through connector {name!r}")


def run_with_connector(
    connector: KVConnectorWorker,
    scheduler_output: SchedulerOutput,
    execute: Callable[[SchedulerOutput], ModelRunnerOutput],
) -> ModelRunnerOutput:
    """One step with the connector's hooks around the forward pass: loads start
    before it, the step's filled blocks are saved after it, and the loads that
    ended go back with the output."""
    connector.bind_connector_metadata(scheduler_output.kv_connector_metadata)
    connector.start_load_kv()
    output = execute(scheduler_output)
    for name, kv in zip(connector.layer_names, connector.layers, strict=True):
        connector.save_kv_layer(name, kv)
    connector.wait_for_save()
    # An empty step only waits for loads: wait a little instead of spinning.
    idle = scheduler_output.total_num_scheduled_tokens == 0
    output.kv_connector_output = connector.get_finished(
        scheduler_output.finished_req_ids, wait_s=0.005 if idle else 0.0
    )
    return output
