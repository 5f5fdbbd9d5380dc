"""``minivllm bench latency``: end-to-end latency of one batch, repeated.

A batch of ``--batch-size`` random prompts of ``--input-len`` tokens generates
``--output-len`` tokens each (EOS ignored); after ``--num-iters-warmup`` untimed
runs, ``--num-iters`` timed runs give the average and percentile latencies
(as ``vllm bench latency``).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from minivllm.entrypoints.bench.common import (
    add_common_args,
    check_positive,
    mean,
    percentile,
    print_table,
    write_json,
)

PERCENTILES = (10, 25, 50, 75, 90, 99)
"""Latency percentiles reported."""


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Batch shape, iteration counts, common flags and every engine flag."""
    from minivllm.args.engine_args import EngineArgs

    group = parser.add_argument_group("latency")
    group.add_argument("--input-len", type=int, default=32, help="Prompt tokens per request.")
    group.add_argument("--output-len", type=int, default=128, help="Tokens generated per request.")
    group.add_argument("--batch-size", type=int, default=8, help="Requests per batch.")
    group.add_argument(
        "--num-iters-warmup",
        type=int,
        default=2,
        help="Untimed batches run first (default 2; vLLM's 10 is long on a CPU).",
    )
    group.add_argument(
        "--num-iters", type=int, default=10, help="Timed batches (default 10; vLLM: 30)."
    )
    add_common_args(parser, seed=False)
    EngineArgs.add_cli_args(parser)


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark, print the summary, write --output-json; returns the figures."""
    from tqdm.auto import tqdm

    from minivllm.entrypoints.bench.throughput import build_engine, run_to_completion

    check_positive("--input-len", args.input_len)
    check_positive("--output-len", args.output_len)
    check_positive("--batch-size", args.batch_size)
    check_positive("--num-iters", args.num_iters)
    check_positive("--num-iters-warmup", args.num_iters_warmup, allow_zero=True)
    engine = build_engine(args)
    tokenizer = engine.get_tokenizer()
    special = set(tokenizer.all_special_ids)
    allowed = [i for i in range(len(tokenizer)) if i not in special]
    rng = random.Random(args.seed or 0)
    prompts = [rng.choices(allowed, k=args.input_len) for _ in range(args.batch_size)]
    output_lens = [args.output_len] * args.batch_size

    def run_once(tag: str) -> float:
        seconds, _ = run_to_completion(engine, prompts, output_lens, tag=tag, progress=False)
        return seconds

    show = not args.disable_tqdm
    for i in tqdm(range(args.num_iters_warmup), desc="Warmup iterations", disable=not show):
        run_once(f"warmup{i}")
    latencies = [
        run_once(f"iter{i}")
        for i in tqdm(range(args.num_iters), desc="Profiling iterations", disable=not show)
    ]
    result: dict[str, Any] = {
        "avg_latency": mean(latencies),
        "latencies": latencies,
        "percentiles": {str(q): percentile(latencies, q) for q in PERCENTILES},
        "batch_size": args.batch_size,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "num_iters_warmup": args.num_iters_warmup,
        "num_iters": args.num_iters,
    }
    result["output_tokens_per_second"] = args.batch_size * args.output_len / result["avg_latency"]
    print_table(
        "Latency Result",
        [
            ("Batch size:", args.batch_size),
            ("Input / output tokens:", f"{args.input_len} / {args.output_len}"),
            ("Avg latency (s):", f"{result['avg_latency']:.4f}"),
            *[(f"P{q} latency (s):", f"{result['percentiles'][str(q)]:.4f}") for q in PERCENTILES],
            ("Output token throughput (tok/s):", result["output_tokens_per_second"]),
        ],
    )
    write_json(args.output_json, result)
    return result
