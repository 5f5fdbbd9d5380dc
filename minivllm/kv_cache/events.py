"""KV cache events: vLLM's wire schema, and the log the block pool writes them to.

With ``KVEventsConfig.enable_kv_cache_events`` the block pool reports every change
of its prefix cache, so a router outside the engine can mirror which prefixes this
instance holds (llm-d, Dynamo):

- `BlockStored`: full blocks got their hashes (a chain: ``parent_block_hash`` is the
  hash of the block before the first one, None at the start of a prompt);
- `BlockRemoved`: hashes left the cache (their block was handed out again);
- `AllBlocksCleared`: the whole prefix cache was reset.

The classes follow vLLM's ``vllm/distributed/kv_events.py`` field for field, in its
msgspec encoding: a `KVEventBatch` is a msgpack array ``[ts, events, dp_rank]``
(``array_like``), each event a map tagged with its class name under ``"type"``,
fields at their defaults left out.  Block hashes go out as vLLM's default does
(``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``): the last 8 bytes of the SHA-256 digest
as an unsigned big-endian integer; ``=0`` sends the 32-byte digest.

Torch-free, no I/O: the engine drains `KVEventLog.take_events` once per step and
hands the batch to a publisher (`minivllm.distributed.kv_events`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from minivllm import envs
from minivllm.kv_cache.hashing import BlockHash

ExternalBlockHash = bytes | int
"""A block hash as events carry it (vLLM's ``ExternalBlockHash``)."""

MEDIUM_GPU = "GPU"
"""The ``medium`` of blocks in the engine's own KV cache (vLLM's name, on every device)."""


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):  # type: ignore[call-arg]
    """Events of one engine step, with the wall-clock time they were published."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):  # type: ignore[call-arg]
    """Base of the KV cache events (tagged by class name)."""


class BlockStored(KVCacheEvent):
    """Consecutive full blocks of one KV cache group were published in the prefix cache."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    """Block hashes of one KV cache group left the prefix cache."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    """The prefix cache was emptied (``reset_prefix_cache``)."""


class KVEventBatch(EventBatch):
    """What one published message carries."""

    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def external_block_hash(block_hash: BlockHash, as_int: bool = True) -> ExternalBlockHash:
    """``block_hash`` as events carry it: the unsigned big-endian integer of its last
    8 bytes, or the digest itself (``as_int=False``)."""
    return int.from_bytes(block_hash[-8:], "big") if as_int else block_hash


class StoredBlock(NamedTuple):
    """What an event says about one block being cached (the manager knows it, the pool
    does not): its plain hash, its parent's, its tokens (plain ints), its KV cache
    group and the extra keys mixed into its hash."""

    block_hash: BlockHash
    parent_hash: BlockHash | None
    token_ids: Sequence[int]
    group: int = 0
    extra_keys: tuple[Any, ...] | None = None


class KVEventLog:
    """Events of the block pool since the last `take_events`, in order.

    Blocks stored one after another along one hash chain (a prompt's blocks cached in
    one step) fold into one `BlockStored`, as vLLM sends them.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._int_hashes = envs.kv_events_use_int_block_hashes()
        self._events: list[KVCacheEvent] = []
        # Prefix-cache key -> (external hash, group) of every block announced stored.
        self._cached: dict[BlockHash, tuple[ExternalBlockHash, int]] = {}

    def stored(self, key: BlockHash, block: StoredBlock) -> None:
        """``block`` was published in the prefix cache under ``key``."""
        ext = external_block_hash(block.block_hash, self._int_hashes)
        parent: ExternalBlockHash | None = None
        if block.parent_hash is not None:
            parent = external_block_hash(block.parent_hash, self._int_hashes)
        self._cached[key] = (ext, block.group)
        last = self._events[-1] if self._events else None
        if (
            isinstance(last, BlockStored)
            and last.group_idx == block.group
            and parent is not None
            and last.block_hashes[-1] == parent
        ):
            last.block_hashes.append(ext)
            last.token_ids.extend(block.token_ids)
            assert last.extra_keys is not None
            last.extra_keys.append(block.extra_keys)
            return
        self._events.append(
            BlockStored(
                block_hashes=[ext],
                parent_block_hash=parent,
                token_ids=list(block.token_ids),
                block_size=self.block_size,
                lora_id=None,
                medium=MEDIUM_GPU,
                lora_name=None,
                extra_keys=[block.extra_keys],  # one entry per block, as vLLM sends them
                group_idx=block.group,
            )
        )

    def removed(self, key: BlockHash) -> None:
        """The block cached under ``key`` left the prefix cache."""
        entry = self._cached.pop(key, None)
        if entry is None:  # cached before events were on, or never announced
            return
        ext, group = entry
        self._events.append(BlockRemoved(block_hashes=[ext], medium=MEDIUM_GPU, group_idx=group))

    def cleared(self) -> None:
        """Every cached block was forgotten."""
        self._cached.clear()
        self._events.append(AllBlocksCleared())

    def take_events(self) -> list[KVCacheEvent]:
        """The events since the last call, oldest first (the log is emptied)."""
        events, self._events = self._events, []
        return events
