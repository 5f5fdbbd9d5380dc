"""Per-request KV block tables on top of a `BlockPool`, with prefix caching.

The scheduler drives it in this order for each request:

1. ``get_computed_blocks(request)`` when the request is admitted: the longest
   run of cached full blocks that matches its context (never the whole context:
   the last token is always recomputed so the model produces logits for it);
2. ``allocate_slots(request, num_new_tokens, new_computed_blocks)`` every step
   it is scheduled: takes the hit blocks and enough new blocks for the tokens of
   the step, or returns None when the pool is short (the scheduler preempts);
3. ``cache_blocks(request, num_computed_tokens)`` after the step ran: blocks
   that became full are published in the prefix cache (only after the step, so
   no other request can hit a block whose KV is not written yet);
4. ``free(request)`` when it finishes, is aborted or is preempted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from minivllm.kv_cache.block_pool import BlockPool, KVCacheBlock, PrefixCacheStats
from minivllm.kv_cache.hashing import BlockHash, HashableRequest, get_hash_fn, make_block_hasher


class PromptLogprobsParams(Protocol):
    """The one sampling parameter the manager reads: prompt logprobs bypass the cache."""

    @property
    def prompt_logprobs(self) -> int | None: ...


class KVCacheRequest(HashableRequest, Protocol):
    """What the manager reads from a request.

    Structural, so the KV cache layer needs no import of the scheduler above it:
    the scheduler's ``Request`` satisfies it as it is.
    """

    @property
    def request_id(self) -> str: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_computed_tokens(self) -> int: ...

    @property
    def sampling_params(self) -> PromptLogprobsParams: ...


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


class KVCacheManager:
    """Allocates KV blocks to requests and reuses cached prefixes across requests."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        hash_algo: str = "sha256",
        max_model_len: int | None = None,
        reserve_null_block: bool = True,
        extra_keys: tuple[Any, ...] | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}.")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.hash_fn = get_hash_fn(hash_algo)
        self.block_hasher = make_block_hasher(block_size, self.hash_fn, extra_keys)
        """Give this to the scheduler's `Request` so its block hashes grow as tokens are appended."""
        self.block_pool = BlockPool(num_blocks, enable_caching, reserve_null_block)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Leading blocks of each request already published in the prefix cache.
        self.num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    # -- queries ------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        """Fraction of usable KV blocks held by requests."""
        return self.block_pool.get_usage()

    @property
    def null_block_id(self) -> int | None:
        """Block the model runner may use for padding slots (None when not reserved)."""
        null = self.block_pool.null_block
        return None if null is None else null.block_id

    @property
    def max_num_tokens(self) -> int:
        """Tokens the whole cache can hold (the usable blocks times the block size)."""
        return self.block_pool.num_usable_blocks * self.block_size

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def get_num_blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # -- prefix cache -----------------------------------------------------------
    def update_block_hashes(self, request: KVCacheRequest) -> list[BlockHash]:
        """Extend ``request.block_hashes`` to cover every full block of its context."""
        if self.enable_caching:
            request.block_hashes.extend(self.block_hasher(request))
        return request.block_hashes

    def get_computed_blocks(self, request: KVCacheRequest) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of ``request``: (blocks, number of tokens they cover).

        Looks at most at ``num_tokens - 1`` tokens, so at least the last token is
        computed; with whole-block granularity that may recompute a full block.
        Requests that ask for prompt logprobs skip the cache: their prompt must run.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs:
            return [], 0
        hashes = self.update_block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        blocks: list[KVCacheBlock] = []
        for block_hash in hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def cache_blocks(self, request: KVCacheRequest, num_computed_tokens: int) -> None:
        """Publish the request's blocks that are full up to ``num_computed_tokens``."""
        if not self.enable_caching:
            return
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return
        hashes = self.update_block_hashes(request)
        num_full = min(num_computed_tokens // self.block_size, len(blocks), len(hashes))
        start = self.num_cached_blocks.get(request.request_id, 0)
        for i in range(start, num_full):
            self.block_pool.cache_full_block(blocks[i], hashes[i])
        self.num_cached_blocks[request.request_id] = max(start, num_full)

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash; False while any request holds blocks."""
        ok = self.block_pool.reset_prefix_cache()
        if ok:
            self.prefix_cache_stats.resets += 1
        return ok

    # -- allocation -----------------------------------------------------------
    def can_allocate(
        self,
        request: KVCacheRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Whether `allocate_slots` with the same arguments would succeed."""
        need = self._num_new_blocks_needed(
            request, num_new_tokens, new_computed_blocks, num_lookahead_tokens
        )
        # Hit blocks sitting in the free queue stop being free once taken.
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return need <= self.num_free_blocks - num_evictable_hits

    def allocate_slots(
        self,
        request: KVCacheRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Reserve KV slots for ``num_new_tokens`` more tokens of ``request``.

        ``new_computed_blocks`` (from `get_computed_blocks`, only at admission)
        are prepended to the request's block table.  Returns the ids of blocks
        newly taken from the free queue (hit blocks excluded: the caller already
        knows them), or None, with nothing changed, when there are not enough.
        """
        if num_new_tokens <= 0 and not new_computed_blocks:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}.")
        hits = list(new_computed_blocks or ())
        if not self.can_allocate(request, num_new_tokens, hits, num_lookahead_tokens):
            return None
        num_new_blocks = self._num_new_blocks_needed(
            request, num_new_tokens, hits, num_lookahead_tokens
        )
        req_blocks = self.req_to_blocks.setdefault(request.request_id, [])
        if hits:
            assert not req_blocks, "prefix hits are only taken when a request is admitted"
            self.block_pool.touch(hits)
            req_blocks.extend(hits)
            # Hit blocks are cached already; start publishing after them.
            self.num_cached_blocks[request.request_id] = len(hits)
        if request.num_computed_tokens == 0 and self.enable_caching:
            stats = self.prefix_cache_stats
            stats.requests += 1
            stats.queries += request.num_tokens
            stats.hits += len(hits) * self.block_size
        new_blocks = self.block_pool.get_new_blocks(max(num_new_blocks, 0))
        req_blocks.extend(new_blocks)
        return [b.block_id for b in new_blocks]

    def _num_new_blocks_needed(
        self,
        request: KVCacheRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_lookahead_tokens: int,
    ) -> int:
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_tokens = num_computed + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None:
            # Lookahead slots beyond the model's context can never be used.
            num_tokens = min(num_tokens, max(self.max_model_len, num_computed + num_new_tokens))
        held = len(self.req_to_blocks.get(request.request_id, ())) + len(new_computed_blocks)
        return max(cdiv(num_tokens, self.block_size) - held, 0)

    def free(self, request: KVCacheRequest) -> None:
        """Release every block of ``request`` at once.

        Blocks are freed tail first, so when several of them are cached the end of
        the prefix is evicted before its beginning (which other prompts are more
        likely to share).
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def trim_blocks(self, request: KVCacheRequest, num_tokens: int) -> int:
        """Free the request's blocks past the first ``num_tokens`` slots (tail first);
        returns how many blocks it keeps.

        Speculative decoding reserves slots for draft tokens; the blocks that held only
        rejected drafts go back to the pool.  They were never published in the prefix
        cache (only blocks full of accepted tokens are).
        """
        blocks = self.req_to_blocks.get(request.request_id)
        if blocks is None:
            return 0
        keep = cdiv(max(num_tokens, 0), self.block_size)
        if len(blocks) > keep:
            assert self.num_cached_blocks.get(request.request_id, 0) <= keep
            tail = blocks[keep:]
            del blocks[keep:]
            self.block_pool.free_blocks(reversed(tail))
        return len(blocks)
