"""The scheduler's side of speculative decoding (torch-free): drafts scheduled as part
of a request's query, rejected drafts rolled back, their blocks freed, prefix-cache
hashes only over accepted tokens, and the batch-size switch."""

from __future__ import annotations

from minivllm.kv_cache import KVCacheManager
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler import ModelRunnerOutput, Request, Scheduler, SchedulerOptions

BLOCK = 4
PROMPT = [1, 2, 3, 4, 5, 6]


def make_scheduler(
    *, lookahead: int = 0, disable: int | None = None, num_blocks: int = 20
) -> Scheduler:
    manager = KVCacheManager(num_blocks, BLOCK, enable_caching=True, max_model_len=64)
    options = SchedulerOptions(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=64,
        num_speculative_tokens=3,
        num_lookahead_tokens=lookahead,
        spec_disable_batch_size=disable,
    )
    return Scheduler(manager, options)


def prefill(sched: Scheduler, rid: str, drafts: list[int], max_tokens: int = 20) -> Request:
    req = Request(rid, PROMPT, SamplingParams(max_tokens=max_tokens))
    sched.add_request(req)
    scheduler_output = sched.schedule()
    assert scheduler_output.num_scheduled_tokens[rid] == len(PROMPT)
    assert scheduler_output.num_spec_tokens_to_propose == 3
    sched.update_from_output(
        scheduler_output, ModelRunnerOutput([rid], [[7]], spec_token_ids=[drafts])
    )
    return req


def test_drafts_are_verified_and_rejected_ones_rolled_back() -> None:
    sched = make_scheduler()
    manager = sched.kv_cache_manager
    req = prefill(sched, "a", [8, 9, 10])
    assert req.spec_token_ids == [8, 9, 10] and req.all_token_ids == [*PROMPT, 7]

    scheduler_output = sched.schedule()
    # The sampled token plus its three drafts, in one query.
    assert scheduler_output.num_scheduled_tokens == {"a": 4}
    assert scheduler_output.scheduled_spec_decode_tokens == {"a": [8, 9, 10]}
    assert len(manager.req_to_blocks["a"][0]) == 3  # slots for 6 + 4 = 10 tokens
    free_before = manager.num_free_blocks
    # The target accepts 8, rejects 9 and picks 42 itself.
    sched.update_from_output(
        scheduler_output, ModelRunnerOutput(["a"], [[8, 42]], spec_token_ids=[[1, 2]])
    )
    assert req.all_token_ids == [*PROMPT, 7, 8, 42]
    assert req.num_computed_tokens == 8  # KV up to 8; 42 is computed next step
    # The block that held only the rejected drafts went back to the pool.
    assert len(manager.req_to_blocks["a"][0]) == 2
    assert manager.num_free_blocks == free_before + 1
    # Prefix-cache hashes cover accepted tokens only: two full blocks.
    assert len(req.block_hashes) == 2
    assert manager.num_cached_blocks["a"] == 2
    stats = sched.make_stats().spec_decoding_stats
    assert stats is not None
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, 3, 1)
    assert stats.num_accepted_tokens_per_pos == [1, 0, 0]
    assert req.spec_decode is not None and req.spec_decode.accepted_per_step == [(1, 3)]

    scheduler_output = sched.schedule()
    # The worker is told to drop the freed block before appending new ones.
    assert scheduler_output.scheduled_cached_reqs.num_kept_blocks == [2]
    assert scheduler_output.num_scheduled_tokens == {
        "a": 3
    } and scheduler_output.scheduled_spec_decode_tokens == {"a": [1, 2]}


def test_a_rejected_continuation_is_never_a_prefix_cache_hit() -> None:
    sched = make_scheduler()
    req = prefill(sched, "a", [8, 9, 10])
    scheduler_output = sched.schedule()
    sched.update_from_output(
        scheduler_output, ModelRunnerOutput(["a"], [[8, 42]], spec_token_ids=[[]])
    )
    assert req.all_token_ids[:8] == [*PROMPT, 7, 8]
    # A prompt that follows the rejected drafts matches only the accepted blocks.
    other = Request("b", [*PROMPT, 7, 8, 9, 10, 11, 12, 13], SamplingParams(max_tokens=4))
    blocks, num_hit = sched.kv_cache_manager.get_computed_blocks(other)
    assert num_hit == 8
    same = Request("c", [*PROMPT, 7, 8, 42, 1, 2, 3, 4], SamplingParams(max_tokens=4))
    assert sched.kv_cache_manager.get_computed_blocks(same)[1] == 8


def test_lookahead_slots_are_reserved_and_kept_for_a_draft_model() -> None:
    sched = make_scheduler(lookahead=3)
    manager = sched.kv_cache_manager
    req = prefill(sched, "a", [8, 9, 10])
    # Prefill of 6 plus 3 lookahead slots: 9 tokens, 3 blocks.
    scheduler_output = sched.schedule()
    assert len(manager.req_to_blocks["a"][0]) == 4  # 6 + 4 + 3 lookahead = 13 slots
    sched.update_from_output(scheduler_output, ModelRunnerOutput(["a"], [[5]], spec_token_ids=[[]]))
    # Nothing accepted: computed 7, plus the drafter's 3 lookahead slots -> 10: 3 blocks.
    assert req.num_computed_tokens == 7
    assert len(manager.req_to_blocks["a"][0]) == 3


def test_drafts_are_cut_to_what_max_tokens_leaves() -> None:
    sched = make_scheduler()
    prefill(sched, "a", [8, 9, 10], max_tokens=3)
    scheduler_output = sched.schedule()
    # One token out, two to go: one draft plus the target's own token.
    assert scheduler_output.scheduled_spec_decode_tokens == {"a": [8]}
    outs = sched.update_from_output(scheduler_output, ModelRunnerOutput(["a"], [[8, 11]]))
    assert outs[0].finished and outs[0].new_token_ids == [8, 11]


def test_speculation_is_off_at_the_batch_size_limit() -> None:
    sched = make_scheduler(disable=2)
    req = prefill(sched, "a", [8, 9, 10])
    sched.add_request(Request("b", PROMPT, SamplingParams(max_tokens=5)))
    scheduler_output = sched.schedule()
    assert (
        scheduler_output.num_spec_tokens_to_propose == 0
        and not scheduler_output.scheduled_spec_decode_tokens
    )
    assert scheduler_output.num_scheduled_tokens["a"] == 1 and req.spec_token_ids == []


def test_drafts_are_dropped_before_anything_is_preempted() -> None:
    sched = make_scheduler(num_blocks=4)  # 3 usable blocks of 4 tokens
    req = prefill(sched, "a", [8, 9, 10])
    scheduler_output = sched.schedule()  # needs 10 slots: all three blocks
    assert scheduler_output.scheduled_spec_decode_tokens == {"a": [8, 9, 10]}
    sched.update_from_output(
        scheduler_output, ModelRunnerOutput(["a"], [[8, 9, 10, 11]], spec_token_ids=[[1, 2, 3]])
    )
    assert req.num_computed_tokens == 10 and req.spec_token_ids == [1, 2, 3]
    # 11 tokens + 3 drafts need 14 slots of 12: it runs without drafts instead of
    # being preempted (or finished for want of KV cache).
    scheduler_output = sched.schedule()
    assert (
        scheduler_output.num_scheduled_tokens == {"a": 1}
        and not scheduler_output.scheduled_spec_decode_tokens
    )
    assert sched.num_preemptions == 0 and not req.is_finished
    assert req.spec_token_ids == []
