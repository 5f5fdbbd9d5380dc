"""Stop conditions and aborts."""

from __future__ import annotations

import pytest
from sched_helpers import make_request, make_scheduler

from minivllm.scheduler import EngineCoreOutput, ModelRunnerOutput, RequestStatus, Scheduler

EOS = 2


def _generate(sched: Scheduler, script: list[int], rid: str = "a") -> list[EngineCoreOutput]:
    """Feed scripted tokens to one request until it finishes or the script ends."""
    outs: list[EngineCoreOutput] = []
    for token in script:
        scheduler_output = sched.schedule()
        if rid not in scheduler_output.num_scheduled_tokens:
            break
        outs += sched.update_from_output(scheduler_output, ModelRunnerOutput([rid], [[token]]))
        if outs and outs[-1].finished:
            break
    return outs


def _tokens(outs: list[EngineCoreOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def test_eos_stops_with_reason_stop() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=10, eos_token_id=EOS))
    outs = _generate(sched, [7, 8, EOS, 9])
    assert _tokens(outs) == [7, 8, EOS]
    assert (outs[-1].finish_reason, outs[-1].stop_reason) == ("stop", None)
    assert not sched.has_unfinished_requests()


def test_ignore_eos_and_min_tokens() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=4, eos_token_id=EOS, ignore_eos=True))
    outs = _generate(sched, [EOS, EOS, EOS, EOS, EOS])
    assert _tokens(outs) == [EOS] * 4 and outs[-1].finish_reason == "length"

    sched.add_request(make_request("b", 5, max_tokens=9, eos_token_id=EOS, min_tokens=3))
    outs = _generate(sched, [EOS, EOS, EOS, EOS], rid="b")
    # EOS is only honoured once min_tokens are out (the sampler normally masks it before).
    assert _tokens(outs) == [EOS, EOS, EOS] and outs[-1].finish_reason == "stop"


def test_stop_token_ids_report_the_stop_reason() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=10, stop_token_ids=[42], min_tokens=2))
    outs = _generate(sched, [42, 5, 42, 6])
    assert _tokens(outs) == [42, 5, 42]
    assert (outs[-1].finish_reason, outs[-1].stop_reason) == ("stop", 42)


def test_extra_eos_ids_from_all_stop_token_ids() -> None:
    sched = make_scheduler()
    req = make_request("a", 5, max_tokens=10, eos_token_id=EOS)
    req.sampling_params.all_stop_token_ids.add(77)  # e.g. a second EOS of the model
    sched.add_request(req)
    outs = _generate(sched, [1, 77, 3])
    assert _tokens(outs) == [1, 77] and outs[-1].finish_reason == "stop"


def test_max_tokens_and_max_model_len_cap_with_reason_length() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=3))
    outs = _generate(sched, [1, 1, 1, 1])
    assert _tokens(outs) == [1, 1, 1] and outs[-1].finish_reason == "length"

    sched = make_scheduler(max_model_len=8)
    sched.add_request(make_request("b", 5, max_tokens=100))
    outs = _generate(sched, [1] * 10, rid="b")
    assert _tokens(outs) == [1, 1, 1] and outs[-1].finish_reason == "length"


def test_abort_frees_every_block_at_once() -> None:
    sched = make_scheduler(num_blocks=32, max_num_batched_tokens=12)
    mgr = sched.kv_cache_manager
    idle = mgr.num_free_blocks
    sched.add_request(make_request("run", 20, max_tokens=50))  # in a chunked prefill
    sched.add_request(make_request("wait", 8, max_tokens=50))
    scheduler_output = sched.schedule()
    sched.update_from_output(scheduler_output, ModelRunnerOutput(["run"], [[]]))
    assert mgr.num_free_blocks < idle and sched.requests["run"].status == RequestStatus.RUNNING
    sched.finish_requests(["run", "wait", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert mgr.num_free_blocks == idle
    assert not sched.has_unfinished_requests()
    assert sched.schedule().finished_req_ids == {"run", "wait"}


def test_finish_requests_for_stop_strings_and_in_flight_results() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=10))
    scheduler_output = sched.schedule()
    # The detokenizer saw a stop string while the step was running.
    sched.finish_requests("a", RequestStatus.FINISHED_STOPPED)
    assert sched.update_from_output(scheduler_output, ModelRunnerOutput(["a"], [[3]])) == []
    assert sched.kv_cache_manager.usage == 0.0
    with pytest.raises(ValueError, match="not a finished status"):
        sched.finish_requests("a", RequestStatus.RUNNING)


def test_logprobs_are_passed_through_per_new_token() -> None:
    sched = make_scheduler()
    sched.add_request(make_request("a", 5, max_tokens=1))
    scheduler_output = sched.schedule()
    entry = (3, -0.5, 1, {3: -0.5})
    mro = ModelRunnerOutput(["a"], [[3]], logprobs=[[entry]], prompt_logprobs={"a": [None]})
    (out,) = sched.update_from_output(scheduler_output, mro)
    assert out.new_logprobs == [entry] and out.new_prompt_logprobs == [None]
    assert out.finish_reason == "length"
