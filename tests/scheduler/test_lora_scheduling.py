"""The scheduler with LoRA: at most max_loras adapters running (the others wait, and
requests behind them go ahead), the adapter kept through preemption and chunked
prefill, prefix-cache hashes that include the adapter."""

from __future__ import annotations

from sched_helpers import FakeModelRunner, make_request

from minivllm.kv_cache.manager import KVCacheManager
from minivllm.lora.request import LoRARequest
from minivllm.scheduler.options import SchedulerOptions
from minivllm.scheduler.scheduler import Scheduler

LORAS = {name: LoRARequest(name, i, f"/adapters/{name}") for i, name in enumerate("abc", 1)}


def make(max_loras: int, num_blocks: int = 64, budget: int = 64) -> Scheduler:
    manager = KVCacheManager(num_blocks, 4, True, "sha256", max_model_len=256)
    options = SchedulerOptions(
        max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=256, max_loras=max_loras
    )
    return Scheduler(manager, options)


def add(sched: Scheduler, rid: str, lora: str | None, prompt: int = 12, **kw) -> None:
    request = make_request(rid, prompt, max_tokens=6, **kw)
    request.lora_request = LORAS[lora] if lora else None
    sched.add_request(request)


def drive(
    sched: Scheduler, runner: FakeModelRunner, sent: dict[str, LoRARequest | None]
) -> list[set[int]]:
    """Run to completion; the adapters of the running batch at every step."""
    loras_per_step: list[set[int]] = []
    for _ in range(500):
        if not sched.has_unfinished_requests():
            return loras_per_step
        out = sched.schedule()
        for new in out.scheduled_new_reqs:  # a resumed request comes with its adapter
            assert new.lora_request == sched.requests[new.req_id].lora_request
            sent[new.req_id] = new.lora_request
        loras = {sent[r].lora_int_id for r in out.num_scheduled_tokens if sent[r] is not None}
        loras_per_step.append(loras)
        sched.update_from_output(out, runner.execute(out))
    raise AssertionError("requests did not finish")


def test_at_most_max_loras_adapters_per_batch_and_base_requests_go_ahead() -> None:
    sched = make(max_loras=2)
    for rid, lora in [("a1", "a"), ("b1", "b"), ("c1", "c"), ("base", None), ("a2", "a")]:
        add(sched, rid, lora)
    first = sched.schedule()
    admitted = {n.req_id for n in first.scheduled_new_reqs}
    assert admitted == {"a1", "b1", "base", "a2"}  # c waits; those behind it go ahead
    assert [r.request_id for r in sched.waiting] == ["c1"]
    runner = FakeModelRunner(4)
    sched.update_from_output(first, runner.execute(first))
    steps = drive(sched, runner, {n.req_id: n.lora_request for n in first.scheduled_new_reqs})
    assert all(len(loras) <= 2 for loras in steps)
    assert any(3 in loras for loras in steps)  # c ran once a slot was free
    assert not sched.has_unfinished_requests()


def test_the_adapter_survives_preemption_and_chunked_prefill() -> None:
    # 12 blocks of 4 tokens for 3 requests that need 5 each: preemptions; budget 8:
    # 30-token prompts are chunked.
    sched = make(max_loras=3, num_blocks=13, budget=8)
    for rid, lora in [("a", "a"), ("b", "b"), ("base", None)]:
        add(sched, rid, lora, prompt=14)
    steps = drive(sched, FakeModelRunner(4), {})
    assert sched.num_preemptions > 0
    assert max(len(s) for s in steps) <= 3


def test_block_hashes_depend_on_the_adapter() -> None:
    sched = make(max_loras=3)
    hashes = {}
    for name in [None, "a", "b"]:
        rid = f"r{name}"
        request = make_request(rid, [5] * 12, max_tokens=2)
        request.lora_request = LORAS[name] if name else None
        sched.add_request(request)
        hashes[name] = request.block_hashes
    assert all(len(h) == 3 for h in hashes.values())
    assert len({h[0] for h in hashes.values()}) == 3
