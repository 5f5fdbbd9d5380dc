"""Several batches in flight (pipeline parallelism): the scheduler never runs a
decoding request in two batches, splits the requests between the batches, gives
the ranks that do not sample every token through the scheduler output, and stays
correct (same tokens, KV intact, no leak) under preemption and aborts of requests
whose batch is still running.

The fake model runner executes a batch when it is submitted (as the first stage
does) and the scheduler sees the result only later, oldest first.
"""

from __future__ import annotations

from collections import deque

import pytest
from sched_helpers import FakeModelRunner, make_request, make_scheduler, run_to_completion

from minivllm.scheduler import EngineCoreOutput, Scheduler, SchedulerOutput
from minivllm.scheduler.request import RequestStatus

BS = 4
LENGTHS = [(13, 9), (7, 12), (10, 6), (5, 15), (9, 8), (21, 3), (4, 1), (16, 7)]


class TokenMirror:
    """A rank that does not sample: its token lists come only from scheduler outputs."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.checked = 0

    def follow(self, scheduler_output: SchedulerOutput, runner: FakeModelRunner) -> None:
        for rid in scheduler_output.finished_req_ids:
            self.tokens.pop(rid, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.tokens[new.req_id] = [*new.prompt_token_ids, *new.output_token_ids]
        cached = scheduler_output.scheduled_cached_reqs
        for rid, new_tokens in zip(cached.req_ids, cached.new_token_ids, strict=True):
            self.tokens[rid].extend(new_tokens)
            # The sampling rank holds exactly the same tokens before running the batch.
            assert self.tokens[rid] == runner.reqs[rid].tokens, rid
            self.checked += 1


def _run_pipelined(
    sched: Scheduler,
    runner: FakeModelRunner,
    mirror: TokenMirror | None = None,
    depth: int = 2,
    before_update=None,  # noqa: ANN001
) -> tuple[dict[str, list[int]], dict[str, EngineCoreOutput], int]:
    """The engine's batch-queue loop; returns (tokens, final outputs, most batches in flight)."""
    queue: deque = deque()
    tokens: dict[str, list[int]] = {}
    final: dict[str, EngineCoreOutput] = {}
    most = 0
    for _ in range(10_000):
        if not sched.has_unfinished_requests() and not queue:
            break
        if len(queue) < depth:
            scheduler_output = sched.schedule()
            if not scheduler_output.is_empty or not queue:
                if mirror is not None:
                    mirror.follow(scheduler_output, runner)
                queue.append((scheduler_output, runner.execute(scheduler_output)))
                most = max(most, len(queue))
                if not scheduler_output.is_empty and len(queue) < depth:
                    continue
            else:
                sched.return_unsent(scheduler_output)
        scheduler_output, out = queue.popleft()
        if before_update is not None:
            before_update(sched, scheduler_output)
        for o in sched.update_from_output(scheduler_output, out):
            tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
            if o.finished:
                final[o.request_id] = o
    else:
        raise AssertionError("requests did not finish")
    return tokens, final, most


def _add(sched: Scheduler, lengths=LENGTHS) -> None:  # noqa: ANN001
    for i, (p, m) in enumerate(lengths):
        prompt = list(range(i * 10, i * 10 + p))
        sched.add_request(make_request(f"r{i}", prompt, max_tokens=m, ignore_eos=True))


def _assert_no_leak(sched: Scheduler) -> None:
    mgr = sched.kv_cache_manager
    assert mgr.num_free_blocks == mgr.block_pool.num_usable_blocks
    assert mgr.req_to_blocks == {} and sched.requests == {}


