"""Scheduler policy: budgets, chunked prefill, mixing, ordering, admission checks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sched_helpers import FakeModelRunner, make_request, make_scheduler, run_to_completion

from minivllm.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput


def _step(sched: Scheduler, runner: FakeModelRunner) -> SchedulerOutput:
    scheduler_output = sched.schedule()
    sched.update_from_output(scheduler_output, runner.execute(scheduler_output))
    return scheduler_output


def test_chunked_prefill_splits_a_long_prompt_under_the_budget() -> None:
    sched = make_scheduler(max_num_batched_tokens=16, block_size=4)
    runner = FakeModelRunner(4)
    sched.add_request(make_request("a", 40, max_tokens=2))
    chunks = []
    for _ in range(3):
        scheduler_output = _step(sched, runner)
        chunks.append(scheduler_output.num_scheduled_tokens["a"])
    assert chunks == [16, 16, 8]
    assert sched.requests["a"].num_output_tokens == 1  # only the last chunk samples
    scheduler_output = sched.schedule()
    # The first step sent it as new; later steps as cached deltas with its progress.
    assert scheduler_output.scheduled_cached_reqs.req_ids == ["a"]
    assert scheduler_output.scheduled_cached_reqs.num_computed_tokens == [40]


def test_long_prefill_token_threshold_caps_each_chunk() -> None:
    sched = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=10)
    runner = FakeModelRunner(4)
    sched.add_request(make_request("a", 25))
    assert [_step(sched, runner).num_scheduled_tokens["a"] for _ in range(3)] == [10, 10, 5]


def test_prefill_and_decode_share_a_step() -> None:
    sched = make_scheduler(max_num_batched_tokens=20)
    runner = FakeModelRunner(4)
    sched.add_request(make_request("a", 6, max_tokens=10))
    _step(sched, runner)
    sched.add_request(make_request("b", 30, max_tokens=10))
    scheduler_output = _step(sched, runner)
    # The decode goes first, then b's prefill takes what is left of the budget.
    assert scheduler_output.num_scheduled_tokens == {"a": 1, "b": 19}
    assert [r.req_id for r in scheduler_output.scheduled_new_reqs] == ["b"]
    assert scheduler_output.scheduled_cached_reqs.req_ids == ["a"]


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room() -> None:
    sched = make_scheduler(max_num_batched_tokens=20, enable_chunked_prefill=False)
    runner = FakeModelRunner(4)
    sched.add_request(make_request("a", 15, max_tokens=3))
    sched.add_request(make_request("b", 10, max_tokens=3))
    assert _step(sched, runner).num_scheduled_tokens == {"a": 15}
    assert _step(sched, runner).num_scheduled_tokens == {"a": 1, "b": 10}
    with pytest.raises(ValueError, match="enable chunked prefill"):
        sched.check_request(21)


def test_max_num_seqs_limits_the_batch() -> None:
    sched = make_scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    runner = FakeModelRunner(4)
    for rid in "abc":
        sched.add_request(make_request(rid, 5, max_tokens=2))
    scheduler_output = _step(sched, runner)
    assert set(scheduler_output.num_scheduled_tokens) == {"a", "b"}
    assert sched.get_num_unfinished_requests() == 3
    scheduler_output = _step(sched, runner)  # a and b finish here (2 tokens each)
    assert set(scheduler_output.num_scheduled_tokens) == {"a", "b"}
    scheduler_output = sched.schedule()
    assert set(scheduler_output.num_scheduled_tokens) == {"c"}
    assert scheduler_output.finished_req_ids == {"a", "b"}


@pytest.mark.parametrize(
    ("policy", "expected"), [("fcfs", ["x", "y", "z"]), ("priority", ["z", "x", "y"])]
)
def test_admission_order(policy: str, expected: list[str]) -> None:
    sched = make_scheduler(max_num_seqs=1, policy=policy)
    prio = policy == "priority"
    sched.add_request(make_request("x", 4, max_tokens=1, arrival_time=1.0, priority=1 * prio))
    sched.add_request(make_request("y", 4, max_tokens=1, arrival_time=2.0, priority=1 * prio))
    sched.add_request(make_request("z", 4, max_tokens=1, arrival_time=3.0, priority=0))
    runner = FakeModelRunner(4)
    order = [next(iter(_step(sched, runner).num_scheduled_tokens)) for _ in range(3)]
    assert order == expected


def test_priority_requires_the_priority_policy() -> None:
    with pytest.raises(ValueError, match="policy 'priority'"):
        make_scheduler().check_request(4, priority=2)
    with pytest.raises(ValueError, match="fcfs, priority"):
        make_scheduler(policy="lifo")


def test_add_request_asserts_what_the_engine_validated() -> None:
    # The engine validates each request once (engine/input_processor.py); the scheduler
    # only asserts, so an unvalidated bad request is a bug that shows at once.
    sched = make_scheduler(max_model_len=32)
    with pytest.raises(AssertionError, match="not validated"):
        sched.add_request(make_request("a", 33))
    sched.add_request(make_request("b", 8, max_tokens=None))
    assert sched.requests["b"].max_tokens == 24  # None means up to max_model_len
    with pytest.raises(AssertionError, match="already in use"):
        sched.add_request(make_request("b", 8))


def test_partial_prefill_tokens_from_the_runner_are_ignored() -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add_request(make_request("a", 20))
    scheduler_output = sched.schedule()
    outs = sched.update_from_output(scheduler_output, ModelRunnerOutput(["a"], [[7]]))
    assert outs == [] and sched.requests["a"].output_token_ids == []


def test_stats_and_prefix_cache_hits_across_requests() -> None:
    sched = make_scheduler(block_size=4, max_num_seqs=1)
    runner = FakeModelRunner(4)
    shared = list(range(1, 13))
    sched.add_request(make_request("a", [*shared, 50], max_tokens=2))
    sched.add_request(make_request("b", [*shared, 60], max_tokens=2))
    _, final = run_to_completion(sched, runner)
    assert final["a"].num_cached_tokens == 0
    assert final["b"].num_cached_tokens == 12
    stats = sched.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (26, 12)
    assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)


def test_from_config_reads_vllm_field_names() -> None:
    cfg = SimpleNamespace(
        scheduler_config=SimpleNamespace(
            max_num_seqs=3,
            max_num_batched_tokens=48,
            enable_chunked_prefill=False,
            policy="priority",
            long_prefill_token_threshold=0,
            max_num_scheduled_tokens=40,
            max_num_partial_prefills=2,
            max_long_partial_prefills=1,
            scheduler_reserve_full_isl=False,
        ),
        model_config=SimpleNamespace(max_model_len=48),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1),
        cache_config=SimpleNamespace(
            block_size=16, enable_prefix_caching=False, prefix_caching_hash_algo="sha256_cbor"
        ),
    )
    sched = Scheduler.from_config(cfg, num_blocks=10)
    assert (
        sched.options.max_num_seqs,
        sched.options.max_num_batched_tokens,
        sched.options.max_model_len,
    ) == (3, 40, 48)
    assert sched.options.policy == "priority" and not sched.options.enable_chunked_prefill
    assert (sched.options.max_num_partial_prefills, sched.options.reserve_full_isl) == (2, False)
    mgr = sched.kv_cache_manager
    assert (mgr.block_size, mgr.enable_caching, mgr.num_free_blocks) == (16, False, 9)
    cfg.cache_config.block_size = None
    with pytest.raises(ValueError, match="block_size"):
        Scheduler.from_config(cfg, num_blocks=10)


@pytest.mark.parametrize(("max_partial", "expected_b"), [(1, None), (2, 10)])
def test_max_num_partial_prefills_limits_concurrent_chunked_prompts(
    max_partial: int, expected_b: int | None
) -> None:
    sched = make_scheduler(max_num_batched_tokens=40, long_prefill_token_threshold=10)
    sched.options.max_num_partial_prefills = sched.options.max_long_partial_prefills = max_partial
    sched.add_request(make_request("a", 30))
    sched.add_request(make_request("b", 30))
    scheduler_output = sched.schedule()
    assert scheduler_output.num_scheduled_tokens.get("a") == 10
    assert scheduler_output.num_scheduled_tokens.get("b") == expected_b


def test_reserve_full_isl_admits_only_prompts_whose_blocks_are_all_free() -> None:
    for reserve, expected in ((True, {"a": 1}), (False, {"a": 1, "b": 8})):
        # 8 usable blocks of 4 tokens; a holds 3, b's 24-token prompt needs 6.
        sched = make_scheduler(num_blocks=9, max_num_batched_tokens=9)
        sched.options.reserve_full_isl = reserve
        runner = FakeModelRunner(4)
        sched.add_request(make_request("a", 9, max_tokens=10))
        _step(sched, runner)
        sched.add_request(make_request("b", 24, max_tokens=1))
        assert sched.schedule().num_scheduled_tokens == expected


def test_from_config_accepts_the_real_config_classes() -> None:
    from minivllm.config.cache import CacheConfig
    from minivllm.config.parallel import ParallelConfig
    from minivllm.config.scheduler import SchedulerConfig

    cfg = SimpleNamespace(
        scheduler_config=SchedulerConfig(
            max_num_seqs=4, max_num_batched_tokens=64, max_model_len=128, policy="priority"
        ),
        model_config=SimpleNamespace(max_model_len=128),
        parallel_config=ParallelConfig(),
        cache_config=CacheConfig(block_size=16, prefix_caching_hash_algo="sha256_cbor"),
    )
    sched = Scheduler.from_config(cfg, num_blocks=33)
    assert (
        sched.options.max_num_seqs,
        sched.options.max_num_batched_tokens,
        sched.options.policy,
    ) == (4, 64, "priority")
    assert sched.kv_cache_manager.max_num_tokens == 32 * 16
    assert sched.kv_cache_manager.hash_fn.__name__ == "sha256_cbor"
