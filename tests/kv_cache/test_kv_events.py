"""KV cache events from the block pool, decoded as a vLLM subscriber decodes them.

Every batch goes through msgpack and back through the subscriber's own structs
(`kv_event_schema`, written from vLLM's schema); replaying the decoded events into
a set must give exactly the pool's prefix-cache state, for one group and for a
sliding-window model's two groups, through prefills, decode steps, evictions and a
reset.  Stored events are checked against the hash chain itself: re-hashing their
tokens from their parent must give their hashes.
"""

from __future__ import annotations

import time

import msgspec
import pytest
from kv_event_schema import DECODER, AllBlocksCleared, BlockRemoved, BlockStored, apply, pool_state

from minivllm.kv_cache import KVCacheManager, hash_block_tokens
from minivllm.kv_cache.events import KVEventBatch
from minivllm.kv_cache.hashing import sha256_pickle
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.request import Request

BS = 4


def _manager(num_blocks: int, windows: tuple[int | None, ...] = (None,)) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, enable_kv_cache_events=True, group_windows=windows)


def _step(mgr: KVCacheManager, req: Request, num_new: int) -> None:
    """Schedule ``num_new`` tokens of ``req`` and run them, as scheduler and model do."""
    hits, num_hit = mgr.get_computed_blocks(req) if req.num_computed_tokens == 0 else (None, 0)
    assert mgr.allocate_slots(req, num_new - num_hit, hits) is not None
    req.num_computed_tokens += num_new
    mgr.cache_blocks(req, req.num_computed_tokens)


def _serve(mgr: KVCacheManager, rid: str, prompt: list[int], decode: int = 0) -> None:
    """Prefill ``prompt``, decode ``decode`` tokens one step at a time, then finish."""
    req = Request(rid, prompt, SamplingParams(), block_hasher=mgr.block_hasher)
    _step(mgr, req, req.num_tokens)
    for i in range(decode):
        req.append_output_token_ids(1000 + i)
        _step(mgr, req, 1)
    mgr.free(req)


def _wire(mgr: KVCacheManager) -> list:
    """The events since the last call, encoded as the publisher does and decoded back."""
    batch = KVEventBatch(ts=time.time(), events=mgr.take_events(), data_parallel_rank=0)
    decoded = DECODER.decode(msgspec.msgpack.encode(batch))
    assert decoded.data_parallel_rank == 0 and decoded.ts == batch.ts
    return decoded


@pytest.mark.parametrize("windows", [(None,), (None, 8)], ids=["one-group", "sliding"])
def test_replayed_events_equal_the_pool_state(windows: tuple[int | None, ...]) -> None:
    mgr = _manager(14, windows)
    mirror: set = set()
    prompts = [list(range(n, n + 13)) for n in (0, 100, 200, 300)]
    for i, prompt in enumerate(prompts):
        _serve(mgr, f"r{i}", prompt, decode=5)  # blocks full of outputs are cached too
        apply(mirror, _wire(mgr))
        assert mirror == pool_state(mgr.block_pool.cached_block_hash_to_block)
    # A prompt sharing r3's prefix hits it (nothing new for those blocks), then more
    # misses evict: the pool holds far fewer blocks than were ever cached.
    _serve(mgr, "again", prompts[3][:9] + [7, 7, 7, 7])
    _serve(mgr, "big", list(range(500, 520)))
    batch = _wire(mgr)
    assert any(isinstance(e, BlockRemoved) for e in batch.events)
    apply(mirror, batch)
    state = pool_state(mgr.block_pool.cached_block_hash_to_block)
    assert mirror == state and state
    assert {g for g, _ in state} == set(range(len(windows)))
    assert mgr.reset_prefix_cache()
    batch = _wire(mgr)
    assert [type(e) for e in batch.events] == [AllBlocksCleared]
    apply(mirror, batch)
    assert mirror == set() == pool_state(mgr.block_pool.cached_block_hash_to_block)


def test_stored_events_carry_the_hash_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")  # whole digests
    mgr = _manager(16)
    req = Request("a", list(range(14)), SamplingParams(), block_hasher=mgr.block_hasher)
    _step(mgr, req, 14)  # 3 full blocks
    per_step = [_wire(mgr).events]  # drained once per step, as the engine does
    for i in range(6):  # 2 more blocks fill up while decoding
        req.append_output_token_ids(1000 + i)
        _step(mgr, req, 1)
        per_step.append(_wire(mgr).events)
    # The blocks a step fills fold into one event.
    assert [[len(e.block_hashes) for e in step] for step in per_step] == [
        [3], [], [1], [], [], [], [1]
    ]  # fmt: skip
    stored = [e for step in per_step for e in step]
    assert all(isinstance(e, BlockStored) for e in stored)
    tokens = [*range(14), *range(1000, 1006)]
    assert [t for e in stored for t in e.token_ids] == tokens[:20]
    assert stored[0].parent_block_hash is None
    for event in stored:
        assert (event.block_size, event.medium, event.group_idx) == (BS, "GPU", 0)
        assert len(event.token_ids) == BS * len(event.block_hashes)
        assert event.extra_keys == [None] * len(event.block_hashes)
        parent = event.parent_block_hash
        for i, block_hash in enumerate(event.block_hashes):
            chunk = event.token_ids[i * BS : (i + 1) * BS]
            assert hash_block_tokens(sha256_pickle, parent, chunk) == block_hash
            parent = block_hash
    assert [e.parent_block_hash for e in stored[1:]] == [
        stored[0].block_hashes[-1],
        stored[1].block_hashes[-1],
    ]


def test_int_hashes_are_the_digest_tail_by_default() -> None:
    mgr = _manager(8)
    req = Request("a", list(range(8)), SamplingParams(), block_hasher=mgr.block_hasher)
    _step(mgr, req, 8)
    (event,) = _wire(mgr).events
    assert event.block_hashes == [int.from_bytes(h[-8:], "big") for h in req.block_hashes]


def test_a_duplicate_block_is_announced_once() -> None:
    # Two requests compute the same prompt in one step: one block is the cached copy.
    mgr = _manager(10)
    reqs = [
        Request(r, list(range(8)), SamplingParams(), block_hasher=mgr.block_hasher) for r in "ab"
    ]
    for req in reqs:
        assert mgr.allocate_slots(req, 8) is not None
        req.num_computed_tokens = 8
    for req in reqs:
        mgr.cache_blocks(req, 8)
    events = _wire(mgr).events
    assert sum(len(e.block_hashes) for e in events) == 2
    for req in reqs:
        mgr.free(req)
    _serve(mgr, "c", list(range(50, 82)))  # evicts every cached block
    mirror: set = set()
    for event_batch in (events, _wire(mgr).events):
        apply(mirror, DECODER.decode(msgspec.msgpack.encode([0.0, event_batch])))
    assert mirror == pool_state(mgr.block_pool.cached_block_hash_to_block)


def test_events_off_record_nothing() -> None:
    mgr = KVCacheManager(8, BS)
    _serve(mgr, "a", list(range(9)))
    assert mgr.block_pool.kv_events is None and mgr.take_events() == []


def test_extra_keys_go_with_the_first_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    mgr = KVCacheManager(8, BS, enable_kv_cache_events=True, extra_keys=("salt",))
    req = Request("a", list(range(8)), SamplingParams(), block_hasher=mgr.block_hasher)
    _step(mgr, req, 8)
    (event,) = _wire(mgr).events
    assert event.extra_keys == [("salt",), None]
    first = hash_block_tokens(sha256_pickle, None, range(BS), ("salt",))
    assert event.block_hashes[0] == first == req.block_hashes[0]
