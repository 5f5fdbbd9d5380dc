"""BlockPool: reference counts, the null block, LRU eviction of free cached blocks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minivllm.kv_cache.block_pool import BlockPool, FreeBlockQueue, KVCacheBlock


def _h(i: int) -> bytes:
    return i.to_bytes(32, "little")


def test_null_block_is_reserved_and_never_allocated() -> None:
    pool = BlockPool(5)
    assert pool.null_block is not None and pool.null_block.block_id == 0
    assert pool.get_num_free_blocks() == 4 == pool.num_usable_blocks
    blocks = pool.get_new_blocks(4)
    assert 0 not in {b.block_id for b in blocks}
    assert pool.get_usage() == 1.0
    with pytest.raises(ValueError, match="only 0 are free"):
        pool.get_new_blocks(1)
    assert BlockPool(3, reserve_null_block=False).get_num_free_blocks() == 3


def test_too_few_blocks_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(1)


def test_reference_counts() -> None:
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    assert (a.ref_cnt, b.ref_cnt) == (1, 1)
    pool.cache_full_block(a, _h(1))
    pool.touch([a])  # a second request shares the cached block
    assert a.ref_cnt == 2
    pool.free_blocks([a, b])
    assert a.ref_cnt == 1 and b.ref_cnt == 0
    assert pool.get_num_free_blocks() == 2  # b is back, a is still held
    pool.free_blocks([a])
    assert pool.get_num_free_blocks() == 3
    assert pool.get_cached_block(_h(1)) is a  # freed but still cached
    with pytest.raises(AssertionError, match="double free"):
        pool.free_blocks([a])


def test_touching_a_free_cached_block_takes_it_out_of_the_free_queue() -> None:
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    pool.cache_full_block(a, _h(7))
    pool.free_blocks([a])
    assert pool.get_num_free_blocks() == 3
    pool.touch([a])
    assert a.ref_cnt == 1 and pool.get_num_free_blocks() == 2
    assert a not in pool.free_block_queue.get_all_free_blocks()
    # The remaining free blocks are handed out without ever evicting a.
    pool.get_new_blocks(2)
    assert pool.get_cached_block(_h(7)) is a


def test_lru_eviction_least_recently_freed_first() -> None:
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(4)
    for i, block in enumerate(blocks):
        pool.cache_full_block(block, _h(i))
    # Free in the order 2, 0, 3, 1: that must be the eviction order.
    order = [blocks[2], blocks[0], blocks[3], blocks[1]]
    pool.free_blocks(order)
    assert pool.free_block_queue.get_all_free_blocks() == order
    (first,) = pool.get_new_blocks(1)
    assert first is blocks[2]
    assert first.block_hash is None and pool.get_cached_block(_h(2)) is None
    assert pool.get_cached_block(_h(0)) is blocks[0]  # not evicted yet
    second, third = pool.get_new_blocks(2)
    assert (second, third) == (blocks[0], blocks[3])
    assert pool.get_cached_block(_h(1)) is blocks[1]


def test_duplicate_content_keeps_the_first_cached_copy() -> None:
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_block(a, _h(1))
    pool.cache_full_block(b, _h(1))
    assert pool.get_cached_block(_h(1)) is a and b.block_hash is None
    # Evicting the uncached duplicate must not drop a's entry.
    pool.free_blocks([b])
    pool.get_new_blocks(2)
    assert pool.get_cached_block(_h(1)) is a


def test_caching_disabled_caches_nothing() -> None:
    pool = BlockPool(4, enable_caching=False)
    (a,) = pool.get_new_blocks(1)
    pool.cache_full_block(a, _h(1))
    assert pool.get_cached_block(_h(1)) is None and a.block_hash is None


def test_reset_prefix_cache_only_when_idle() -> None:
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    pool.cache_full_block(a, _h(1))
    assert not pool.reset_prefix_cache()
    assert pool.get_cached_block(_h(1)) is a
    pool.free_blocks([a])
    assert pool.reset_prefix_cache()
    assert pool.get_cached_block(_h(1)) is None and a.block_hash is None


@given(st.lists(st.tuples(st.sampled_from(["pop", "remove", "append"]), st.integers(0, 20))))
def test_free_queue_matches_a_list_model(ops: list[tuple[str, int]]) -> None:
    blocks = [KVCacheBlock(i) for i in range(8)]
    queue = FreeBlockQueue(blocks[:5])
    model = blocks[:5]
    taken = blocks[5:]
    for op, k in ops:
        if op == "pop" and model:
            block = queue.popleft()
            assert block is model.pop(0)
            taken.append(block)
        elif op == "remove" and model:
            block = model.pop(k % len(model))
            queue.remove(block)
            taken.append(block)
        elif op == "append" and taken:
            block = taken.pop(k % len(taken))
            queue.append(block)
            model.append(block)
        assert queue.get_all_free_blocks() == model
        assert queue.num_free_blocks == len(model)
