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

With several KV cache groups (sliding-window models, see `groups`), each request
has one block table per group, all of equal length; blocks cross this
interface as `KVCacheBlocks` (one list per group).  Before each allocation a
sliding-window group hands back the blocks no future query can see, putting the
null block in their place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from minivllm.kv_cache.block_pool import BlockPool, KVCacheBlock, PrefixCacheStats
from minivllm.kv_cache.blocks import KVCacheBlocks
from minivllm.kv_cache.events import KVCacheEvent, KVEventLog, StoredBlock
from minivllm.kv_cache.groups import sliding_window_blocks_held
from minivllm.kv_cache.hashing import BlockHash, HashableRequest, get_hash_fn, make_block_hasher
from minivllm.math_utils import cdiv


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


def _group_key(group: int, block_hash: BlockHash) -> BlockHash:
    """Prefix-cache key of a block of ``group`` (group 0 keeps the plain hash)."""
    return block_hash if group == 0 else block_hash + b"/kv-group-%d" % group


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
        group_windows: Sequence[int | None] = (None,),
        max_num_batched_tokens: int | None = None,
        enable_kv_cache_events: bool = False,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be a positive number of tokens, got {block_size}.")
        if not group_windows:
            raise ValueError("group_windows needs one entry per KV cache group")
        self.group_windows = tuple(group_windows)
        """Sliding window of each KV cache group (None: the group keeps every block)."""
        self.num_groups = len(self.group_windows)
        self.max_num_batched_tokens = max_num_batched_tokens
        # Freed sliding-window positions point at the null block.
        reserve_null_block = reserve_null_block or any(w is not None for w in group_windows)
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.hash_fn = get_hash_fn(hash_algo)
        self.block_hasher = make_block_hasher(block_size, self.hash_fn, extra_keys)
        """Give this to the scheduler's `Request` so its block hashes grow as tokens are appended."""
        self.extra_keys = extra_keys
        """Mixed into the hash of each request's first block (and so into every later one)."""
        events = KVEventLog(block_size) if enable_kv_cache_events else None
        self.block_pool = BlockPool(num_blocks, enable_caching, reserve_null_block, events)
        self.req_to_blocks: dict[str, list[list[KVCacheBlock]]] = {}
        """Per request, one block table per group (equal lengths)."""
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
        """Longest context one request can hold when it has the whole cache to itself."""
        usable = self.block_pool.num_usable_blocks
        if all(w is None for w in self.group_windows):
            return usable // self.num_groups * self.block_size
        held = [None if w is None else self._sliding_held(w) for w in self.group_windows]

        def blocks_needed(n: int) -> int:
            return sum(n if h is None else min(n, h) for h in held)

        if all(h is not None for h in held) and blocks_needed(usable) <= usable:
            # Only sliding windows: any length fits once the windows do.
            return max(self.max_model_len or 0, usable * self.block_size)
        lo, hi = 0, usable  # the largest n with blocks_needed(n) <= usable
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if blocks_needed(mid) <= usable else (lo, mid - 1)
        return lo * self.block_size

    def _sliding_held(self, window: int) -> int:
        chunk = self.max_num_batched_tokens or window
        return sliding_window_blocks_held(window, chunk, self.block_size)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks, per group (empty for an unknown request)."""
        tables = self.req_to_blocks.get(request_id)
        if tables is None:
            return KVCacheBlocks.empty(self.num_groups)
        return KVCacheBlocks.from_groups(tables)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block ids, group after group (the worker's wire format)."""
        return self.get_blocks(request_id).flat_block_ids()

    def get_num_held_blocks(self, request_id: str | None = None) -> int:
        """Blocks (not the null block) held by one request, or by all of them."""
        ids = [request_id] if request_id is not None else list(self.req_to_blocks)
        return sum(
            1
            for rid in ids
            for table in self.req_to_blocks.get(rid, ())
            for b in table
            if not b.is_null
        )

    def get_num_blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # -- prefix cache -----------------------------------------------------------
    def update_block_hashes(self, request: KVCacheRequest) -> list[BlockHash]:
        """Extend ``request.block_hashes`` to cover every full block of its context."""
        if self.enable_caching:
            request.block_hashes.extend(self.block_hasher(request))
        return request.block_hashes

    def get_computed_blocks(self, request: KVCacheRequest) -> tuple[KVCacheBlocks, int]:
        """Longest cached prefix of ``request``: (blocks, number of tokens they cover).

        Looks at most at ``num_tokens - 1`` tokens, so at least the last token is
        computed; with whole-block granularity that may recompute a full block.
        Requests that ask for prompt logprobs skip the cache: their prompt must run.
        """
        none = KVCacheBlocks.empty(self.num_groups)
        if not self.enable_caching or request.sampling_params.prompt_logprobs:
            return none, 0
        hashes = self.update_block_hashes(request)
        max_hit = min((request.num_tokens - 1) // self.block_size, len(hashes))
        pool = self.block_pool
        # cached[g][i]: the cached block of group g for block position i (or None).
        cached = [
            [pool.get_cached_block(_group_key(g, h)) for h in hashes[:max_hit]]
            for g in range(self.num_groups)
        ]
        num_hit = max_hit
        for g, window in enumerate(self.group_windows):
            if window is None:  # a whole-context group needs every block of the prefix
                num_hit = next((i for i, b in enumerate(cached[g]) if b is None), num_hit)
                num_hit = min(num_hit, max_hit)
        # A sliding-window group needs only the blocks the first computed token sees.
        while num_hit > 0 and not all(
            all(
                b is not None
                for b in cached[g][self._first_needed(g, num_hit * self.block_size) : num_hit]
            )
            for g in range(self.num_groups)
        ):
            num_hit -= 1
        if num_hit == 0:
            return none, 0
        null = pool.null_block
        groups: list[list[KVCacheBlock]] = []
        for g in range(self.num_groups):
            first = self._first_needed(g, num_hit * self.block_size)
            if first:
                assert null is not None
            groups.append([null] * first + [b for b in cached[g][first:num_hit] if b is not None])
        return KVCacheBlocks.from_groups(groups), num_hit * self.block_size

    def _first_needed(self, group: int, num_computed_tokens: int) -> int:
        """First block position a group still needs once ``num_computed_tokens`` tokens
        are in the cache: the block of the oldest key the next token sees (0 for a
        whole-context group)."""
        window = self.group_windows[group]
        if window is None:
            return 0
        return max(0, num_computed_tokens - window + 1) // self.block_size

    def cache_blocks(self, request: KVCacheRequest, num_computed_tokens: int) -> None:
        """Publish the request's blocks that are full up to ``num_computed_tokens``."""
        if not self.enable_caching:
            return
        tables = self.req_to_blocks.get(request.request_id)
        if not tables or not tables[0]:
            return
        hashes = self.update_block_hashes(request)
        num_full = min(num_computed_tokens // self.block_size, len(tables[0]), len(hashes))
        start = self.num_cached_blocks.get(request.request_id, 0)
        with_events = self.block_pool.kv_events is not None
        for g, blocks in enumerate(tables):
            for i in range(start, num_full):
                if not blocks[i].is_null:
                    stored = self._stored_block(request, hashes, i, g) if with_events else None
                    self.block_pool.cache_full_block(blocks[i], _group_key(g, hashes[i]), stored)
        self.num_cached_blocks[request.request_id] = max(start, num_full)

    def _stored_block(
        self, request: KVCacheRequest, hashes: list[BlockHash], index: int, group: int
    ) -> StoredBlock:
        """What a `BlockStored` event says about block ``index`` of ``request``."""
        begin = index * self.block_size
        tokens = request.all_token_ids[begin : begin + self.block_size]
        parent = hashes[index - 1] if index else None
        keys = None if index else self.extra_keys
        return StoredBlock(hashes[index], parent, tokens, group, keys)

    def take_events(self) -> list[KVCacheEvent]:
        """KV cache events since the last call (`KVEventsConfig`; empty when off)."""
        return self.block_pool.take_events()

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
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
    ) -> bool:
        """Whether `allocate_slots` with the same arguments would succeed.

        With sliding-window groups, ``num_new_tokens`` beyond one step (the scheduler
        reserving a whole prompt) counts each sliding group at the most it ever holds
        at once, since the prompt will be computed in chunks of at most
        ``max_num_batched_tokens``."""
        hits = new_computed_blocks or KVCacheBlocks.empty(self.num_groups)
        return self._fits(request, num_new_tokens, hits, num_lookahead_tokens, capped=True)

    def _fits(
        self,
        request: KVCacheRequest,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks,
        num_lookahead_tokens: int,
        capped: bool,
    ) -> bool:
        self.free_skipped_blocks(request)
        per_group = self._num_new_blocks_needed(
            request, num_new_tokens, new_computed_blocks, num_lookahead_tokens
        )
        need = per_group * self.num_groups
        if capped and need and self.max_num_batched_tokens is not None:
            need = self._cap_sliding_need(request, per_group, new_computed_blocks)
        # Hit blocks sitting in the free queue stop being free once taken.
        num_evictable_hits = sum(
            1 for b in new_computed_blocks.all_blocks() if b.ref_cnt == 0 and not b.is_null
        )
        return need <= self.num_free_blocks - num_evictable_hits

    def _cap_sliding_need(
        self, request: KVCacheRequest, per_group: int, hits: KVCacheBlocks
    ) -> int:
        """Blocks a request needs when each sliding group holds at most its window plus
        one step's tokens (whole-context groups need ``per_group`` each)."""
        tables = self.req_to_blocks.get(request.request_id)
        total = 0
        for g, window in enumerate(self.group_windows):
            if window is None:
                total += per_group
                continue
            held = (list(tables[g]) if tables else []) + list(hits.group(g))
            num_held = sum(1 for b in held if not b.is_null)
            total += min(per_group, max(self._sliding_held(window) - num_held, 0))
        return total

    def allocate_slots(
        self,
        request: KVCacheRequest,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
    ) -> KVCacheBlocks | None:
        """Reserve KV slots for ``num_new_tokens`` more tokens of ``request``.

        ``new_computed_blocks`` (from `get_computed_blocks`, only at admission)
        are prepended to the request's block tables.  Returns the blocks newly
        taken from the free queue (hit blocks excluded: the caller already knows
        them), or None, with nothing changed, when there are not enough.
        """
        if num_new_tokens <= 0 and not new_computed_blocks:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}.")
        hits = new_computed_blocks or KVCacheBlocks.empty(self.num_groups)
        assert hits.num_groups == self.num_groups, "hits from another manager"
        if not self._fits(request, num_new_tokens, hits, num_lookahead_tokens, capped=False):
            return None
        num_new_blocks = self._num_new_blocks_needed(
            request, num_new_tokens, hits, num_lookahead_tokens
        )
        tables = self.req_to_blocks.setdefault(
            request.request_id, [[] for _ in range(self.num_groups)]
        )
        num_hit = hits.num_blocks
        if hits:
            assert not tables[0], "prefix hits are only taken when a request is admitted"
            self.block_pool.touch(b for b in hits.all_blocks() if not b.is_null)
            for g, table in enumerate(tables):
                table.extend(hits.group(g))
            # Hit blocks are cached already; start publishing after them.
            self.num_cached_blocks[request.request_id] = num_hit
        if request.num_computed_tokens == 0 and self.enable_caching:
            stats = self.prefix_cache_stats
            stats.requests += 1
            stats.queries += request.num_tokens
            stats.hits += num_hit * self.block_size
        new_groups = []
        for table in tables:
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
            table.extend(new_blocks)
            new_groups.append(new_blocks)
        return KVCacheBlocks.from_groups(new_groups)

    def free_skipped_blocks(self, request: KVCacheRequest) -> None:
        """Return the blocks of sliding-window groups that no query of ``request`` will
        see again (every token before the window of its next token).  As in `free`,
        later blocks join the free queue first, so they are evicted before earlier
        ones that other prompts are more likely to share."""
        tables = self.req_to_blocks.get(request.request_id)
        if not tables:
            return
        null = self.block_pool.null_block
        for g, table in enumerate(tables):
            if self.group_windows[g] is None:
                continue
            first = self._first_needed(g, request.num_computed_tokens)
            freed = []
            for i in range(min(first, len(table))):
                if not table[i].is_null:
                    freed.append(table[i])
                    assert null is not None
                    table[i] = null
            if freed:
                self.block_pool.free_blocks(reversed(freed))

    def _num_new_blocks_needed(
        self,
        request: KVCacheRequest,
        num_new_tokens: int,
        new_computed_blocks: KVCacheBlocks,
        num_lookahead_tokens: int,
    ) -> int:
        """New blocks each group's table needs (the same for every group)."""
        num_hit = new_computed_blocks.num_blocks
        num_computed = request.num_computed_tokens + num_hit * self.block_size
        num_tokens = num_computed + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None:
            # Lookahead slots beyond the model's context can never be used.
            num_tokens = min(num_tokens, max(self.max_model_len, num_computed + num_new_tokens))
        tables = self.req_to_blocks.get(request.request_id)
        held = (len(tables[0]) if tables else 0) + num_hit
        return max(cdiv(num_tokens, self.block_size) - held, 0)

    def free(self, request: KVCacheRequest) -> None:
        """Release every block of ``request`` at once.

        Blocks are freed tail first, so when several of them are cached the end of
        the prefix is evicted before its beginning (which other prompts are more
        likely to share).
        """
        tables = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_blocks.pop(request.request_id, None)
        # Tail first within each group; whole-context groups before sliding ones.
        self.block_pool.free_blocks(b for table in tables for b in reversed(table) if not b.is_null)

    def num_table_blocks(self, request_id: str) -> int:
        """Length of the request's block table (every group's is the same); 0 if none."""
        tables = self.req_to_blocks.get(request_id)
        return len(tables[0]) if tables else 0

    def trim_blocks(self, request: KVCacheRequest, num_tokens: int) -> int:
        """Free the request's blocks past the first ``num_tokens`` slots (tail first, in
        every group); returns how many blocks each group's table keeps.

        Speculative decoding reserves slots for draft tokens; the blocks that held only
        rejected drafts go back to the pool.  They were never published in the prefix
        cache (only blocks full of accepted tokens are).
        """
        tables = self.req_to_blocks.get(request.request_id)
        if tables is None:
            return 0
        keep = cdiv(max(num_tokens, 0), self.block_size)
        if len(tables[0]) > keep:
            assert self.num_cached_blocks.get(request.request_id, 0) <= keep
            tail = [b for table in tables for b in reversed(table[keep:]) if not b.is_null]
            for table in tables:
                del table[keep:]
            self.block_pool.free_blocks(tail)
        return len(tables[0])
