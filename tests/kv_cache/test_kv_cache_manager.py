"""KVCacheManager: prefix hits, allocation, freeing order, stats."""

from __future__ import annotations

import pytest

from minivllm.kv_cache import KVCacheBlocks, KVCacheManager
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.request import Request

BS = 4
NO_HITS = KVCacheBlocks.empty(1)


def _manager(num_blocks: int = 16, **kw: object) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, **kw)  # type: ignore[arg-type]


def _req(rid: str, tokens: list[int], mgr: KVCacheManager, **params: object) -> Request:
    return Request(rid, tokens, SamplingParams(**params), block_hasher=mgr.block_hasher)  # type: ignore[arg-type]


def _run_prefill(mgr: KVCacheManager, req: Request) -> list[int]:
    """Admit and fully compute a request, as the scheduler and one model step would."""
    hits, num_hit = mgr.get_computed_blocks(req)
    assert mgr.allocate_slots(req, req.num_tokens - num_hit, hits) is not None
    req.num_computed_tokens = req.num_tokens
    mgr.cache_blocks(req, req.num_computed_tokens)
    return mgr.get_block_ids(req.request_id)


def test_shared_prefix_hits_full_blocks_only() -> None:
    mgr = _manager()
    a = _req("a", list(range(10)), mgr)  # blocks [0-3] [4-7] and a partial [8, 9]
    a_blocks = _run_prefill(mgr, a)
    b = _req("b", [*range(9), 99, 98], mgr)  # shares 9 tokens: two full blocks
    hits, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 2 * BS
    assert hits.get_block_ids() == (a_blocks[:2],)
    new = mgr.allocate_slots(b, b.num_tokens - num_hit, hits)
    assert new is not None and new.num_blocks == 1
    assert mgr.get_block_ids("b") == [*a_blocks[:2], *new.flat_block_ids()]
    assert all(blk.ref_cnt == 2 for blk in hits.group(0))


@pytest.mark.parametrize(("prompt_len", "expected_hit"), [(8, 4), (9, 8), (3, 0), (4, 0), (5, 4)])
def test_identical_prompt_always_leaves_a_token_to_compute(
    prompt_len: int, expected_hit: int
) -> None:
    mgr = _manager()
    _run_prefill(mgr, _req("a", list(range(prompt_len)), mgr))
    b = _req("b", list(range(prompt_len)), mgr)
    _, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == expected_hit
    assert num_hit < b.num_tokens


def test_blocks_are_published_only_once_computed() -> None:
    mgr = _manager()
    a = _req("a", list(range(8)), mgr)
    assert mgr.allocate_slots(a, 8) is not None
    b = _req("b", list(range(9)), mgr)
    assert mgr.get_computed_blocks(b) == (NO_HITS, 0)  # a's KV is not written yet
    a.num_computed_tokens = 5  # a chunk of 5 tokens ran: one block is full
    mgr.cache_blocks(a, 5)
    assert mgr.get_computed_blocks(b)[1] == 4


def test_decode_blocks_become_cached_as_outputs_fill_them() -> None:
    mgr = _manager()
    a = _req("a", list(range(6)), mgr)
    _run_prefill(mgr, a)
    a.append_output_token_ids([6, 7])  # two decode tokens, the second not yet computed
    assert mgr.allocate_slots(a, 1) == NO_HITS  # still fits in block 2
    a.num_computed_tokens = 7
    mgr.cache_blocks(a, 7)
    b = _req("b", list(range(9)), mgr)
    assert mgr.get_computed_blocks(b)[1] == 4  # block [4..7] has 7 computed tokens only
    a.append_output_token_ids([8])
    a.num_computed_tokens = 8
    mgr.cache_blocks(a, 8)
    assert mgr.get_computed_blocks(b)[1] == 8


