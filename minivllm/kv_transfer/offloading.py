"""`OffloadingConnector`, the scheduler half: a second KV tier, LRU within its size.

Every block a step fills is also kept in the tier (so a block the KV pool evicts
is still there); a prompt whose prefix the pool lost loads it back.  The tier is
host memory (``cpu_bytes_to_use``, what ``--kv-offloading-size`` sets) and, with
``disk_path`` in ``kv_connector_extra_config``, a directory (``disk_bytes_to_use``,
default the host size) that outlives the engine: at start-up its blocks are the
disk tier's content, oldest first.  This half keeps the index and decides
evictions; the worker half holds the bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from minivllm.kv_transfer.base import KVConnectorMetadata
from minivllm.kv_transfer.keyed import KeyedBlocksScheduler
from minivllm.kv_transfer.layout import KVLayout
from minivllm.kv_transfer.stores import DiskBlockStore
from minivllm.logger import init_logger

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

logger = init_logger(__name__)


class LRUIndex:
    """Keys of one tier, least recently used first, at most ``capacity``."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def touch(self, key: str) -> None:
        self._keys.move_to_end(key)

    def add(self, key: str) -> list[str]:
        """Insert (or refresh) ``key``; returns the keys evicted for it."""
        self._keys[key] = None
        self._keys.move_to_end(key)
        evicted = []
        while len(self._keys) > self.capacity:
            evicted.append(self._keys.popitem(last=False)[0])
        return evicted

    def discard(self, key: str) -> None:
        self._keys.pop(key, None)


def offload_dirs(vllm_config: VllmConfig) -> Path | None:
    kv = vllm_config.kv_transfer_config
    assert kv is not None
    path = kv.get_from_extra_config("disk_path", None)
    if path is None:
        return None
    return Path(path).expanduser() / KVLayout.from_config(vllm_config).layout_id


def tier_capacities(vllm_config: VllmConfig) -> tuple[int, int]:
    """Blocks the host tier and the disk tier hold."""
    kv = vllm_config.kv_transfer_config
    assert kv is not None
    per_block = KVLayout.from_config(vllm_config).bytes_per_block
    host_bytes = float(kv.get_from_extra_config("cpu_bytes_to_use", 0))
    disk_bytes = float(kv.get_from_extra_config("disk_bytes_to_use", host_bytes))
    if host_bytes < 0 or disk_bytes < 0:
        raise ValueError("cpu_bytes_to_use and disk_bytes_to_use must be >= 0 bytes")
    return int(host_bytes // per_block), int(disk_bytes // per_block)


class OffloadingConnectorScheduler(KeyedBlocksScheduler):
    """The tier's index: which blocks host memory and the disk hold, LRU."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        assert vllm_config.cache_config.block_size is not None
        super().__init__(vllm_config.cache_config.block_size, can_load=True, can_save=True)
        host_blocks, disk_blocks = tier_capacities(vllm_config)
        self.host = LRUIndex(host_blocks)
        root = offload_dirs(vllm_config)
        self.disk: LRUIndex | None = None
        if root is not None:
            self.disk = LRUIndex(disk_blocks)
            store = DiskBlockStore(root)
            for key in store.scan():  # oldest first: the LRU order survives a restart
                for old in self.disk.add(key):
                    store.delete(old)
            logger.info("KV offload disk tier %s: %d blocks found", root, len(self.disk))
        if host_blocks == 0 and not disk_blocks:
            raise ValueError(
                "the KV offload tier holds no block: raise --kv-offloading-size (GiB) or "
                "disk_bytes_to_use"
            )

    def has_block(self, key: str) -> bool:
        found = False
        if key in self.host:
            self.host.touch(key)
            found = True
        if self.disk is not None and key in self.disk:
            self.disk.touch(key)
            found = True
        return found

    def stored(self, keys: list[str]) -> list[str]:
        dropped = []
        for key in keys:
            dropped += self.host.add(key)
        return dropped

    def _record_drops(self, dropped: list[str], meta: KVConnectorMetadata) -> None:
        meta.dropped_keys.extend(dropped)
        if self.disk is not None:
            for key in meta.saves[-1].keys:
                meta.dropped_disk_keys.extend(self.disk.add(key))

    def forget(self, key: str) -> None:
        self.host.discard(key)
        if self.disk is not None:
            self.disk.discard(key)
