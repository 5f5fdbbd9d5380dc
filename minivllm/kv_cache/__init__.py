"""Paged KV cache bookkeeping with prefix caching (torch-free)."""

from minivllm.kv_cache.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock, PrefixCacheStats
from minivllm.kv_cache.blocks import KVCacheBlocks
from minivllm.kv_cache.hashing import (
    ROOT_PARENT_HASH,
    BlockHash,
    HashableRequest,
    get_hash_fn,
    hash_block_tokens,
    make_block_hasher,
)
from minivllm.kv_cache.manager import KVCacheManager, KVCacheRequest, PromptLogprobsParams

__all__ = [
    "ROOT_PARENT_HASH",
    "BlockHash",
    "BlockPool",
    "FreeBlockQueue",
    "HashableRequest",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheManager",
    "KVCacheRequest",
    "PrefixCacheStats",
    "PromptLogprobsParams",
    "get_hash_fn",
    "hash_block_tokens",
    "make_block_hasher",
]
