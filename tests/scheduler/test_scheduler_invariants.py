"""The invariants `schedule()` asserts at the end of every step (`StepPlan.check_invariants`),
under random workloads, and proof that they trip when the scheduler goes wrong."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sched_helpers import FakeModelRunner, make_request, make_scheduler

from minivllm.scheduler import EngineCoreOutput, Scheduler
from minivllm.scheduler.step import StepPlan

BS = 4


def _drive(
    sched: Scheduler, depth: int
) -> tuple[dict[str, list[int]], dict[str, EngineCoreOutput]]:
    """The engine's loop with up to ``depth`` batches in flight, checking from outside
    what the scheduler asserts inside."""
    runner = FakeModelRunner(BS)
    opts = sched.options
    queue: deque = deque()
    tokens: dict[str, list[int]] = {}
    final: dict[str, EngineCoreOutput] = {}
    for _ in range(5_000):
        if not sched.has_unfinished_requests() and not queue:
            return tokens, final
        if len(queue) < depth:
            scheduler_output = sched.schedule()
            assert scheduler_output.total_num_scheduled_tokens == sum(
                scheduler_output.num_scheduled_tokens.values()
            )
            assert scheduler_output.total_num_scheduled_tokens <= opts.max_num_batched_tokens
            assert len(scheduler_output.num_scheduled_tokens) <= opts.max_num_seqs
            assert len(sched.running) <= opts.max_num_seqs
            if not scheduler_output.is_empty or not queue:
                queue.append((scheduler_output, runner.execute(scheduler_output)))
                if not scheduler_output.is_empty and len(queue) < depth:
                    continue
            else:
                sched.return_unsent(scheduler_output)
        scheduler_output, out = queue.popleft()
        for o in sched.update_from_output(scheduler_output, out):
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                final[o.request_id] = o
    raise AssertionError("requests did not finish")


def _add_workload(sched: Scheduler, workload: list[tuple[int, int, int, int]]) -> list[str]:
    added = []
    for i, (length, max_tokens, shared, priority) in enumerate(workload):
        prompt = [*range(300, 300 + shared), *range(i * 20, i * 20 + length)]
        if sched.options.policy != "priority":
            priority = 0
        sched.check_request(len(prompt), priority)  # what the engine validates first
        rid = f"r{i}"
        sched.add_request(
            make_request(rid, prompt, max_tokens=max_tokens, ignore_eos=True, priority=priority)
        )
        added.append(rid)
    return added


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    workload=st.lists(
        st.tuples(st.integers(1, 16), st.integers(1, 10), st.integers(0, 8), st.integers(0, 2)),
        min_size=1,
        max_size=7,
    ),
    num_blocks=st.integers(10, 40),
    budget=st.integers(4, 24),
    max_num_seqs=st.integers(1, 5),
    chunked=st.booleans(),
    threshold=st.sampled_from([0, 3, 8]),
    policy=st.sampled_from(["fcfs", "priority"]),
    depth=st.integers(1, 3),
    caching=st.booleans(),
)
# Chunked prompts longer than a step, a cache that forces preemption, two batches in flight.
@example([(16, 6, 8, 1), (12, 9, 8, 0), (5, 4, 0, 2)], 12, 6, 3, True, 0, "priority", 2, True)
def test_random_workloads_keep_the_step_invariants(
    workload: list[tuple[int, int, int, int]],
    num_blocks: int,
    budget: int,
    max_num_seqs: int,
    chunked: bool,
    threshold: int,
    policy: str,
    depth: int,
    caching: bool,
) -> None:
    # Every request alone fits: its prompt in one step when prompts are not chunked
    # (longest prompt: 8 shared + 16 own), its whole context in the cache (9 blocks + null).
    budget = budget if chunked else max(budget, 24)
    kw = dict(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=threshold,
        policy=policy,
        enable_caching=caching,
    )
    sched = make_scheduler(num_blocks, BS, max_concurrent_batches=depth, **kw)
    added = _add_workload(sched, workload)
    tokens, final = _drive(sched, depth)
    # Scheduling changes when tokens run, never which: a roomy one-batch run agrees.
    ref_sched = make_scheduler(200, BS, **{**kw, "max_num_seqs": 8})
    _add_workload(ref_sched, workload)
    ref_tokens, _ = _drive(ref_sched, 1)
    assert tokens == ref_tokens
    assert sorted(final) == sorted(added)
    assert all(len(tokens[r]) == workload[int(r[1:])][1] for r in added)
    mgr = sched.kv_cache_manager
    assert mgr.num_free_blocks == mgr.block_pool.num_usable_blocks and sched.requests == {}


def test_a_step_over_its_token_budget_trips_the_invariants(monkeypatch: pytest.MonkeyPatch) -> None:
    sched = make_scheduler(max_num_batched_tokens=8)
    sched.add_request(make_request("a", 6))
    sched.add_request(make_request("b", 6))
    # A broken running-request helper that forgets the budget.
    monkeypatch.setattr(
        Scheduler, "_running_tokens", lambda self, r, step: r.num_tokens - r.num_computed_tokens
    )
    first = sched.schedule()  # admits a (6) and 2 tokens of b: within budget
    assert first.total_num_scheduled_tokens == 8
    sched.update_from_output(first, FakeModelRunner(BS).execute(first))
    # b's remaining 4 tokens plus a's decode fit; grow a's work so the step overdraws.
    sched.requests["a"].append_output_token_ids([1] * 8)
    with pytest.raises(AssertionError, match="budget"):
        sched.schedule()


def test_more_running_requests_than_max_num_seqs_trips_the_invariants() -> None:
    sched = make_scheduler(max_num_seqs=3)
    for rid in "abc":
        sched.add_request(make_request(rid, 4))
    sched.schedule()
    sched.options.max_num_seqs = 2  # the running list now breaks the limit
    with pytest.raises(AssertionError, match="max_num_seqs"):
        sched.schedule()


def test_invariants_reject_a_plan_with_a_request_scheduled_past_its_tokens() -> None:
    sched = make_scheduler()
    request = make_request("a", 4)
    sched.add_request(request)
    plan = StepPlan(max_num_batched_tokens=64, max_reqs=8, use_spec=False)
    sched.running.append(sched.waiting.pop())
    request.status = request.status.RUNNING
    plan.add_new(request, 5, is_partial=False, is_long=False)  # 5 of its 4 tokens
    with pytest.raises(AssertionError, match="past its tokens"):
        plan.check_invariants(sched.running, max_num_seqs=8)
