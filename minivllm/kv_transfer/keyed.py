"""The scheduler half of connectors that keep blocks under their prefix hashes.

A prompt's full blocks are keyed by their chained block hashes (hex), so a stored
block stands for its whole prefix: the blocks found, in order from the first one
the local prefix cache lacks, are the external hit.  Every block a step fills is
saved (unless the store already holds it) so that later requests, and later runs,
can load it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

from minivllm.kv_transfer.base import (
    ConnectorRequest,
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorScheduler,
    KVLoad,
    KVSave,
    ScheduledRequest,
)
from minivllm.stats import KVConnectorStats


def block_key(block_hash: bytes) -> str:
    return block_hash.hex()


class KeyedBlocksScheduler(KVConnectorScheduler):
    """Loads the longest stored run of a prompt's blocks; saves every filled block."""

    def __init__(self, block_size: int, *, can_load: bool, can_save: bool) -> None:
        super().__init__(block_size)
        self.can_load = can_load
        self.can_save = can_save
        self._loads: list[KVLoad] = []
        # Per request: leading blocks known to be stored (saved, loaded or found).
        self._num_stored: dict[str, int] = {}
        self.stats = KVConnectorStats()
        """Cumulative lookups (external_queries / external_hits)."""

    @abstractmethod
    def has_block(self, key: str) -> bool:
        """Whether the store holds ``key`` (a lookup hit refreshes it in an LRU)."""

    def stored(self, keys: list[str]) -> list[str]:
        """Record blocks about to be saved; returns keys evicted to make room."""
        return []

    def get_num_new_matched_tokens(
        self, request: ConnectorRequest, num_computed_tokens: int
    ) -> tuple[int, bool]:
        if not self.can_load:
            return 0, False
        bs = self.block_size
        hashes = request.block_hashes
        last = min((request.num_tokens - 1) // bs, len(hashes))
        first = num_computed_tokens // bs
        found = 0
        for i in range(first, last):
            if not self.has_block(block_key(hashes[i])):
                break
            found += 1
        self.stats.external_queries += max(0, request.num_tokens - num_computed_tokens)
        self.stats.external_hits += found * bs
        return found * bs, found > 0

    def update_state_after_alloc(
        self, request: ConnectorRequest, block_ids: list[int], num_external_tokens: int
    ) -> None:
        bs = self.block_size
        first = getattr(request, "num_computed_tokens", 0) // bs
        count = num_external_tokens // bs
        keys = [block_key(h) for h in request.block_hashes[first : first + count]]
        self._loads.append(
            KVLoad(request.request_id, block_ids[first : first + count], num_external_tokens, keys)
        )
        self._num_stored[request.request_id] = first + count

    def build_connector_meta(self, scheduled: Sequence[ScheduledRequest]) -> KVConnectorMetadata:
        meta = KVConnectorMetadata(loads=self._loads)
        self._loads = []
        if self.can_save:
            planned: set[str] = set()  # requests sharing a prefix in one step save it once
            for item in scheduled:
                self._plan_saves(item, meta, planned)
        return meta

    def _plan_saves(
        self, item: ScheduledRequest, meta: KVConnectorMetadata, planned: set[str]
    ) -> None:
        request = item.request
        hashes = request.block_hashes
        full = min(item.num_computed_tokens // self.block_size, len(hashes), len(item.block_ids))
        start = self._num_stored.get(request.request_id, 0)
        if full <= start:
            return
        self._num_stored[request.request_id] = full
        block_ids, keys = [], []
        for i in range(start, full):
            key = block_key(hashes[i])
            if key not in planned and not self.has_block(key):
                block_ids.append(item.block_ids[i])
                keys.append(key)
                planned.add(key)
        if keys:
            meta.saves.append(KVSave(request.request_id, block_ids, keys))
            self._record_drops(self.stored(keys), meta)

    def _record_drops(self, dropped: list[str], meta: KVConnectorMetadata) -> None:
        meta.dropped_keys.extend(dropped)

    def request_finished(self, request: ConnectorRequest, block_ids: list[int]):  # type: ignore[override]
        self._num_stored.pop(request.request_id, None)
        return False, None

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        for key in output.corrupt_keys:
            self.forget(key)

    def forget(self, key: str) -> None:
        """A block the worker found corrupt (and deleted)."""
