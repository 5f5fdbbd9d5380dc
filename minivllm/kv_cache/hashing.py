"""Chained hashes of full KV blocks, the keys of the prefix cache.

A block's hash covers its parent block's hash, its own token ids and optional
extra keys (for example a cache salt), so equal hashes mean equal prefixes,
not merely equal blocks.  Only FULL blocks are hashed: a partly filled block
is still being written and cannot be shared.

Hashes must be identical across processes and Python hash seeds (a request in
one worker may hit blocks cached from another), so they are computed with
SHA-256 over a stable serialization and the chain starts from a fixed root
constant, never from ``hash()`` or a random seed.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import cbor2

BlockHash = bytes
"""A SHA-256 digest (32 bytes) identifying a full block together with its whole prefix."""

HashFn = Callable[[Any], BlockHash]
"""Maps a tuple of ints / bytes / str / None (nested tuples allowed) to a digest."""

ROOT_PARENT_HASH: BlockHash = hashlib.sha256(b"minivllm/prefix-cache/root").digest()
"""Parent hash of every request's first block; a constant so every process agrees."""


def sha256_pickle(obj: Any) -> BlockHash:
    """SHA-256 of the pickle (protocol 5) serialization of ``obj``.

    Pickle of tuples of plain ints, bytes, str and None is byte-identical across
    processes; callers must pass plain Python ints, not numpy scalars.
    """
    return hashlib.sha256(pickle.dumps(obj, protocol=5)).digest()


def sha256_cbor(obj: Any) -> BlockHash:
    """SHA-256 of the canonical CBOR encoding of ``obj`` (reproducible in any language)."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


_HASH_FNS: dict[str, HashFn] = {"sha256": sha256_pickle, "sha256_cbor": sha256_cbor}


def get_hash_fn(algo: str) -> HashFn:
    """The hash function for a ``CacheConfig.prefix_caching_hash_algo`` value."""
    try:
        return _HASH_FNS[algo]
    except KeyError:
        valid = ", ".join(repr(name) for name in _HASH_FNS)
        raise ValueError(
            f"Unknown prefix caching hash algorithm {algo!r}; choose one of {valid} "
            "(--prefix-caching-hash-algo)."
        ) from None


def hash_block_tokens(
    hash_fn: HashFn,
    parent_hash: BlockHash | None,
    token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    """Hash one full block, chained to its parent (``None`` means the first block)."""
    if parent_hash is None:
        parent_hash = ROOT_PARENT_HASH
    # int() turns numpy / torch scalars into plain ints so the serialization is stable.
    tokens = tuple(int(t) for t in token_ids)
    return hash_fn((parent_hash, tokens, extra_keys))


class HashableRequest(Protocol):
    """What the block hasher needs from a request (kept structural: no scheduler import)."""

    @property
    def all_token_ids(self) -> Sequence[int]: ...

    @property
    def cache_extra_keys(self) -> tuple[Any, ...] | None: ...

    block_hashes: list[BlockHash]


def make_block_hasher(
    block_size: int, hash_fn: HashFn, extra_keys: tuple[Any, ...] | None = None
) -> Callable[[HashableRequest], list[BlockHash]]:
    """A function that returns the hashes of a request's full blocks not hashed yet.

    It starts after the last hash already in ``request.block_hashes``, so calling
    it after every appended token costs one hash per newly completed block.
    ``extra_keys`` (with the request's own ``cache_extra_keys``, e.g. its LoRA
    adapter) are mixed into the first block only: they then reach every block
    through the chain.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be a positive number of tokens, got {block_size}.")

    def hasher(request: HashableRequest) -> list[BlockHash]:
        tokens = request.all_token_ids
        start = len(request.block_hashes)
        parent = request.block_hashes[-1] if start else None
        new_hashes: list[BlockHash] = []
        own = getattr(request, "cache_extra_keys", None)  # stand-ins may lack it
        first_keys = extra_keys if own is None else (*(extra_keys or ()), *own)
        for block_idx in range(start, len(tokens) // block_size):
            begin = block_idx * block_size
            keys = first_keys if block_idx == 0 else None
            parent = hash_block_tokens(hash_fn, parent, tokens[begin : begin + block_size], keys)
            new_hashes.append(parent)
        return new_hashes

    return hasher
