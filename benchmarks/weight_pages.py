"""A model's decode-step reads from huge pages against ordinary 4 KiB pages, in one
process taking turns (`minivllm.worker.weight_pages`).

Loads a GGUF model (the default one, or ``--model FILE``) with its weights left where
loading put them, then for ``--rounds`` rounds moves every weight into an arena of
ordinary pages (``MADV_NOHUGEPAGE``) and times one batch-1 decode step's fused
decoder layers (``minivllm_cpu::decoder_stack``, as the decode graph runs them),
their GEMMs alone (one op call each) and the LM head, then moves them into a huge-page arena (what a CPU worker does) and
times the same; with ``--prefetch`` each page size is timed at each software
prefetch distance of the kernels.  The same bytes, the same code, only the page size differs; this
machine's drift falls on both sides alike.  Prints each round and the medians::

    python benchmarks/weight_pages.py --model FILE.gguf --rounds 5 --prefetch 0 1024 2048
"""

from __future__ import annotations

# isort: off
# minivllm first: it sets how long idle OpenMP threads spin before torch loads libgomp.
import minivllm  # noqa: F401
# isort: on

import argparse
import os
import statistics
import time

import torch
from decode_layer import step_fns  # benchmarks/ (the script's own directory)

from minivllm.kernels import lowbit_cpu
from minivllm.model_executor.layers.quantized_linear import lowbit_logits
from minivllm.worker.weight_pages import place_on_huge_pages


def _ms(fn, steps: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps * 1e3


def _step(model, context: int):
    """One batch-1 decode step's fused layers, their GEMMs alone and the LM head,
    over the model's current tensors."""
    layers = list(model.model.layers)
    block = layers[0].self_attn.attn.kv_cache.shape[2]
    hidden = torch.randn(1, model.config.hidden_size) * 0.1
    head = model.lm_head

    def head_fn() -> None:
        lowbit_logits(hidden, head.qweight, head.qscales, head.quant_kind)

    layers_fn, gemms_fn = step_fns(layers, 1, context, block, model.config.hidden_size)
    return layers_fn, gemms_fn, head_fn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="decode steps timed per round")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument(
        "--prefetch",
        type=int,
        nargs="+",
        default=None,
        help="software prefetch distances (bytes, 0: none) to time on each page size "
        "(`minivllm_cpu::lowbit_prefetch`; default: what the worker picks for it, -1)",
    )
    args = parser.parse_args()
    if not lowbit_cpu.available():
        raise SystemExit("minivllm's CPU kernels are not built here (no C++ compiler?)")
    os.environ["MINIVLLM_CPU_HUGE_PAGES"] = "0"  # the load leaves them; the rounds move them
    from minivllm import LLM

    extra = {"model": args.model} if args.model else {}
    llm = LLM(enforce_eager=True, max_num_seqs=1, **extra)
    model = llm.llm_engine.executor.worker.model_runner.model
    os.environ["MINIVLLM_CPU_HUGE_PAGES"] = "1"
    distances = args.prefetch or [-1]
    configs = [(pages, d) for pages in ("4 KiB", "2 MiB") for d in distances]
    results: dict[tuple[str, int], list[tuple[float, float, float]]] = {c: [] for c in configs}
    with torch.inference_mode():
        for r in range(args.rounds):
            for pages in ("4 KiB", "2 MiB"):
                placement = place_on_huge_pages(model, huge=pages == "2 MiB")
                fns = _step(model, args.context)
                for d in distances:
                    d = lowbit_cpu.prefetch(d)  # -1 keeps the placement's choice
                    t_layers, t_gemms, t_head = (_ms(fn, args.steps) for fn in fns)
                    results[(pages, d if args.prefetch else -1)].append((t_layers, t_gemms, t_head))
                    print(
                        f"round {r + 1} {pages} pages ({placement.huge_bytes >> 20} of "
                        f"{placement.moved_bytes >> 20} MiB huge), prefetch {d:5d}: layers "
                        f"{t_layers:6.2f} ms, their GEMMs alone {t_gemms:6.2f} ms, head "
                        f"{t_head:5.2f} ms",
                        flush=True,
                    )
    base = [statistics.median(x[i] for x in results[configs[0]]) for i in range(3)]
    first = configs[0][1] if configs[0][1] >= 0 else "as placed"
    print(f"medians (ratios against {configs[0][0]} pages, prefetch {first}):")
    for c in configs:
        med = [statistics.median(x[i] for x in results[c]) for i in range(3)]
        print(
            f"  {c[0]} pages, prefetch {c[1] if c[1] >= 0 else 'as placed'}: layers {med[0]:6.2f} ms ({base[0] / med[0]:.2f}x), "
            f"GEMMs alone {med[1]:6.2f} ms ({base[1] / med[1]:.2f}x), head {med[2]:5.2f} ms "
            f"({base[2] / med[2]:.2f}x); layers + head {(base[0] + base[2]) / (med[0] + med[2]):.2f}x"
        )


if __name__ == "__main__":
    main()
