"""`KVCacheBlocks`: the KV cache manager hands the scheduler one block list per group."""

from __future__ import annotations

import pytest

from minivllm.kv_cache import KVCacheBlock, KVCacheBlocks, KVCacheManager
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.request import Request

BS = 4
W = 6


def _req(rid: str, tokens: list[int], mgr: KVCacheManager) -> Request:
    return Request(rid, tokens, SamplingParams(), block_hasher=mgr.block_hasher)


def _prefill(mgr: KVCacheManager, req: Request, chunk: int) -> None:
    while req.num_computed_tokens < req.num_tokens:
        n = min(chunk, req.num_tokens - req.num_computed_tokens)
        assert mgr.allocate_slots(req, n) is not None
        req.num_computed_tokens += n
        mgr.cache_blocks(req, req.num_computed_tokens)


def test_new_blocks_come_per_group_and_match_the_block_tables() -> None:
    mgr = KVCacheManager(40, BS, group_windows=(None, W, W), max_num_batched_tokens=8)
    req = _req("a", list(range(10)), mgr)
    new = mgr.allocate_slots(req, 10)
    assert new is not None and new.num_groups == 3 and new.num_blocks == 3
    # Each group got its own blocks, and the table of group g is exactly group(g).
    ids = new.get_block_ids()
    assert len({i for group in ids for i in group}) == 9
    for g in range(3):
        assert list(new.group(g)) == mgr.req_to_blocks["a"][g]
        assert ids[g] == [b.block_id for b in mgr.req_to_blocks["a"][g]]
    # The worker's wire format lays the groups out one after the other.
    assert new.flat_block_ids() == ids[0] + ids[1] + ids[2] == mgr.get_block_ids("a")
    assert mgr.get_blocks("a") == new
    assert mgr.get_blocks("unknown") == KVCacheBlocks.empty(3)


def test_prefix_hits_are_per_group_with_null_blocks_outside_the_window() -> None:
    mgr = KVCacheManager(64, BS, group_windows=(None, W), max_num_batched_tokens=4)
    tokens = list(range(20))
    a = _req("a", tokens, mgr)
    _prefill(mgr, a, 4)
    a_tables = mgr.get_blocks("a")
    mgr.free(a)
    hits, num_hit = mgr.get_computed_blocks(_req("b", [*tokens, 99], mgr))
    assert num_hit == 20 and hits.num_groups == 2 and hits.num_blocks == 5
    # The whole-context group hits every block; the sliding group only those its first
    # computed token (position 20) still sees (keys 15..19: blocks 3 and 4).
    assert hits.group(0) == a_tables.group(0)
    null = mgr.block_pool.null_block
    assert list(hits.group(1)[:3]) == [null] * 3
    assert hits.group(1)[3:] == a_tables.group(1)[3:5]


def test_groups_of_unequal_length_are_refused() -> None:
    with pytest.raises(AssertionError, match="equal lengths"):
        KVCacheBlocks(((KVCacheBlock(1),), ()))
    empty = KVCacheBlocks.empty(2)
    assert not empty and empty.num_blocks == 0 and empty.flat_block_ids() == []
