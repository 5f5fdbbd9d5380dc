"""`ExampleConnector` (vLLM's shared-storage connector), the scheduler half.

KV blocks are files in a directory, ``<shared_storage_path>/<layout id>/``, one
per full block of a prompt, named by the block's chained hash: a producer
(``kv_producer`` / ``kv_both``) writes the blocks it computes, a consumer
(``kv_consumer`` / ``kv_both``) loads the longest run of a prompt's blocks it
finds.  Each file carries a checksum; a corrupt or truncated one is a miss.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from minivllm.kv_transfer.keyed import KeyedBlocksScheduler
from minivllm.kv_transfer.layout import KVLayout
from minivllm.kv_transfer.stores import DiskBlockStore

if TYPE_CHECKING:
    from minivllm.config.vllm import VllmConfig

DEFAULT_STORAGE_PATH = "local_storage"
"""vLLM's default ``shared_storage_path``."""


def storage_root(vllm_config: VllmConfig) -> Path:
    """The directory of this model's blocks."""
    kv = vllm_config.kv_transfer_config
    assert kv is not None
    base = kv.get_from_extra_config("shared_storage_path", DEFAULT_STORAGE_PATH)
    return Path(base).expanduser() / KVLayout.from_config(vllm_config).layout_id


class ExampleConnectorScheduler(KeyedBlocksScheduler):
    """Which blocks of a prompt the directory holds; which blocks to write."""

    def __init__(self, vllm_config: VllmConfig) -> None:
        kv = vllm_config.kv_transfer_config
        assert kv is not None and vllm_config.cache_config.block_size is not None
        super().__init__(
            vllm_config.cache_config.block_size,
            can_load=kv.is_kv_consumer,
            can_save=kv.is_kv_producer,
        )
        self.store = DiskBlockStore(storage_root(vllm_config))

    def has_block(self, key: str) -> bool:
        return self.store.contains(key)
