"""Decode speed of tensor and pipeline parallelism on this machine, side by side.

Configurations (default model, float32, -O0 so that start-up is not a compile):
- ``tp1``: one process, 2 torch threads (the "uni" executor);
- ``tp3``: TP=3 on the "mp" executor, 1 thread per rank;
- ``pp2``: PP=2 on the "mp" executor, 1 thread per rank, two batches in flight
  (one per stage, so the stages overlap);
- ``pp2-serial``: the same with one batch in flight (the stages take turns), to
  show what the overlap brings.

For each batch size the engine decodes ``--tokens`` tokens per request; decode
tok/s is (tokens after the first) / (time of the run - time of a 1-token run of the
same prompts), so prefill is left out.  ``comm ms/step`` is the mean over ranks of
the time a rank spent in all-reduce / all-gather / broadcast / send / recv per step
(it includes waiting for slower peers), and ``rpc ms`` is the executor's round trip
with the ranks for an empty call: the per-step cost of the one broadcast of the
`SchedulerOutput` over pipes and the answers.  The engines run one after another,
each round in the same order, so the ratios are comparable on a loaded machine.

    python benchmarks/parallel.py                    # batch 1 and 32, 32 tokens
    python benchmarks/parallel.py --batch-sizes 1 --tokens 8 --configs tp1 tp3

``--data-parallel`` measures data parallelism instead (``benchmarks/data_parallel.py``):
64 requests, ``-dp 2`` x 1 thread vs ``-dp 1`` x 2 threads, and prefix-aware vs
least-loaded routing on 8 shared prefixes (prefix-cache hit rate and throughput).

    python benchmarks/parallel.py --data-parallel --tokens 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

CONFIGS: dict[str, dict[str, Any]] = {
    "tp1": {"threads": 2, "args": {}},
    "tp3": {"threads": 3, "args": {"tensor_parallel_size": 3}},
    "pp2": {"threads": 2, "args": {"pipeline_parallel_size": 2}},
    "pp2-serial": {"threads": 2, "args": {"pipeline_parallel_size": 2}, "batches": 1},
}
"""``threads`` is the total MINIVLLM_CPU_THREADS; the "mp" executor gives each rank its share."""


def _timed_generate(llm: Any, prompts: list[str], max_tokens: int) -> float:
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    return time.perf_counter() - start


def measure(name: str, batch_sizes: list[int], tokens: int, rounds: int) -> dict[str, Any]:
    from minivllm import LLM

    spec = CONFIGS[name]
    os.environ["MINIVLLM_CPU_THREADS"] = str(spec["threads"])
    start = time.perf_counter()
    llm = LLM(dtype="float32", optimization_level=0, max_model_len=512, **spec["args"])
    result: dict[str, Any] = {"startup_s": time.perf_counter() - start}
    if "batches" in spec:  # fewer batches in flight than the pipeline's stages
        llm.llm_engine.scheduler.options.max_concurrent_batches = spec["batches"]
    executor = llm.llm_engine.executor
    ranks = getattr(executor, "world_size", 1)
    if ranks > 1:
        executor.collective_rpc("pid")
        t0 = time.perf_counter()
        for _ in range(50):
            executor.collective_rpc("pid")
        result["rpc_ms"] = (time.perf_counter() - t0) / 50 * 1e3
    try:
        for batch in batch_sizes:
            prompts = [f"Story {i}: once upon a time" for i in range(batch)]
            _timed_generate(llm, prompts, 4)  # warm-up
            speeds, comms = [], []
            for _ in range(rounds):
                base = _timed_generate(llm, prompts, 1)
                if ranks > 1:
                    executor.collective_rpc("take_comm_seconds")
                total = _timed_generate(llm, prompts, tokens)
                if ranks > 1:
                    per_rank = executor.collective_rpc("take_comm_seconds")
                    comms.append(statistics.mean(per_rank) / tokens * 1e3)
                speeds.append(batch * (tokens - 1) / max(total - base, 1e-9))
            result[f"tok_s_{batch}"] = statistics.median(speeds)
            if comms:
                result[f"comm_ms_{batch}"] = statistics.median(comms)
    finally:
        llm.llm_engine.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-parallel", action="store_true", help="the -dp table instead")
    args = parser.parse_args()
    if args.data_parallel:
        import data_parallel

        data_parallel.print_table(data_parallel.measure(args.tokens))
        return
    results = {c: measure(c, args.batch_sizes, args.tokens, args.rounds) for c in args.configs}
    base = results.get("tp1")
    header = f"{'config':<10} {'start s':>8} {'rpc ms':>7}"
    for b in args.batch_sizes:
        header += f" {f'tok/s@{b}':>10} {'vs tp1':>7} {f'comm ms@{b}':>11}"
    print(header)
    for name, r in results.items():
        row = f"{name:<10} {r['startup_s']:>8.1f} {r.get('rpc_ms', 0.0):>7.2f}"
        for b in args.batch_sizes:
            speed = r[f"tok_s_{b}"]
            ratio = speed / base[f"tok_s_{b}"] if base else float("nan")
            row += f" {speed:>10.1f} {ratio:>7.2f} {r.get(f'comm_ms_{b}', 0.0):>11.2f}"
        print(row)


if __name__ == "__main__":
    main()
