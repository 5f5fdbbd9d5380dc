"""`KVCacheBlocks`: what the KV cache manager hands the scheduler for one request.

A model with several KV cache groups (sliding-window layers next to whole-context
ones, see `groups`) gives each request one block table per group, all of equal
length.  This object holds one list of blocks per group, so neither the scheduler
nor the manager's callers slice a flat list by the number of groups.  Only the
wire format to the worker is flat: `flat_block_ids` lays the groups out one after
the other, as `SchedulerOutput` carries them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from minivllm.kv_cache.block_pool import KVCacheBlock


@dataclass(frozen=True)
class KVCacheBlocks:
    """Blocks of one request, one tuple per KV cache group (equal lengths)."""

    blocks: tuple[tuple[KVCacheBlock, ...], ...]
    """Per group, the blocks in block-table order."""

    def __post_init__(self) -> None:
        assert self.blocks, "KVCacheBlocks needs at least one group"
        assert len({len(g) for g in self.blocks}) == 1, "groups must have equal lengths"

    @classmethod
    def empty(cls, num_groups: int) -> KVCacheBlocks:
        return cls(tuple(() for _ in range(num_groups)))

    @classmethod
    def from_groups(cls, groups: Sequence[Sequence[KVCacheBlock]]) -> KVCacheBlocks:
        return cls(tuple(tuple(g) for g in groups))

    @property
    def num_groups(self) -> int:
        return len(self.blocks)

    @property
    def num_blocks(self) -> int:
        """Blocks in each group's part (the same in every group)."""
        return len(self.blocks[0])

    def __bool__(self) -> bool:
        return self.num_blocks > 0

    def group(self, index: int) -> tuple[KVCacheBlock, ...]:
        """The blocks of KV cache group ``index``."""
        return self.blocks[index]

    def all_blocks(self) -> Iterator[KVCacheBlock]:
        """Every block, group after group (the null block included)."""
        for group in self.blocks:
            yield from group

    def get_block_ids(self) -> tuple[list[int], ...]:
        """Per group, the block ids."""
        return tuple([b.block_id for b in group] for group in self.blocks)

    def flat_block_ids(self) -> list[int]:
        """Every block id, group after group: the worker's wire format."""
        return [b.block_id for b in self.all_blocks()]
