"""Time minivllm's int8-weight kernel (``minivllm_cpu::q8_gemm``) on LM-head and
layer shapes at 1, 8 and 32 rows, with its error against the float product.

    python benchmarks/q8_kernel.py

Shapes: Gemma 3's 262144 x 640 head, the default model's 49152 x 576 head, a
2048 x 1536 layer.  The kernel's code path is the best this CPU has (AMX from 3
rows: two int8 activation terms; AVX-512 and AVX2: one int16 code per input);
``--isa 1`` forces AVX2 and ``--isa 0`` the portable C++ for comparison.  Each shape
runs with one scale per row and with Q8_0's float16 scales per 32 inputs
(``group``: the file's form, as the kernels read it on CPUs without VNNI/AMX), the
two in turns; on the AVX-512 path also ``coarse``: the LM head's batches on
``q8_gemm_coarse`` (one int8 term a token, row scales), and ``tiled 1`` /
``tiled 2``: the same head held in 16-row tiles on ``q8_tiled_gemm`` with one or two
int8 terms a token (`quantized_linear.tiled_head_kernel`).  Best of a few calls, 2
threads unless ``--threads``.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch

from minivllm.kernels import lowbit_cpu


def best_of(args: tuple[torch.Tensor, ...], n: int, op=None) -> float:
    """Best of ``n`` timed ``op(*args)`` calls (``q8_gemm`` by default), after one
    untimed call."""
    op = op or torch.ops.minivllm_cpu.q8_gemm
    op(*args)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        op(*args)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", type=int, default=-1, help="force a lower code path")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not lowbit_cpu.available():
        raise SystemExit("minivllm's CPU kernels are not built here (no C++ compiler?)")
    torch.set_num_threads(args.threads)
    # As in the engine (`minivllm.worker`): large outputs reuse freed blocks instead
    # of faulting in fresh pages every call (32 rows of a 262k head: 33 MB).
    lowbit_cpu.install_block_cache(1 << 30)
    print(f"code path {lowbit_cpu.isa(args.isa)} (0 portable, 1 AVX2, 2 AVX-512)")
    gen = torch.Generator().manual_seed(0)
    for n, k in [(262144, 640), (49152, 576), (2048, 1536)]:
        w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        row = torch.rand(n, generator=gen) * 0.01
        group = (torch.rand(n, k // 32, generator=gen) * 0.01).half()
        dense = {
            "row": w.float() * row[:, None],
            "group": (w.float().view(n, -1, 32) * group.float()[..., None]).view(n, k),
        }
        tiles = lowbit_cpu.pack_q8_tiles(w.clone()) if n % 16 == 0 else None
        for rows in (1, 8, 32, 64):
            x = torch.randn(rows, k, generator=gen)
            x[:, 3] *= 20  # an outlier input, as real hidden states have
            for name, scale in (("row", row), ("group", group)):
                got = torch.ops.minivllm_cpu.q8_gemm(x, w, scale)
                ref = x @ dense[name].T
                err = ((got - ref).norm() / ref.norm()).item()
                t = best_of((x, w, scale), 3 if n > 10**5 else 10)
                print(
                    f"{n} x {k}, {rows:2d} rows, {name:5} scales: {t * 1e3:8.2f} ms"
                    f"   relative error {err:.1e}"
                )
            if args.isa in (-1, 2) and lowbit_cpu.isa() == 2:
                one_term = [("coarse", torch.ops.minivllm_cpu.q8_gemm_coarse, w)]
                if tiles is not None:
                    for terms in (1, 2):
                        op = functools.partial(torch.ops.minivllm_cpu.q8_tiled_gemm, terms=terms)
                        one_term.append((f"tiled {terms}", op, tiles))
                for name, op, weight in one_term:
                    got = op(x, weight, row)
                    ref = x @ dense["row"].T
                    err = ((got - ref).norm() / ref.norm()).item()
                    t = best_of((x, weight, row), 3 if n > 10**5 else 10, op)
                    print(
                        f"{n} x {k}, {rows:2d} rows, {name}:{' ' * (13 - len(name))}"
                        f"{t * 1e3:8.2f} ms   relative error {err:.1e}"
                    )


if __name__ == "__main__":
    main()
