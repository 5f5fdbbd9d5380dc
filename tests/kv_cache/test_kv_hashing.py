"""Block hashes: chaining, the two algorithms, stability across processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minivllm.kv_cache.hashing import (
    ROOT_PARENT_HASH,
    get_hash_fn,
    hash_block_tokens,
    make_block_hasher,
)

ALGOS = ["sha256", "sha256_cbor"]


@pytest.mark.parametrize("algo", ALGOS)
def test_chaining_makes_hash_depend_on_the_whole_prefix(algo: str) -> None:
    fn = get_hash_fn(algo)
    a = hash_block_tokens(fn, None, [1, 2, 3, 4])
    b = hash_block_tokens(fn, None, [5, 6, 7, 8])
    # Same tokens, different parents: different hashes (equal blocks, different prefixes).
    assert hash_block_tokens(fn, a, [9, 9, 9, 9]) != hash_block_tokens(fn, b, [9, 9, 9, 9])
    assert hash_block_tokens(fn, a, [9, 9, 9, 9]) == hash_block_tokens(fn, a, [9, 9, 9, 9])
    assert hash_block_tokens(fn, None, [1, 2, 3, 4]) == hash_block_tokens(
        fn, ROOT_PARENT_HASH, [1, 2, 3, 4]
    )
    assert hash_block_tokens(fn, None, [1, 2, 3, 4], ("salt",)) != a
    assert len(a) == 32


def test_algorithms_differ() -> None:
    sha, cbor = (get_hash_fn(a) for a in ALGOS)
    assert hash_block_tokens(sha, None, [1, 2, 3]) != hash_block_tokens(cbor, None, [1, 2, 3])


def test_unknown_algorithm_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match="sha256_cbor") as info:
        get_hash_fn("md5")
    assert "'sha256'" in str(info.value)


_CHILD = """
import sys
from minivllm.kv_cache.hashing import ROOT_PARENT_HASH, get_hash_fn, hash_block_tokens
out = [ROOT_PARENT_HASH.hex()]
for algo in ("sha256", "sha256_cbor"):
    fn = get_hash_fn(algo)
    h = hash_block_tokens(fn, None, [1, 2, 3, 4], ("salt", None))
    out.append(hash_block_tokens(fn, h, [5, 6, 7, 8]).hex())
print(" ".join(out))
"""


def _expected() -> str:
    out = [ROOT_PARENT_HASH.hex()]
    for algo in ALGOS:
        fn = get_hash_fn(algo)
        h = hash_block_tokens(fn, None, [1, 2, 3, 4], ("salt", None))
        out.append(hash_block_tokens(fn, h, [5, 6, 7, 8]).hex())
    return " ".join(out)


def test_hashes_are_stable_across_processes_and_hash_seeds() -> None:
    results = set()
    for seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        results.add(proc.stdout.strip())
    assert results == {_expected()}


class _Req:
    def __init__(self, tokens: list[int]) -> None:
        self.all_token_ids = tokens
        self.block_hashes: list[bytes] = []


@given(
    tokens=st.lists(st.integers(0, 50_000), max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=5),
    algo=st.sampled_from(ALGOS),
)
def test_incremental_hasher_equals_hashing_from_scratch(
    tokens: list[int], cuts: list[int], algo: str
) -> None:
    block_size = 4
    fn = get_hash_fn(algo)
    hasher = make_block_hasher(block_size, fn)
    req = _Req([])
    for cut in [*sorted(cuts), len(tokens)]:
        req.all_token_ids = tokens[:cut]
        req.block_hashes.extend(hasher(req))
    expected, parent = [], None
    for i in range(len(tokens) // block_size):
        parent = hash_block_tokens(fn, parent, tokens[i * block_size : (i + 1) * block_size])
        expected.append(parent)
    assert req.block_hashes == expected