def test_requests_are_split_between_batches_and_never_run_twice_at_once() -> None:
    sched = make_scheduler(block_size=BS, max_concurrent_batches=2, send_sampled_tokens=True)
    _add(sched, [(5, 4), (6, 4), (7, 4)])
    first, second = sched.schedule(), sched.schedule()
    # Three requests over two batches: two, then the third (decodes need the token first).
    assert len(first.num_scheduled_tokens) == 2 and len(second.num_scheduled_tokens) == 1
    assert not set(first.num_scheduled_tokens) & set(second.num_scheduled_tokens)
    assert sched.schedule().is_empty  # everything is in flight
    runner = FakeModelRunner(BS)
    out1, out2 = runner.execute(first), runner.execute(second)
    sched.update_from_output(first, out1)
    third = sched.schedule()  # the first batch's requests decode again, with their tokens
    assert set(third.num_scheduled_tokens) == set(first.num_scheduled_tokens)
    cached = third.scheduled_cached_reqs
    assert cached.new_token_ids == [runner.reqs[r].tokens[-1:] for r in cached.req_ids]
    sched.update_from_output(second, out2)


# Two workloads where a request is preempted while its batch runs and could be
# admitted again before that batch is back (found by a random search).
RESUMED_EARLY = [(13, 5), (6, 3), (2, 6), (18, 8), (4, 6)]
RESUMED_EARLY_3 = [(15, 7), (20, 8), (4, 6), (5, 12), (6, 6), (10, 5), (6, 4), (9, 7)]


@pytest.mark.parametrize(
    ("lengths", "num_blocks", "chunk", "depth"),
    [
        (LENGTHS, 200, 64, 2),
        (LENGTHS, 200, 6, 2),
        (LENGTHS, 12, 64, 2),
        (LENGTHS, 12, 64, 3),
        (RESUMED_EARLY, 15, 4, 4),
        (RESUMED_EARLY_3, 10, 4, 3),
    ],
    ids=["roomy", "chunked", "preempting", "preempting-3", "resumed-early-4", "resumed-early-3"],
)
def test_batches_in_flight_give_the_serial_tokens(
    lengths: list[tuple[int, int]], num_blocks: int, chunk: int, depth: int
) -> None:
    serial = make_scheduler(num_blocks=200, block_size=BS)
    _add(serial, lengths)
    expected, _ = run_to_completion(serial, FakeModelRunner(BS))

    sched = make_scheduler(
        num_blocks=num_blocks,
        block_size=BS,
        max_num_batched_tokens=chunk,
        max_concurrent_batches=depth,
        send_sampled_tokens=True,
    )
    _add(sched, lengths)
    mirror = TokenMirror()
    # The fake runner checks every KV position it reads against what was written there.
    tokens, final, most = _run_pipelined(sched, FakeModelRunner(BS), mirror, depth)
    assert tokens == expected
    assert all(f.finish_reason == "length" for f in final.values()) and len(final) == len(lengths)
    assert most == depth and mirror.checked > 0
    if num_blocks < 200:
        assert sched.num_preemptions > 0
    _assert_no_leak(sched)


def test_abort_of_a_request_in_flight_frees_its_blocks_and_drops_its_late_result() -> None:
    sched = make_scheduler(block_size=BS, max_concurrent_batches=2, send_sampled_tokens=True)
    free_at_start = sched.kv_cache_manager.num_free_blocks
    _add(sched, [(9, 6), (7, 6), (11, 6)])
    aborted: list[str] = []

    def abort_one_in_flight(s: Scheduler, scheduler_output: SchedulerOutput) -> None:
        if not aborted:  # the batch about to be applied is still "in flight" here
            rid = next(iter(scheduler_output.num_scheduled_tokens))
            s.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
            aborted.append(rid)

    tokens, final, _ = _run_pipelined(
        sched, FakeModelRunner(BS), TokenMirror(), before_update=abort_one_in_flight
    )
    assert aborted and aborted[0] not in final and aborted[0] not in tokens
    assert len(final) == 2 and all(len(t) == 6 for t in tokens.values())
    assert sched.kv_cache_manager.num_free_blocks == free_at_start
    _assert_no_leak(sched)


def test_one_batch_sends_no_tokens_unless_asked() -> None:
    sched = make_scheduler(block_size=BS)
    _add(sched, [(5, 3)])
    runner = FakeModelRunner(BS)
    scheduler_output = sched.schedule()
    sched.update_from_output(scheduler_output, runner.execute(scheduler_output))
    assert sched.schedule().scheduled_cached_reqs.new_token_ids == []
