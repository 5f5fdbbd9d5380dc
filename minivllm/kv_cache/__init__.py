"""Paged KV cache bookkeeping with prefix caching (torch-free)."""

from minivllm.kv_cache.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock, PrefixCacheStats
from minivllm.kv_cache.hashing import (
    ROOT_PARENT_HASH,
    BlockHash,
    get_hash_fn,
    hash_block_tokens,
    make_block_hasher,
)
from minivllm.kv_cache.manager import KVCacheManager

__all__ = [
    "ROOT_PARENT_HASH",
    "BlockHash",
    "BlockPool",
    "FreeBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "PrefixCacheStats",
    "get_hash_fn",
    "hash_block_tokens",
    "make_block_hasher",
]
