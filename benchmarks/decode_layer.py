"""Time a model's decoder layers as one fused C++ call
(``minivllm_cpu::decoder_stack``), against their GEMMs alone.

Loads the default GGUF model (or ``--model FILE.gguf``; low-bit weights), then for each ``--batch`` runs
one decode step's layers, every request at ``--context`` tokens, from Python in
a loop: the weights stream from memory as in a real step (66 MB, more than the
caches hold).  Prints milliseconds per step (median of 5 rounds of 20 steps) for

- ``fused``: the 30 layers as one ``decoder_stack`` call (what the decode graph runs);
- ``gemms``: the same layers' GEMMs alone (``q4_gemm``, or ``q8_gemm`` for int8
  weights such as re-quantized Q6_K), i.e. the weight
  reading the fused layer cannot avoid, plus one op dispatch per GEMM;
- ``LM head``: the LM head's approximate logits as the model computes them
  (`lowbit_logits`: 28 MB of int8 for the default model);

and the weight bytes read per step and the rate they were read at::

    python benchmarks/decode_layer.py --batch 1 8 32 --context 190

With ``--residual-cut 0 3e-5`` it times only the fused layers, at each of the low-bit
kernels' residual cuts in turns (`lowbit_cpu.residual_cut`), and prints each one's
speed against the first.
"""

from __future__ import annotations

# isort: off
# minivllm first: it sets how long idle OpenMP threads spin before torch loads libgomp.
import minivllm  # noqa: F401
# isort: on

import argparse
import statistics
import time

import torch

from minivllm.attention.forward_context import DecodeStep
from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.fused_decoder_layer import fused_decoder_stack, layer_parts
from minivllm.model_executor.layers.quantized_linear import Q4, lowbit_logits


def _median_ms(fn, steps: int = 20, rounds: int = 5) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        times.append((time.perf_counter() - start) / steps * 1e3)
    return statistics.median(times)


def step_fns(layers: list, b: int, context: int, block: int, hidden_size: int):
    """Two callables over ``b`` requests at ``context`` tokens: one decode step's
    layers as one fused call, and the same layers' GEMMs alone (one op each)."""
    blocks = -(-context // block)
    have = layers[0].self_attn.attn.kv_cache.shape[1]
    if 1 + b * blocks > have:
        raise SystemExit(
            f"{b} requests x {context} tokens need {1 + b * blocks} KV blocks; the cache has "
            f"{have}: lower --context or --batch"
        )
    table = torch.arange(1, 1 + b * blocks, dtype=torch.int32).view(b, blocks)
    lens = torch.full((b,), context, dtype=torch.int32)
    slots = table[:, -1].long() * block + (context - 1) % block
    positions = lens.long() - 1
    hidden = torch.randn(b, hidden_size) * 0.1
    parts = [layer_parts(layer) for layer in layers]
    groups = 1 + max(p.attn.kv_group for p in parts)  # Gemma 3: one group a window kind
    step = DecodeStep(lens, [table] * groups, [slots] * groups)

    def fused() -> None:
        fused_decoder_stack(positions, hidden, parts, step)

    linears = [lin for p in parts for lin in p[1]]
    inputs = {n: torch.randn(b, n) * 0.1 for n in {lin.input_size for lin in linears}}

    ops = [
        torch.ops.minivllm_cpu.q4_gemm if lin.quant_kind == Q4 else torch.ops.minivllm_cpu.q8_gemm
        for lin in linears
    ]

    def gemms() -> None:
        for op, lin in zip(ops, linears, strict=True):
            op(inputs[lin.input_size], lin.qweight, lin.qscales)

    return fused, gemms


def time_batch(
    layers: list, b: int, context: int, block: int, hidden_size: int
) -> tuple[float, float]:
    """(fused, gemms-alone) milliseconds per step for ``b`` requests."""
    fused, gemms = step_fns(layers, b, context, block, hidden_size)
    with torch.inference_mode():
        return _median_ms(fused), _median_ms(gemms)


def compare_cuts(layers: list, args: argparse.Namespace, block: int, hidden_size: int) -> None:
    """The fused layers at each ``--residual-cut`` (medians of 5 rounds taking turns)
    and each one's speed against the first; the cut in use is restored after."""
    before = lowbit_cpu.residual_cut()
    try:
        for b in args.batch:
            fused, _ = step_fns(layers, b, args.context, block, hidden_size)
            times: dict[float, list[float]] = {cut: [] for cut in args.residual_cut}
            with torch.inference_mode():
                for _ in range(5):
                    for cut in args.residual_cut:
                        lowbit_cpu.residual_cut(cut)
                        times[cut].append(_median_ms(fused, rounds=1))
            first = statistics.median(times[args.residual_cut[0]])
            cells = [
                f"cut {cut:g} {statistics.median(t):7.2f} ms ({first / statistics.median(t):.2f}x)"
                for cut, t in times.items()
            ]
            print(f"batch {b:3d} context {args.context}: fused layers " + ", ".join(cells))
    finally:
        lowbit_cpu.residual_cut(before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--context", type=int, default=190)
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument(
        "--residual-cut",
        type=float,
        nargs="+",
        default=None,
        help="time the fused layers at each of these `lowbit_cpu.residual_cut` values "
        "instead, in turns in this process (e.g. 0 3e-5: every group's second term "
        "against the default)",
    )
    args = parser.parse_args()
    if not lowbit_cpu.available():
        raise SystemExit("minivllm's CPU kernels are not built here (no C++ compiler?)")
    from minivllm import LLM

    extra = {"model": args.model} if args.model else {}
    llm = LLM(enforce_eager=True, max_num_seqs=max(args.batch), **extra)
    model = llm.llm_engine.executor.worker.model_runner.model
    layers = list(model.model.layers)
    attn0 = layers[0].self_attn.attn
    block = attn0.kv_cache.shape[2]
    hidden_size = model.config.hidden_size
    weight_bytes = sum(
        t.numel() * t.element_size()
        for layer in layers
        for lin in layer_parts(layer)[1]
        for t in (lin.qweight, lin.qscales)
    )
    print(f"threads {torch.get_num_threads()}, weight bytes per step {weight_bytes / 1e6:.1f} MB")
    if args.residual_cut:
        compare_cuts(layers, args, block, hidden_size)
        return
    head = model.lm_head
    head_bytes = head.qweight.numel() * head.qweight.element_size()
    for b in args.batch:
        t_fused, t_gemms = time_batch(layers, b, args.context, block, hidden_size)
        rate = weight_bytes / (t_gemms * 1e-3) / 1e9
        x = torch.randn(b, hidden_size)
        with torch.inference_mode():
            t_head = _median_ms(  # the model's own path: whatever form the head is in
                lambda x=x: lowbit_logits(x, head.qweight, head.qscales, head.quant_kind)
            )
        print(
            f"batch {b:3d} context {args.context}: fused {t_fused:6.2f} ms/step, "
            f"gemms alone {t_gemms:6.2f} ms/step ({rate:4.1f} GB/s), LM head {t_head:5.2f} ms "
            f"({head_bytes / (t_head * 1e-3) / 1e9:4.1f} GB/s)"
        )


if __name__ == "__main__":
    main()
