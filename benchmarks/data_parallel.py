"""Data parallelism on this machine: ``-dp 2`` x 1 thread vs ``-dp 1`` x 2 threads,
and prefix-aware vs least-loaded routing (run by ``benchmarks/parallel.py --data-parallel``).

Workloads (default model, float32, -O0, greedy, ``ignore_eos``):
- ``distinct``: 64 requests with different prompts, ``--tokens`` tokens each;
- ``prefix``: 64 requests over 8 shared prefixes (about 130 tokens each, each prefix
  shared by 8 requests, a distinct suffix each), sent in a shuffled order.
Each run adds all its requests at once (``LLM.generate``) and reports output tok/s and
req/s over the whole run, and the prefix-cache hit rate over its prompt tokens (the
replicas' own counters).  The two-replica engine runs the prefix workload twice, with
a fresh set of prefixes each time: least-loaded routing first, then prefix-aware.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

NUM_REQUESTS = 64
NUM_PREFIXES = 8


def distinct_prompts() -> list[str]:
    return [f"Story {i}: once upon a time in a town called {i * 7919 % 1000}" for i in range(64)]


def prefix_prompts(tag: str, seed: int) -> list[str]:
    """64 prompts over 8 prefixes of ~130 tokens (``tag`` makes a fresh set)."""
    rng = random.Random(seed)
    words = "river stone cloud lantern harbor meadow copper violet engine orchard".split()
    prefixes = [
        f"[{tag}-{p}] " + " ".join(rng.choice(words) for _ in range(100))
        for p in range(NUM_PREFIXES)
    ]
    prompts = [f"{prefixes[i % NUM_PREFIXES]} Question {i}:" for i in range(NUM_REQUESTS)]
    rng.shuffle(prompts)
    return prompts


def _prefix_counters(llm: Any) -> tuple[int, int]:
    engine = llm.llm_engine
    stats = (
        [r.get_stats() for r in engine.replicas]
        if hasattr(engine, "replicas")
        else [engine.get_stats()]
    )
    return sum(s.prefix_cache_queries for s in stats), sum(s.prefix_cache_hits for s in stats)


def run(llm: Any, prompts: list[str], tokens: int) -> dict[str, float]:
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    queries0, hits0 = _prefix_counters(llm)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    queries, hits = _prefix_counters(llm)
    return {
        "s": elapsed,
        "tok_s": len(prompts) * tokens / elapsed,
        "req_s": len(prompts) / elapsed,
        "hit": (hits - hits0) / max(queries - queries0, 1),
    }


def engine(dp: int) -> Any:
    from minivllm import LLM

    os.environ["MINIVLLM_CPU_THREADS"] = "2"  # the whole machine's share, split over replicas
    # A fixed KV cache per replica (512 blocks of 16 tokens), whatever memory is free.
    return LLM(data_parallel_size=dp, dtype="float32", optimization_level=0, max_model_len=512,
               num_gpu_blocks_override=512)  # fmt: skip


def measure(tokens: int) -> list[tuple[str, dict[str, float]]]:
    rows: list[tuple[str, dict[str, float]]] = []
    for dp in (2, 1):
        start = time.perf_counter()
        llm = engine(dp)
        print(f"-dp {dp}: started in {time.perf_counter() - start:.1f} s", flush=True)
        try:
            run(llm, distinct_prompts()[:4], 4)  # warm-up
            label = f"-dp {dp} x {2 // dp} thr"
            rows.append((f"{label}, distinct", run(llm, distinct_prompts(), tokens)))
            if dp == 2:
                balancer = llm.llm_engine.client.balancer
                rows.append(
                    (f"{label}, prefix, least-loaded", run(llm, prefix_prompts("a", 1), tokens))
                )
                balancer.prefix_aware = True
                rows.append(
                    (f"{label}, prefix, prefix-aware", run(llm, prefix_prompts("b", 2), tokens))
                )
            else:
                rows.append((f"{label}, prefix", run(llm, prefix_prompts("c", 3), tokens)))
        finally:
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if shutdown is not None:
                shutdown()
        for name, r in rows[-3 if dp == 2 else -2 :]:
            print(f"  {name}: {r['tok_s']:.1f} tok/s, hit {r['hit'] * 100:.1f}%", flush=True)
    return rows


def print_table(rows: list[tuple[str, dict[str, float]]]) -> None:
    print(f"{'run':<36} {'s':>7} {'out tok/s':>10} {'req/s':>7} {'prefix hit':>11}")
    for name, r in rows:
        print(f"{name:<36} {r['s']:>7.1f} {r['tok_s']:>10.1f} {r['req_s']:>7.2f} "
              f"{r['hit'] * 100:>10.1f}%")  # fmt: skip
