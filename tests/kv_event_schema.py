"""A KV event subscriber's view of the wire, written from vLLM's schema (not minivllm's).

vLLM (``vllm/distributed/kv_events.py``): the batch is a msgpack array ``[ts,
events, data_parallel_rank]`` (``array_like``, trailing defaults omitted); each
event is a map tagged by class name under ``"type"`` (``tag=True``), fields at their
defaults omitted.  Unknown fields are refused here, so minivllm cannot send a field
vLLM's schema lacks.  Block hashes are ints (vLLM's default) or 32-byte digests.
"""

from __future__ import annotations

from typing import Any

import msgspec


class Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Event(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, tag=True):
    pass


class BlockStored(_Event, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(_Event, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(_Event, tag="AllBlocksCleared"):
    pass


class KVEventBatch(Batch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def apply(cached: set[tuple[int, int | bytes]], batch: KVEventBatch) -> None:
    """Update a router's view (``{(group, hash)}``) with one batch."""
    for event in batch.events:
        if isinstance(event, BlockStored):
            cached.update((event.group_idx or 0, h) for h in event.block_hashes)
        elif isinstance(event, BlockRemoved):
            cached.difference_update((event.group_idx or 0, h) for h in event.block_hashes)
        else:
            cached.clear()


def pool_state(cached_block_hash_to_block: dict[bytes, Any]) -> set[tuple[int, int]]:
    """The block pool's prefix cache as ``{(group, int hash)}``.

    Keys of group 0 are the 32-byte digest; other groups append ``b"/kv-group-<g>"``.
    """
    out = set()
    for key in cached_block_hash_to_block:
        group = int(key[32:].rsplit(b"-", 1)[1]) if len(key) > 32 else 0
        out.add((group, int.from_bytes(key[:32][-8:], "big")))
    return out
