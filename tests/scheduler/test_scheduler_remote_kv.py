"""The scheduler with a KV connector (a fake one: every prompt's blocks are "held
outside"), torch-free.

- A request whose KV loads waits in WAITING_FOR_REMOTE_KVS holding blocks for its
  whole prompt, while the batch runs without it; the metadata of the step carries
  its load, and once the load is reported it computes its last prompt token only.
- A request short of room while only loads hold blocks waits for them (it is not
  finished as too long for the cache).
"""

from __future__ import annotations

from sched_helpers import make_request, make_scheduler

from minivllm.kv_transfer.base import (
    KVConnectorMetadata,
    KVConnectorOutput,
    KVConnectorScheduler,
    KVLoad,
)
from minivllm.scheduler.output import ModelRunnerOutput
from minivllm.scheduler.remote_kv import RemoteKV
from minivllm.scheduler.request import RequestStatus


class EverythingOutside(KVConnectorScheduler):
    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self.loads: list[KVLoad] = []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):  # noqa: ANN001, ANN201
        return request.num_tokens - 1 - num_computed_tokens, True

    def update_state_after_alloc(self, request, block_ids, num_external_tokens) -> None:  # noqa: ANN001
        self.loads.append(KVLoad(request.request_id, list(block_ids), num_external_tokens))

    def build_connector_meta(self, scheduled):  # noqa: ANN001, ANN201
        meta = KVConnectorMetadata(loads=self.loads)
        self.loads = []
        return meta


def _scheduler(num_blocks: int):  # noqa: ANN202
    sched = make_scheduler(num_blocks=num_blocks, block_size=4)
    sched.remote_kv = RemoteKV(EverythingOutside(4), sched.kv_cache_manager, "fail")
    return sched


def _report(sched, out, loaded: dict[str, int]) -> None:  # noqa: ANN001
    runner = ModelRunnerOutput(
        req_ids=list(out.num_scheduled_tokens),
        sampled_token_ids=[[7] for _ in out.num_scheduled_tokens],
        kv_connector_output=KVConnectorOutput(finished_loads=loaded),
    )
    sched.update_from_output(out, runner)


def test_a_loading_request_waits_with_its_blocks_and_then_computes_one_token() -> None:
    sched = _scheduler(num_blocks=32)
    sched.add_request(make_request("a", 21))
    out = sched.schedule()
    request = sched.requests["a"]
    assert request.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert out.num_scheduled_tokens == {}
    (load,) = out.kv_connector_metadata.loads
    assert load.req_id == "a" and load.num_tokens == 20
    # Blocks for the whole prompt (21 tokens: 6 blocks of 4) are held from the start.
    assert sched.kv_cache_manager.get_num_held_blocks("a") == 6
    _report(sched, out, {"a": 20})
    out = sched.schedule()
    assert out.num_scheduled_tokens == {"a": 1}
    assert request.status == RequestStatus.RUNNING and request.num_computed_tokens == 21


def test_a_request_short_of_room_waits_for_the_loads() -> None:
    sched = _scheduler(num_blocks=8)  # 7 usable blocks: a takes 6
    sched.add_request(make_request("a", 21))
    sched.add_request(make_request("b", 12))
    out = sched.schedule()
    assert sched.requests["a"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert sched.requests["b"].status == RequestStatus.WAITING  # not finished: it waits
    _report(sched, out, {"a": 20})
    finished = set()
    for _ in range(30):
        out = sched.schedule()
        if not out.num_scheduled_tokens and not sched.has_unfinished_requests():
            break
        _report(sched, out, {ld.req_id: ld.num_tokens for ld in out.kv_connector_metadata.loads})
        finished |= {r for r in ("a", "b") if r not in sched.requests}
    assert finished == {"a", "b"}
    assert sched.kv_cache_manager.get_num_held_blocks() == 0
