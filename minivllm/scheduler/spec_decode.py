"""The scheduler's bookkeeping for speculative decoding (torch-free).

A decoding request's query in a step is its newest token plus the drafts proposed
after the previous step.  The scheduler counts every draft as computed when it
schedules it; after the step the target has accepted some prefix of them, and
`roll_back` un-computes the rest, frees the blocks that held only rejected drafts
(keeping a draft model's lookahead slots) and remembers the new block-table length
for the worker.  Drafts never join the request's token ids, so its prefix-cache
hashes only ever cover accepted tokens.
"""

from __future__ import annotations

from minivllm.kv_cache.manager import KVCacheManager
from minivllm.scheduler.request import Request
from minivllm.stats import RequestSpecDecodeStats, SpecDecodingStats


class SpecDecodeState:
    """Draft limits, the rollback after verification, and the acceptance counts."""

    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        *,
        num_speculative_tokens: int,
        num_lookahead_tokens: int,
        disable_batch_size: int | None,
        max_model_len: int,
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.num_speculative_tokens = num_speculative_tokens
        self.num_lookahead_tokens = num_lookahead_tokens
        self.disable_batch_size = disable_batch_size
        self.max_model_len = max_model_len
        self.stats = SpecDecodingStats(num_speculative_tokens)
        # Block-table lengths to send the worker after rejected drafts' blocks were freed.
        self.kept_blocks: dict[str, int] = {}

    def speculating(self, num_requests: int) -> bool:
        """Whether this step verifies and proposes drafts (off for large batches)."""
        limit = self.disable_batch_size
        return limit is None or num_requests < limit

    def drafts_to_verify(self, request: Request, budget: int) -> list[int]:
        """The request's drafts, cut to what the budget, the context and max_tokens allow
        (a draft past the last token the request may produce would be thrown away)."""
        drafts = request.spec_token_ids
        if not drafts or request.num_tokens - request.num_computed_tokens != 1:
            return []
        room = min(budget - 1, self.max_model_len - request.num_tokens)
        if request.max_tokens is not None:
            room = min(room, request.max_tokens - request.num_output_tokens - 1)
        return drafts[: max(room, 0)]

    def roll_back(self, request: Request, num_drafts: int, num_accepted: int) -> None:
        """Un-compute the rejected drafts and free the blocks that held only them."""
        request.num_computed_tokens -= num_drafts - num_accepted
        self.stats.observe_draft(num_drafts, num_accepted)
        if request.spec_decode is None:
            request.spec_decode = RequestSpecDecodeStats()
        request.spec_decode.observe_draft(num_drafts, num_accepted)
        manager = self.kv_cache_manager
        before = manager.num_table_blocks(request.request_id)
        kept = manager.trim_blocks(request, request.num_computed_tokens + self.num_lookahead_tokens)
        if kept < before:
            self.kept_blocks[request.request_id] = kept

    def forget(self, request: Request) -> None:
        """The request left the running set (preempted or finished)."""
        request.spec_token_ids = []
        self.kept_blocks.pop(request.request_id, None)
