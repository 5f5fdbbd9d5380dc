"""KV memory of one long Gemma 3 request: grouped (sliding windows free blocks) vs. one
whole-context table for every layer.

Drives the real `KVCacheManager` through one request's steps (chunked prefill, then
decode) with Gemma 3 270M's layout (18 layers: 3 global, 15 local with a 512-token
window; 256-wide K and V per layer, float32) and prints, per context length, the
peak blocks in use and the KV bytes they stand for, side by side with the layout
that keeps the whole context for every layer.  Torch-free and instant: bookkeeping
only, no model runs.

    python benchmarks/sliding_window_kv.py
    python benchmarks/sliding_window_kv.py --lengths 1000 4000 32000 --chunk 512
"""

from __future__ import annotations

import argparse

from minivllm.kv_cache import KVCacheManager
from minivllm.kv_cache.groups import cdiv, plan_kv_cache_groups
from minivllm.sampling_params import SamplingParams
from minivllm.scheduler.request import Request

LAYERS = [None if (i + 1) % 6 == 0 else 512 for i in range(18)]
BYTES_PER_LAYER_TOKEN = 2 * 256 * 4  # K and V, one KV head of 256, float32


def peak_blocks(windows: tuple[int | None, ...], length: int, chunk: int, block: int) -> int:
    mgr = KVCacheManager(
        cdiv(length, block) * len(windows) + 2,
        block,
        enable_caching=False,
        group_windows=windows,
        max_num_batched_tokens=chunk,
    )
    req = Request("r", list(range(length)), SamplingParams(max_tokens=1))
    peak, done = 0, 0
    while done < length:
        q = min(chunk, length - done)
        assert mgr.allocate_slots(req, q) is not None
        peak = max(peak, mgr.get_num_held_blocks())
        done += q
        req.num_computed_tokens = done
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1000, 4000, 16000, 32000])
    parser.add_argument("--chunk", type=int, default=256, help="max_num_batched_tokens")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    groups = plan_kv_cache_groups(LAYERS)
    layers_per_block = groups.num_slots
    print(
        f"Gemma 3 270M layout: {groups.num_groups} groups of {layers_per_block} layers "
        f"(windows {groups.windows}), chunk {args.chunk}, block {args.block_size}"
    )
    print(f"{'tokens':>7} {'grouped MiB':>12} {'whole-context MiB':>18} {'ratio':>6}")
    for length in args.lengths:
        grouped = peak_blocks(groups.windows, length, args.chunk, args.block_size)
        grouped_bytes = grouped * layers_per_block * args.block_size * BYTES_PER_LAYER_TOKEN
        whole = cdiv(length, args.block_size) * len(LAYERS)
        whole_bytes = whole * args.block_size * BYTES_PER_LAYER_TOKEN
        print(
            f"{length:>7} {grouped_bytes / 2**20:>12.1f} {whole_bytes / 2**20:>18.1f} "
            f"{whole_bytes / grouped_bytes:>6.2f}"
        )


if __name__ == "__main__":
    main()