def test_freed_blocks_stay_hittable_until_evicted_and_tail_goes_first() -> None:
    mgr = _manager(num_blocks=5)  # 4 usable blocks
    a = _req("a", list(range(13)), mgr)  # 3 full blocks + 1 partial
    a_blocks = _run_prefill(mgr, a)
    mgr.free(a)
    assert mgr.num_free_blocks == 4
    free_order = [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]
    assert free_order == a_blocks[::-1]
    # One new block evicts the partial tail, then the third full block; the prefix survives.
    c = _req("c", [500] * 8, mgr)
    assert mgr.allocate_slots(c, 8) is not None
    b = _req("b", list(range(13)), mgr)
    hits, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 2 * BS and hits.flat_block_ids() == a_blocks[:2]
    # Hit blocks come out of the free queue, so they count against availability.
    assert mgr.num_free_blocks == 2
    assert not mgr.can_allocate(b, b.num_tokens - num_hit + BS, hits)
    assert mgr.allocate_slots(b, b.num_tokens - num_hit, hits) is None  # 2 hits + 2 new > 2
    mgr.free(c)
    assert mgr.allocate_slots(b, b.num_tokens - num_hit, hits) is not None
    assert mgr.num_free_blocks == 0


def test_failed_allocation_changes_nothing() -> None:
    mgr = _manager(num_blocks=3)
    a = _req("a", list(range(12)), mgr)
    assert mgr.allocate_slots(a, 12) is None
    assert mgr.num_free_blocks == 2 and mgr.get_block_ids("a") == []
    assert mgr.prefix_cache_stats.requests == 0


def test_lookahead_slots_and_max_model_len_cap() -> None:
    mgr = _manager(max_model_len=8)
    a = _req("a", list(range(4)), mgr)
    assert len(mgr.allocate_slots(a, 4, num_lookahead_tokens=1).group(0)) == 2
    b = _req("b", list(range(8)), mgr)
    # Lookahead past max_model_len is useless, so no third block.
    assert len(mgr.allocate_slots(b, 8, num_lookahead_tokens=3).group(0)) == 2


def test_free_returns_every_block_and_usage() -> None:
    mgr = _manager(num_blocks=9)
    idle = mgr.num_free_blocks
    a = _req("a", list(range(16)), mgr)
    _run_prefill(mgr, a)
    assert mgr.usage == pytest.approx(4 / 8)
    mgr.free(a)
    assert mgr.num_free_blocks == idle and mgr.usage == 0.0
    assert mgr.get_block_ids("a") == []


def test_prefix_cache_stats_count_tokens() -> None:
    mgr = _manager()
    _run_prefill(mgr, _req("a", list(range(10)), mgr))
    _run_prefill(mgr, _req("b", list(range(10)), mgr))
    stats = mgr.prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 20, 8)
    assert stats.hit_rate == pytest.approx(0.4)


def test_caching_disabled_and_prompt_logprobs_skip_the_cache() -> None:
    off = _manager(enable_caching=False)
    _run_prefill(off, _req("a", list(range(10)), off))
    assert off.get_computed_blocks(_req("b", list(range(10)), off)) == (NO_HITS, 0)
    on = _manager()
    _run_prefill(on, _req("a", list(range(10)), on))
    assert on.get_computed_blocks(_req("b", list(range(10)), on, prompt_logprobs=1)) == (NO_HITS, 0)


def test_reset_prefix_cache() -> None:
    mgr = _manager()
    a = _req("a", list(range(10)), mgr)
    _run_prefill(mgr, a)
    assert not mgr.reset_prefix_cache()
    mgr.free(a)
    assert mgr.reset_prefix_cache()
    assert mgr.get_computed_blocks(_req("b", list(range(10)), mgr)) == (NO_HITS, 0)


def test_both_hash_algorithms_serve_hits() -> None:
    for algo in ("sha256", "sha256_cbor"):
        mgr = _manager(hash_algo=algo)
        _run_prefill(mgr, _req("a", list(range(10)), mgr))
        assert mgr.get_computed_blocks(_req("b", list(range(10)), mgr))[1] == 8
    with pytest.raises(ValueError, match="sha256_cbor"):
        _manager(hash_algo="xxhash")
