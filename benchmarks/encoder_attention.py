"""minivllm's CPU encoder attention kernel against torch SDPA over padded prompts:
milliseconds per call and the largest error against float64, per dtype and shape.

    python benchmarks/encoder_attention.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from minivllm.kernels import lowbit_cpu

SHAPES = [(16, 12, 12, 144, 32), (16, 12, 12, 256, 32), (16, 12, 12, 64, 32), (16, 12, 12, 144, 64)]
"""(prompts, heads, kv heads, length, head size)."""


def bench(fn: Callable[[], torch.Tensor], n: int = 10) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e3


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: tuple) -> torch.Tensor:
    p, h, kv, n, d = shape
    out = F.scaled_dot_product_attention(
        q.view(p, n, h, d).transpose(1, 2),
        k.view(p, n, kv, d).transpose(1, 2),
        v.view(p, n, kv, d).transpose(1, 2),
        scale=d**-0.5,
        enable_gqa=kv != h,
    )
    return out.transpose(1, 2).reshape(p * n, h, d)


def main() -> None:
    assert lowbit_cpu.available(), "minivllm's CPU kernels did not build"
    op = torch.ops.minivllm_cpu.encoder_attention
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        for shape in SHAPES:
            p, h, kv, n, d = shape
            q, k, v = (torch.randn(p * n, x, d, dtype=dtype) for x in (h, kv, kv))
            starts = torch.arange(0, p * n + 1, n)
            ref = sdpa(q.double(), k.double(), v.double(), shape)
            err = (op(q, k, v, starts, d**-0.5).double() - ref).abs().max().item()
            torch_ms = bench(lambda q=q, k=k, v=v, s=shape: sdpa(q, k, v, s))
            ours_ms = bench(lambda q=q, k=k, v=v, st=starts, d=d: op(q, k, v, st, d**-0.5))
            print(
                f"{dtype} {shape}: sdpa {torch_ms:.2f} ms, minivllm {ours_ms:.2f} ms, err {err:.2g}"
            )


if __name__ == "__main__":
    main()
