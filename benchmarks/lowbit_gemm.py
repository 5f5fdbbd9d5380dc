"""Micro-benchmark of the low-bit GEMM choices per row count, on the default
model's weight shapes (SmolLM2-135M: qkv 960x576, o 576x576, gate_up 3072x576,
down 576x1536, LM head 49152x576).

Columns (median microseconds per call, bfloat16 activations):
- ``int4 kernel``: torch's ``_weight_int4pack_mm_for_cpu`` on the packed weight;
- ``bf16 dense``: ``F.linear`` on a bfloat16 copy (what memory does not allow
  to keep: the reference for the speed a dense GEMM reaches);
- ``expand+dense``: the int4 weight expanded to bfloat16 per call (torch ops,
  `quantized_linear.dequantize_weight`) then ``F.linear``;
- ``expand(c)+dense``: the same expansion compiled by Inductor;
- ``inductor amx`` (``--inductor-amx``): the int4 kernel call compiled by
  Inductor with max-autotune and freezing, which lowers it to its AMX
  weight-only-int4 GEMM template.  That template needs the weight as a frozen
  constant (it repacks it: a second copy next to the packed one) and a static
  row count (with ``dynamic=True`` it falls back to the same kernel); a compile
  takes ~4-8 s per (shape, row count).

    python benchmarks/lowbit_gemm.py [--rows 1 8 32 128] [--no-compile] [--inductor-amx]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from minivllm.model_executor.layers import quantized_linear as ql

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def median_us(fn, reps: int = 15) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def int4_weight(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(0, 16, (rows, cols), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    scale_zero = (torch.rand(cols // 32, rows, 2) * 0.02).bfloat16()
    return packed, scale_zero


class _Int4Linear(torch.nn.Module):
    def __init__(self, packed: torch.Tensor, scale_zero: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scale_zero", scale_zero)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, 32, self.scale_zero)


def inductor_amx_us(x: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor) -> float:
    import torch._inductor.config as inductor_config

    with inductor_config.patch(
        freezing=True, max_autotune=True, max_autotune_gemm_backends="CPP,ATEN"
    ):
        torch._dynamo.reset()
        compiled = torch.compile(_Int4Linear(packed, scale_zero).eval(), dynamic=False)
        with torch.no_grad():
            compiled(x)
            return median_us(lambda: compiled(x))


def row_figures(x, packed, sz, dense, expand_compiled, amx: bool) -> list[float]:
    figures = [
        median_us(lambda: torch._weight_int4pack_mm_for_cpu(x, packed, 32, sz)),
        median_us(lambda: F.linear(x, dense)),
        median_us(lambda: F.linear(x, ql.dequantize_weight(ql.INT4, packed, sz))),
    ]
    if expand_compiled is not None:
        figures.append(median_us(lambda: F.linear(x, expand_compiled(ql.INT4, packed, sz))))
    if amx:
        figures.append(inductor_amx_us(x, packed, sz))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--inductor-amx", action="store_true")
    args = parser.parse_args()
    expand_compiled = (
        None if args.no_compile else torch.compile(ql.dequantize_weight, dynamic=False)
    )
    cols = ["int4 kernel", "bf16 dense", "expand+dense", "expand(c)+dense", "inductor amx"]
    print(f"{'shape':8} {'M':>4} " + " ".join(f"{c:>15}" for c in cols))
    for name, (rows, k) in SHAPES.items():
        packed, sz = int4_weight(rows, k)
        dense = ql.dequantize_weight(ql.INT4, packed, sz)
        for m in args.rows:
            x = torch.randn(m, k).bfloat16()
            figures = row_figures(x, packed, sz, dense, expand_compiled, args.inductor_amx)
            print(f"{name:8} {m:4} " + " ".join(f"{v:15.0f}" for v in figures), flush=True)


if __name__ == "__main__":
    main()
