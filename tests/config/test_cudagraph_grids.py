"""The capture grids: every number their docstrings state, plus properties."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.config.compilation import (
    decode_cudagraph_capture_grid,
    decode_cudagraph_capture_max_tokens,
    decode_cudagraph_capture_shapes,
    prefill_cudagraph_capture_grid,
    varlen_decode_cudagraph_capture_grid,
)


def _steps(grid: list[int]) -> dict[int, int]:
    """size -> gap to the next size."""
    return {a: b - a for a, b in zip(grid, grid[1:], strict=False)}


# -- decode grid -------------------------------------------------------------------
def test_decode_grid_has_64_sizes_at_1024() -> None:
    grid = decode_cudagraph_capture_grid(1024)
    assert len(grid) == 64
    assert grid[-1] == 1024


def test_decode_grid_every_count_up_to_6() -> None:
    grid = decode_cudagraph_capture_grid(1024)
    assert grid[:6] == [1, 2, 3, 4, 5, 6]
    assert 7 not in grid


def test_decode_grid_strides() -> None:
    # "2 from 8, 4 from 16, 8 from 48, 16 from 128, 32 from 352"
    segments = [(8, 16, 2), (16, 48, 4), (48, 128, 8), (128, 352, 16), (352, 1024, 32)]
    steps = _steps(decode_cudagraph_capture_grid(1024))
    for low, high, stride in segments:
        in_segment = [s for s in steps if low <= s < high]
        assert in_segment and in_segment[0] == low
        assert {steps[s] for s in in_segment} == {stride}, (low, high)


# -- prefill grid ------------------------------------------------------------------
def test_prefill_grid_has_54_sizes_at_8192() -> None:
    grid = prefill_cudagraph_capture_grid(8192)
    assert len(grid) == 54
    assert grid[-1] == 8192


def test_prefill_grid_head() -> None:
    grid = prefill_cudagraph_capture_grid(8192)
    assert grid[:3] == [1, 2, 4]
    assert [s for s in grid if 8 <= s <= 64] == list(range(8, 65, 8))


def test_prefill_grid_four_per_doubling_up_to_1024() -> None:
    grid = prefill_cudagraph_capture_grid(8192)
    for low in (64, 128, 256, 512):
        assert [s for s in grid if low < s <= 2 * low] == [low + low // 4 * i for i in (1, 2, 3, 4)]


def test_prefill_grid_tail_256_then_512() -> None:
    grid = prefill_cudagraph_capture_grid(14000)  # 7% of 14000 stays below 1024
    steps = _steps(grid)
    # Every 256 tokens from 1024 while 7% of the size is at most 512 ...
    assert all(steps[s] == 256 for s in steps if 1024 <= s and 0.07 * s <= 512)
    # ... then every 512 (after aligning to the next multiple of 512).
    past = [s for s in grid[:-1] if 0.07 * s > 512]
    assert len(past) > 3
    assert all(s % 512 == 0 for s in past[1:])
    assert all(steps[s] == 512 for s in past[1:-1])


def test_prefill_dense_head_adds_every_count_to_32() -> None:
    dense = prefill_cudagraph_capture_grid(8192, dense_head=True)
    assert dense[:32] == list(range(1, 33))
    assert set(prefill_cudagraph_capture_grid(8192)) <= set(dense)
    assert prefill_cudagraph_capture_grid(10, dense_head=True) == list(range(1, 11))


# -- varlen decode grid ------------------------------------------------------------
def test_varlen_grid_shape() -> None:
    grid = varlen_decode_cudagraph_capture_grid(8192)
    assert grid[:4] == [1, 2, 4, 8]
    for low in (8, 16, 32, 64, 128, 256, 512):
        assert [s for s in grid if low < s <= 2 * low] == [low + low // 4 * i for i in (1, 2, 3, 4)]
    assert [s for s in grid if 1024 <= s <= 4096] == list(range(1024, 4097, 128))
    assert [s for s in grid if s >= 4096] == list(range(4096, 8193, 256))


def test_varlen_dense_head() -> None:
    grid = varlen_decode_cudagraph_capture_grid(100, dense_head=True)
    assert grid[:32] == list(range(1, 33))
    assert grid[-1] == 100


def test_varlen_grid_is_finer_than_prefill() -> None:
    assert len(varlen_decode_cudagraph_capture_grid(8192)) > len(
        prefill_cudagraph_capture_grid(8192)
    )


# -- shared properties -------------------------------------------------------------
GRIDS = {
    "decode": decode_cudagraph_capture_grid,
    "prefill": prefill_cudagraph_capture_grid,
    "prefill_dense": lambda m: prefill_cudagraph_capture_grid(m, dense_head=True),
    "varlen": varlen_decode_cudagraph_capture_grid,
    "varlen_dense": lambda m: varlen_decode_cudagraph_capture_grid(m, dense_head=True),
}


@pytest.mark.parametrize("name", list(GRIDS))
def test_zero_max_gives_empty_grid(name: str) -> None:
    assert GRIDS[name](0) == []
    assert GRIDS[name](1) == [1]


@pytest.mark.parametrize("name", list(GRIDS))
@settings(max_examples=60, deadline=None)
@given(max_size=st.integers(min_value=1, max_value=20000))
def test_grid_properties(name: str, max_size: int) -> None:
    grid = GRIDS[name](max_size)
    assert grid == sorted(set(grid)), "sorted and unique"
    assert grid[0] == 1
    assert grid[-1] == max_size, "ends at its max"
    assert all(1 <= s <= max_size for s in grid)


@pytest.mark.parametrize("name", list(GRIDS))
@settings(max_examples=60, deadline=None)
@given(a=st.integers(min_value=1, max_value=10000), b=st.integers(min_value=1, max_value=10000))
def test_grid_grows_monotonically_with_max(name: str, a: int, b: int) -> None:
    small, large = sorted((a, b))
    g_small, g_large = GRIDS[name](small), GRIDS[name](large)
    assert len(g_small) <= len(g_large)
    # Below the smaller max, both grids hold the same sizes.
    assert [s for s in g_large if s < small] == g_small[:-1]


# -- uniform decode shapes ---------------------------------------------------------
def test_decode_shapes_clip_first_size_above_limit() -> None:
    shapes = decode_cudagraph_capture_shapes([1, 2, 4, 8, 16, 32], {1: 10, 2: 10}, max_tokens=16)
    # q=1: limited to 10 requests: 16 is captured as 10, 32 is unreachable.
    # q=2: limited to 16 // 2 = 8 requests: 8 is the limit, 16 and 32 are unreachable.
    assert shapes == [
        (1, 1), (2, 1), (4, 1), (8, 1), (10, 1),
        (1, 2), (2, 2), (4, 2), (8, 2),
    ]  # fmt: skip


def test_decode_shapes_skip_query_lens_that_do_not_fit() -> None:
    assert decode_cudagraph_capture_shapes([1, 2], {8: 4}, max_tokens=4) == []
    assert decode_cudagraph_capture_shapes([1, 2], {1: 0}, max_tokens=4) == []


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=20),
    query_lens=st.dictionaries(st.integers(1, 8), st.integers(0, 300), min_size=1, max_size=4),
    max_tokens=st.integers(0, 2048),
)
def test_decode_shapes_properties(
    sizes: list[int], query_lens: dict[int, int], max_tokens: int
) -> None:
    shapes = decode_cudagraph_capture_shapes(sizes, query_lens, max_tokens)
    assert shapes == sorted(set(shapes), key=lambda s: (s[1], s[0]))
    for n, q in shapes:
        assert 1 <= n <= query_lens[q]
        assert n * q <= max_tokens
    # Every batch up to a query length's limit has a graph that holds it, when any
    # requested size reaches the limit.
    for q, max_reqs in query_lens.items():
        limit = min(max_reqs, max_tokens // q)
        if limit >= 1 and max(sizes) >= limit:
            captured = [n for n, qq in shapes if qq == q]
            assert max(captured) == limit


def test_decode_capture_max_tokens() -> None:
    cfg = SimpleNamespace(max_cudagraph_capture_size=512, max_decode_cudagraph_capture_tokens=None)
    assert decode_cudagraph_capture_max_tokens(cfg) == 512  # type: ignore[arg-type]
    cfg.max_decode_cudagraph_capture_tokens = 256
    assert decode_cudagraph_capture_max_tokens(cfg) == 256  # type: ignore[arg-type]
    cfg.max_decode_cudagraph_capture_tokens = 4096
    assert decode_cudagraph_capture_max_tokens(cfg) == 512  # type: ignore[arg-type]
    cfg.max_cudagraph_capture_size = None
    assert decode_cudagraph_capture_max_tokens(cfg) == 0  # type: ignore[arg-type]
