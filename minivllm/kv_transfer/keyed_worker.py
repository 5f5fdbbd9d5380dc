"""The worker halves of `ExampleConnector` and `OffloadingConnector`: block files
(and host memory) keyed by prefix hash, each block checksummed."""

from __future__ import annotations

from typing import Protocol

from minivllm.kv_transfer.base import KVConnectorMetadata, KVLoad, KVSave
from minivllm.kv_transfer.block_codec import CorruptBlockError
from minivllm.kv_transfer.layout import KVLayout
from minivllm.kv_transfer.stores import DiskBlockStore, HostBlockStore
from minivllm.kv_transfer.worker import KVConnectorWorker


class BlockStore(Protocol):
    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, data: bytes) -> None: ...

    def delete(self, key: str) -> None: ...


class KeyedBlocksWorker(KVConnectorWorker):
    """Reads blocks from the first store that has them; writes to every store."""

    def __init__(self, layout: KVLayout, stores: list[BlockStore]) -> None:
        super().__init__(layout)
        self.stores = stores

    def load(self, load: KVLoad) -> int:
        bs = self.layout.block_size
        for i, (block_id, key) in enumerate(zip(load.block_ids, load.keys, strict=True)):
            block = self._read(key)
            if block is None:
                return min(i * bs, load.num_tokens)  # the loaded prefix ends here
            self.scatter_block(block_id, block)
            self.count_loaded(1, block.numel() * block.element_size())
        return load.num_tokens

    def _read(self, key: str):  # noqa: ANN202 - a tensor or None
        for store in self.stores:
            data = store.get(key)
            if data is None:
                continue
            try:
                return self.decode(data, key)
            except CorruptBlockError as exc:
                store.delete(key)
                self.count_corrupt(key, str(exc))
        return None

    def save(self, save: KVSave) -> None:
        for block_id, key in zip(save.block_ids, save.keys, strict=True):
            data = self.encode(key, block_id)
            for store in self.stores:
                store.put(key, data)
            self.count_saved(1, len(data))


class ExampleConnectorWorker(KeyedBlocksWorker):
    """Block files in the shared storage directory."""

    def __init__(self, layout: KVLayout, root: str) -> None:
        super().__init__(layout, [DiskBlockStore(root)])


class OffloadingConnectorWorker(KeyedBlocksWorker):
    """Host memory first, then the disk directory (when configured)."""

    def __init__(self, layout: KVLayout, disk_root: str | None) -> None:
        self.host = HostBlockStore()
        self.disk = DiskBlockStore(disk_root) if disk_root is not None else None
        stores: list[BlockStore] = [self.host]
        if self.disk is not None:
            stores.append(self.disk)
        super().__init__(layout, stores)

    def drop(self, meta: KVConnectorMetadata) -> None:
        for key in meta.dropped_keys:
            self.host.delete(key)
        if self.disk is not None:
            for key in meta.dropped_disk_keys:
                self.disk.delete(key)
