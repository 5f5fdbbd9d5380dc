"""The pool of physical KV blocks: reference counts, free queue, cached-block map.

Blocks move between two states.  *In use*: ``ref_cnt > 0``, held by one or
more requests (several when they share a cached prefix).  *Free*: in the free
queue.  A free block may still carry the hash of the tokens it holds; it stays
reusable by a prefix-cache hit until it is handed out as a new block, which
evicts its hash.  New blocks come from the head of the queue and freed blocks
join its tail, so the cached blocks that were freed longest ago go first (LRU).

Block 0 is reserved as the *null block* when ``reserve_null_block`` is set: it
is never given to a request, so the model runner may point padding slots (for
example the padded tail of a CUDA graph batch) at it without corrupting any
request's KV.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from minivllm.kv_cache.events import KVCacheEvent, KVEventLog, StoredBlock
from minivllm.kv_cache.hashing import BlockHash


@dataclass(eq=False)
class KVCacheBlock:
    """One physical KV block and its bookkeeping (identity comparison only)."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    """Hash of the full block's content (with its prefix); None while not cached."""
    is_null: bool = False
    """The reserved padding block, never allocated to a request."""
    prev_free: KVCacheBlock | None = None
    next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        cached = "cached" if self.block_hash is not None else "uncached"
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, {cached})"


class FreeBlockQueue:
    """Doubly linked list of free blocks with O(1) pop-front, append and removal.

    Removal from the middle is what a prefix-cache hit on a free block needs;
    the links live on the blocks themselves so no extra node objects are made.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]) -> None:
        # Sentinels at both ends remove every empty-list special case.
        self._head = KVCacheBlock(block_id=-1)
        self._tail = KVCacheBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail or block is None:
            raise ValueError("No free KV cache blocks left.")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        assert prev is not None and nxt is not None, f"{block} is not in the free queue"
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        assert block.prev_free is None and block.next_free is None, f"{block} is already free"
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Free blocks from the next to be evicted to the last (for tests and debugging)."""
        out = []
        block = self._head.next_free
        while block is not None and block is not self._tail:
            out.append(block)
            block = block.next_free
        return out


@dataclass
class PrefixCacheStats:
    """Cumulative prefix-cache counters, in tokens as vLLM reports them."""

    requests: int = 0
    """Lookups made (one per admission of a request, re-admissions after preemption too)."""
    queries: int = 0
    """Tokens looked up (the request's full context at admission)."""
    hits: int = 0
    """Tokens found in the cache."""
    resets: int = 0
    """Times the prefix cache was cleared."""

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class BlockPool:
    """Owns every KV block: allocation, freeing, and the hash -> cached block map."""

    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool = True,
        reserve_null_block: bool = True,
        kv_events: KVEventLog | None = None,
    ) -> None:
        if num_blocks < 1 + int(reserve_null_block):
            raise ValueError(
                f"The KV cache needs at least {1 + int(reserve_null_block)} blocks, got "
                f"{num_blocks}; give it more memory (gpu_memory_utilization / "
                "kv_cache_memory_bytes) or a smaller block_size."
            )
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(block_id=i) for i in range(num_blocks)]
        self.free_block_queue = FreeBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        self.null_block: KVCacheBlock | None = None
        if reserve_null_block:
            self.null_block = self.free_block_queue.popleft()
            self.null_block.is_null = True
        self.num_usable_blocks = num_blocks - int(reserve_null_block)
        self.kv_events = kv_events
        """Where cache changes are reported (`KVEventsConfig`); None: not reported."""

    # -- lookups ------------------------------------------------------------
    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def get_num_free_blocks(self) -> int:
        """Blocks available to new allocations (free cached blocks count: they are evictable)."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks held by requests, in [0, 1]."""
        return 1.0 - self.get_num_free_blocks() / self.num_usable_blocks

    # -- allocation -----------------------------------------------------------
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the head of the free queue (evicting their hashes)."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(
                f"Cannot allocate {num_blocks} blocks: only {self.get_num_free_blocks()} are free."
            )
        out = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._evict_cached_hash(block)
            assert block.ref_cnt == 0
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cached blocks found by a prefix hit (un-freeing free ones)."""
        for block in blocks:
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference per block; blocks reaching zero join the free queue in order.

        The order given is the eviction order among these blocks (first = evicted first).
        """
        for block in ordered_blocks:
            assert block.ref_cnt > 0, f"double free of {block}"
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and not block.is_null:
                self.free_block_queue.append(block)

    # -- prefix cache -----------------------------------------------------------
    def cache_full_block(
        self, block: KVCacheBlock, block_hash: BlockHash, stored: StoredBlock | None = None
    ) -> None:
        """Publish a newly filled block under its hash (``stored``: what a KV event
        says about it, when events are on).

        If another block already holds the same content (two requests computed the
        same prefix in the same step), the first one stays the cached copy and this
        block stays uncached: it is freed as an ordinary block later.
        """
        if not self.enable_caching or block.block_hash is not None or block.is_null:
            return
        if block_hash in self.cached_block_hash_to_block:
            return
        block.block_hash = block_hash
        self.cached_block_hash_to_block[block_hash] = block
        if self.kv_events is not None and stored is not None:
            self.kv_events.stored(block_hash, stored)

    def _evict_cached_hash(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self.cached_block_hash_to_block.get(block.block_hash) is block:
            del self.cached_block_hash_to_block[block.block_hash]
            if self.kv_events is not None:
                self.kv_events.removed(block.block_hash)
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; only possible while no request holds a block.

        Returns False (and changes nothing) when blocks are in use, since their
        hashes would otherwise be lost while still being valid.
        """
        if self.get_num_free_blocks() != self.num_usable_blocks:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        if self.kv_events is not None:
            self.kv_events.cleared()
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """KV cache events since the last call (none when events are off)."""
        return self.kv_events.take_events() if self.kv_events is not None else []
