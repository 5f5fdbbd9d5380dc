"""KV cache groups: sliding-window groups free blocks that left the window (torch-free).

The expected block counts are worked out from the attention pattern, step by step:
a whole-context group holds every block of the context, a sliding-window group the
blocks from the one holding the oldest key its next token sees up to the end of the
step's tokens.
"""

from __future__ import annotations

import pytest

from minivllm.kv_cache import KVCacheManager
from minivllm.kv_cache.groups import (
    max_blocks_per_request,
    plan_kv_cache_groups,
    sliding_window_blocks_held,
)
from minivllm.math_utils import cdiv
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.request import Request

BS = 4
W = 10


def gemma_layers(num_layers: int, window: int = W) -> list[int | None]:
    """Gemma 3's pattern: every sixth layer global, the others sliding."""
    return [None if (i + 1) % 6 == 0 else window for i in range(num_layers)]


def test_gemma3_270m_layout_six_groups_of_three() -> None:
    groups = plan_kv_cache_groups(gemma_layers(18))
    assert groups.windows == (None,) + (W,) * 5
    assert groups.num_slots == 3 and groups.is_hybrid
    # The global layers 5, 11, 17 form group 0, one per slot.
    assert [groups.layer_group[i] for i in (5, 11, 17)] == [0, 0, 0]
    assert [groups.layer_slot[i] for i in (5, 11, 17)] == [0, 1, 2]
    # Every (group, slot) pair is used by exactly one layer: no two layers share memory.
    pairs = set(zip(groups.layer_group, groups.layer_slot, strict=True))
    assert len(pairs) == 18


def test_uneven_layout_and_plain_models() -> None:
    groups = plan_kv_cache_groups(gemma_layers(26))  # 4 global, 22 sliding (Gemma 3 1B)
    assert groups.num_slots == 4 and groups.windows == (None,) + (W,) * 6
    assert len(set(zip(groups.layer_group, groups.layer_slot, strict=True))) == 26
    plain = plan_kv_cache_groups([None] * 5)
    assert plain.windows == (None,) and plain.num_slots == 5 and not plain.is_hybrid
    assert plain.layer_slot == (0, 1, 2, 3, 4)


def _manager(num_blocks: int, windows: tuple[int | None, ...], **kw: object) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, group_windows=windows, **kw)  # type: ignore[arg-type]


def _req(rid: str, tokens: list[int], mgr: KVCacheManager) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=64), block_hasher=mgr.block_hasher)


def _steps(num_prompt: int, chunk: int, num_decodes: int) -> list[tuple[int, int]]:
    """(tokens computed before, tokens computed in) each step of one request."""
    steps, done = [], 0
    while done < num_prompt:
        q = min(chunk, num_prompt - done)
        steps.append((done, q))
        done += q
    return steps + [(done + i, 1) for i in range(num_decodes)]


def _expected_held(windows: tuple[int | None, ...], before: int, q: int) -> int:
    total = 0
    for window in windows:
        end_blocks = cdiv(before + q, BS)
        if window is None:
            total += end_blocks
        else:
            total += end_blocks - max(0, before - window + 1) // BS
    return total


@pytest.mark.parametrize(("num_prompt", "chunk"), [(37, 8), (37, 64), (9, 4)])
def test_blocks_held_follow_the_attention_pattern(num_prompt: int, chunk: int) -> None:
    windows = (None, W, W)
    mgr = _manager(64, windows, enable_caching=False)
    req = _req("a", list(range(num_prompt)), mgr)
    peak = 0
    for before, q in _steps(num_prompt, chunk, num_decodes=12):
        assert req.num_computed_tokens == before
        assert mgr.allocate_slots(req, q) is not None
        held = mgr.get_num_held_blocks("a")
        assert held == _expected_held(windows, before, q), (before, q)
        assert mgr.num_free_blocks == mgr.block_pool.num_usable_blocks - held
        peak = max(peak, held)
        req.num_computed_tokens += q
        if req.num_computed_tokens >= num_prompt:
            req.append_output_token_ids(7)
    total = num_prompt + 12
    bound = max_blocks_per_request(plan_kv_cache_groups([None, W, W]), total, BS, chunk)
    assert peak <= bound
    # The tables stay equal in length; freed positions of sliding groups are the null block.
    ids = mgr.get_block_ids("a")
    per_group = len(ids) // 3
    null = mgr.null_block_id
    assert per_group == cdiv(total, BS)
    assert null not in ids[:per_group]
    assert ids[per_group:].count(null) > 0
    mgr.free(req)
    assert mgr.num_free_blocks == mgr.block_pool.num_usable_blocks


