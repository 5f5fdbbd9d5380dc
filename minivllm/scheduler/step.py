"""`StepPlan`: one `Scheduler.schedule()` call's work in progress.

The running and waiting helpers of the scheduler both add to it; it keeps the
token budget, the requests picked so far and their new blocks, and it can take a
running request back out when that request is preempted later in the same step.
`check_invariants` states what every finished plan satisfies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.kv_cache.blocks import KVCacheBlocks
from minivllm.scheduler.request import Request, RequestStatus


@dataclass
class StepPlan:
    """The tokens, requests and blocks chosen so far in one step."""

    max_num_batched_tokens: int
    """The step's whole token budget."""
    max_reqs: int
    """Most requests this step may take (its share when several batches are in flight)."""
    use_spec: bool
    """Whether this step verifies drafts."""
    budget: int = -1
    """Tokens left to hand out (starts at the whole budget)."""
    num_scheduled: dict[str, int] = field(default_factory=dict)
    """Tokens per scheduled request id, in scheduling order."""
    new_blocks: dict[str, KVCacheBlocks] = field(default_factory=dict)
    """Blocks each running request got this step."""
    running: list[Request] = field(default_factory=list)
    """Requests that were running before this step, in scheduling order."""
    new: list[Request] = field(default_factory=list)
    """Requests admitted from the waiting queue this step."""
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)
    """Draft tokens to verify per request id."""
    preempted_any: bool = False
    """A preemption happened: the cache is full, so nothing new is admitted."""
    num_partial: int = 0
    """Prefills that stay unfinished after this step."""
    num_long_partial: int = 0
    """Of those, the prefills of long prompts (above the long-prefill threshold)."""

    def __post_init__(self) -> None:
        if self.budget < 0:
            self.budget = self.max_num_batched_tokens

    def has_room(self) -> bool:
        """Tokens and request slots are left."""
        return self.budget > 0 and len(self.num_scheduled) < self.max_reqs

    def add_running(self, request: Request, num_tokens: int, blocks: KVCacheBlocks) -> None:
        self.running.append(request)
        self.num_scheduled[request.request_id] = num_tokens
        self.new_blocks[request.request_id] = blocks
        self.budget -= num_tokens

    def add_new(self, request: Request, num_tokens: int, is_partial: bool, is_long: bool) -> None:
        self.new.append(request)
        self.num_scheduled[request.request_id] = num_tokens
        self.budget -= num_tokens
        self.num_partial += int(is_partial)
        self.num_long_partial += int(is_long)

    def remove_running(self, request: Request) -> None:
        """Undo a running request's place in this step (it is being preempted)."""
        rid = request.request_id
        self.spec_tokens.pop(rid, None)
        if rid not in self.num_scheduled:
            return
        self.running.remove(request)
        self.budget += self.num_scheduled.pop(rid)
        del self.new_blocks[rid]

    def count_partial_prefills(self, long_prefill_token_threshold: int) -> None:
        """Count the running requests' prefills that this step leaves unfinished."""
        for request in self.running:
            if request.num_computed_tokens + self.num_scheduled[request.request_id] < (
                request.num_tokens
            ):
                self.num_partial += 1
                self.num_long_partial += int(0 < long_prefill_token_threshold < request.num_tokens)

    @property
    def scheduled(self) -> list[Request]:
        return [*self.running, *self.new]

    def check_invariants(self, running: list[Request], max_num_seqs: int) -> None:
        """What every step satisfies (asserts: a failure is a scheduler bug).

        ``running``: the scheduler's running list after the step.
        """
        total = sum(self.num_scheduled.values())
        assert self.budget >= 0, f"token budget overdrawn: {self.budget}"
        assert total == self.max_num_batched_tokens - self.budget, "budget out of step"
        assert total <= self.max_num_batched_tokens, "more tokens than the step's budget"
        assert len(running) <= max_num_seqs, "more running requests than max_num_seqs"
        assert len(self.num_scheduled) <= self.max_reqs, "more requests than this batch's share"
        scheduled = self.scheduled
        assert len(scheduled) == len(self.num_scheduled), "a request scheduled twice"
        assert len(scheduled) <= len(running), "a scheduled request is not running"
        live = {id(r) for r in running}
        for request in scheduled:
            rid = request.request_id
            num = self.num_scheduled[rid]
            assert num > 0, f"{rid}: nothing scheduled"
            assert id(request) in live and request.status == RequestStatus.RUNNING, rid
            drafts = len(self.spec_tokens.get(rid, ()))
            assert request.num_computed_tokens + num <= request.num_tokens + drafts, (
                f"{rid}: scheduled past its tokens"
            )
        assert set(self.spec_tokens) <= set(self.num_scheduled), "drafts of an unscheduled request"
        assert set(self.new_blocks) == {r.request_id for r in self.running}
