"""KV cache groups: how layers of different attention types share one block pool.

A model with sliding-window layers (Gemma 3: five local layers per global one)
needs different amounts of KV per layer type: a global layer keeps the whole
context, a local layer only its window.  Blocks of a local layer that fell out
of the window can go back to the pool, which a single block table shared by
every layer cannot express.  So the layers are split into *groups* of the same
attention type and equal size ``g``; each group has its own block table per
request, and every block id of the pool holds one block in each of ``g``
physical cache tensors ("slots").  Layer ``j`` of a group uses slot ``j``, so a
block id belongs to exactly one group at a time and one block costs ``g``
layers' worth of memory, whichever group holds it.

With Gemma 3 270M (3 global, 15 local layers) that is ``g = 3`` and six groups:
one global group and five sliding-window groups.  A model without sliding
windows (or with them disabled) gets one group of all layers: one block table,
one block per id per layer, exactly the plain layout.

All groups move in lockstep: each request's tables have the same length (a
sliding-window group holds the null block where its blocks were freed), so the
scheduler can keep passing flat lists of block ids: the ids of group 0, then
those of group 1, and so on, each part of equal length.  Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minivllm.math_utils import cdiv


@dataclass(frozen=True)
class KVCacheGroups:
    """The grouping of a model's attention layers (see the module docstring)."""

    windows: tuple[int | None, ...]
    """Sliding window of each group (None: full attention)."""
    layer_group: tuple[int, ...]
    """Group of each attention layer, in layer order."""
    layer_slot: tuple[int, ...]
    """Physical cache tensor (slot) of each attention layer."""
    num_slots: int
    """Cache tensors, i.e. layers' worth of memory that one block id costs."""

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def is_hybrid(self) -> bool:
        """Whether any group frees blocks that fell out of a sliding window."""
        return any(w is not None for w in self.windows)


def plan_kv_cache_groups(layer_windows: Sequence[int | None]) -> KVCacheGroups:
    """Group layers by sliding window; the group size is the smallest type's layer count.

    Layers of one window size are cut into groups of ``g`` in layer order (the last
    group of a type may be short; its missing slots are unused memory).
    """
    n = len(layer_windows)
    if n == 0:
        raise ValueError("a model needs at least one attention layer for a KV cache")
    kinds = list(dict.fromkeys(layer_windows))  # window sizes in order of first use
    if len(kinds) == 1 and kinds[0] is None:
        return KVCacheGroups((None,), (0,) * n, tuple(range(n)), n)
    if len(kinds) == 1:
        # Only sliding layers: still one group, it frees what left the window.
        return KVCacheGroups((kinds[0],), (0,) * n, tuple(range(n)), n)
    members = {k: [i for i, w in enumerate(layer_windows) if w == k] for k in kinds}
    size = min(len(m) for m in members.values())
    # Full attention first, so group 0 is a whole-context group when there is one.
    kinds.sort(key=lambda k: (k is not None, k or 0))
    windows: list[int | None] = []
    layer_group = [0] * n
    layer_slot = [0] * n
    for kind in kinds:
        layers = members[kind]
        for start in range(0, len(layers), size):
            for slot, layer in enumerate(layers[start : start + size]):
                layer_group[layer] = len(windows)
                layer_slot[layer] = slot
            windows.append(kind)
    return KVCacheGroups(tuple(windows), tuple(layer_group), tuple(layer_slot), size)


def sliding_window_blocks_held(window: int, chunk: int, block_size: int) -> int:
    """Most blocks a sliding-window group holds for one request whose steps compute at
    most ``chunk`` tokens: the window behind the step's first token plus the step."""
    return cdiv(window - 1 + chunk, block_size) + 1


def max_blocks_per_request(
    groups: KVCacheGroups, num_tokens: int, block_size: int, chunk: int
) -> int:
    """Upper bound on the blocks one request of ``num_tokens`` tokens holds at once."""
    full = cdiv(num_tokens, block_size)
    total = 0
    for window in groups.windows:
        if window is None:
            total += full
        else:
            total += min(full, sliding_window_blocks_held(window, chunk, block_size))
    return total