def test_long_request_fits_where_whole_context_per_group_would_not() -> None:
    """60 blocks hold a 100-token request over 3 groups (1 full + 2 sliding) although
    3 whole-context tables would need 75."""
    mgr = _manager(61, (None, W, W), enable_caching=False, max_num_batched_tokens=8)
    req = _req("a", list(range(100)), mgr)
    for before, q in _steps(100, 8, num_decodes=0):
        assert mgr.allocate_slots(req, q) is not None, before
        req.num_computed_tokens += q
    assert 3 * cdiv(100, BS) > mgr.block_pool.num_usable_blocks
    assert mgr.max_num_tokens >= 100
    held = cdiv(100, BS) + 2 * sliding_window_blocks_held(W, 8, BS)
    assert mgr.get_num_held_blocks("a") <= held


def test_prefix_hit_needs_only_the_window_of_sliding_groups() -> None:
    windows = (None, W)
    mgr = _manager(64, windows, max_num_batched_tokens=4)
    tokens = list(range(30))
    a = _req("a", tokens, mgr)
    for _before, q in _steps(30, 4, num_decodes=0):
        assert mgr.allocate_slots(a, q) is not None
        a.num_computed_tokens += q
        mgr.cache_blocks(a, a.num_computed_tokens)
    a_full, a_sliding = mgr.get_block_ids("a")[:8], mgr.get_block_ids("a")[8:]
    mgr.free(a)
    # Every block is free now but still cached (its hash survives until it is reused).
    b = _req("b", tokens + [99, 98], mgr)
    hits, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 28  # 7 whole blocks; the last token is always computed
    full_hits, sliding_hits = hits.group(0), hits.group(1)
    assert [h.block_id for h in full_hits] == a_full[:7]
    # The sliding group needs the blocks of keys 28 - W + 1 = 19 .. 27: blocks 4..6.
    null = mgr.null_block_id
    assert [h.block_id for h in sliding_hits[:4]] == [null] * 4
    assert [h.block_id for h in sliding_hits[4:]] == a_sliding[4:7]
    new = mgr.allocate_slots(b, b.num_tokens - num_hit, hits)
    assert new is not None and new.num_groups == 2 and new.num_blocks == cdiv(32, BS) - 7
    mgr.free(b)
    assert mgr.num_free_blocks == mgr.block_pool.num_usable_blocks


def test_prefix_hit_shrinks_to_what_every_group_still_has() -> None:
    """Sliding-group blocks evicted (reused) inside the window cut the hit short."""
    mgr = _manager(64, (None, W), max_num_batched_tokens=4)
    tokens = list(range(30))
    a = _req("a", tokens, mgr)
    for _before, q in _steps(30, 4, num_decodes=0):
        assert mgr.allocate_slots(a, q) is not None
        a.num_computed_tokens += q
        mgr.cache_blocks(a, a.num_computed_tokens)
    sliding_block_6 = mgr.req_to_blocks["a"][1][6]
    mgr.free(a)
    mgr.block_pool._evict_cached_hash(sliding_block_6)
    hits, num_hit = mgr.get_computed_blocks(_req("b", tokens + [5], mgr))
    # Hit length h needs sliding blocks (4h - 9) // 4 .. h - 1 cached, block 6 missing:
    # the longest such h below 7 is 6 (blocks 3..5).
    assert num_hit == 6 * BS
    assert (hits.num_groups, hits.num_blocks) == (2, 6)


def test_whole_prompt_reservation_counts_sliding_groups_at_their_cap() -> None:
    """The scheduler reserves a whole prompt at admission: 100 tokens in 8-token chunks
    need 25 blocks for the full group and at most 5 per sliding group, not 3 x 25."""
    mgr = _manager(40, (None, W, W), enable_caching=False, max_num_batched_tokens=8)
    req = _req("a", list(range(100)), mgr)
    assert mgr.can_allocate(req, 100)
    # One step of 100 tokens would write them all at once: that does not fit.
    assert mgr.allocate_slots(req, 100) is None
    assert mgr.get_num_held_blocks() == 0
