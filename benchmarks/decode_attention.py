"""Time one call of minivllm's C++ decode attention (``minivllm_cpu::decode_attention``).

The default model's shapes (9 query heads, 3 KV heads of 64, 16-token blocks;
``--heads 32 8 64`` for Llama-3.2-1B's), a float32 cache (``--dtype bfloat16``),
``--batch`` requests of ``--context`` tokens each, hot in cache:

    python benchmarks/decode_attention.py --batch 1 32 --context 16 190 400

Prints microseconds per call (median of 5 rounds of 200 calls) for each shape.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from minivllm.kernels import lowbit_cpu

BLOCK = 16


def time_call(batch: int, context: int, heads: tuple[int, int, int], dtype: torch.dtype) -> float:
    NH, NKV, HD = heads
    blocks = -(-context // BLOCK)
    cache = torch.randn(2, 1 + batch * blocks, BLOCK, NKV, HD).to(dtype)
    table = torch.arange(1, 1 + batch * blocks, dtype=torch.int32).view(batch, blocks)
    lens = torch.full((batch,), context, dtype=torch.int32)
    slots = table[:, -1].long() * BLOCK + (context - 1) % BLOCK
    q, k, v = (
        torch.randn(batch, NH * HD),
        torch.randn(batch, NKV * HD),
        torch.randn(batch, NKV * HD),
    )

    def call() -> None:
        torch.ops.minivllm_cpu.decode_attention(q, k, v, cache, table, lens, slots, HD**-0.5, 0)

    for _ in range(20):
        call()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(200):
            call()
        rounds.append((time.perf_counter() - start) / 200 * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--context", type=int, nargs="+", default=[16, 190, 400])
    parser.add_argument(
        "--heads", type=int, nargs=3, default=[9, 3, 64], metavar=("NH", "NKV", "HD")
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if not lowbit_cpu.available():
        raise SystemExit("minivllm's CPU kernels are not built here (no C++ compiler?)")
    print(f"threads {torch.get_num_threads()}")
    for batch in args.batch:
        for context in args.context:
            print(
                f"batch {batch:3d} context {context:4d}: "
                f"{time_call(batch, context, args.heads, dtype):8.1f} us"
            )


if __name__ == "__main__":
    main()
