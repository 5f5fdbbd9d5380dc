"""The KV offload tier (`--kv-offloading-size`) behind a KV pool too small for the
working set: prompt tokens computed and wall time of a second pass over the same
shared-prefix prompts with the host-memory tier, then a disk tier read by a freshly
started engine (and, with --baseline, without any tier).  Greedy outputs of every
pass are checked against the first pass.

    python benchmarks/kv_offload.py
    python benchmarks/kv_offload.py --num-prompts 32 --prompt-len 400 --shared 128 --pool-blocks 64 --max-model-len 512
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
import time
from typing import Any

from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def make_prompts(num: int, length: int, shared: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(100, 40_000) for _ in range(shared)]
    return [
        {"prompt_token_ids": prefix + [rng.randrange(100, 40_000) for _ in range(length - shared)]}
        for _ in range(num)
    ]


def run_pass(llm: LLM, prompts: list[dict[str, Any]]) -> tuple[list[list[int]], int, float]:
    """(outputs, prompt tokens computed, seconds) of one pass."""
    before = llm.llm_engine.get_stats().prompt_token_stats.local_compute
    start = time.perf_counter()
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    seconds = time.perf_counter() - start
    computed = llm.llm_engine.get_stats().prompt_token_stats.local_compute - before
    return [list(o.outputs[0].token_ids) for o in outs], computed, seconds


class Rows:
    """Prints each run's row as soon as it is measured."""

    def __init__(self, total: int) -> None:
        self.total = total

    def append(self, row: tuple[str, int, float, bool]) -> None:
        name, computed, seconds, same = row
        share = f"{100 * computed / self.total:.1f}%"
        print(f"{name:30} {computed:9d} {share:>9} {seconds:8.2f}  {'same' if same else 'DIFFER'}",
              flush=True)  # fmt: skip


def engine(args: argparse.Namespace, **kwargs: Any) -> LLM:
    return LLM(
        optimization_level=0,
        num_gpu_blocks_override=args.pool_blocks,
        max_model_len=args.max_model_len,
        **kwargs,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--shared", type=int, default=32)
    parser.add_argument("--pool-blocks", type=int, default=24)
    parser.add_argument("--max-model-len", type=int, default=160)
    parser.add_argument("--offload-gib", type=float, default=1.0)
    parser.add_argument("--baseline", action="store_true", help="Also run without the tier.")
    args = parser.parse_args()
    prompts = make_prompts(args.num_prompts, args.prompt_len, args.shared)
    total = args.num_prompts * args.prompt_len
    print(f"{args.num_prompts} prompts x {args.prompt_len} tokens ({args.shared} shared), "
          f"KV pool {args.pool_blocks} blocks; {total} prompt tokens per pass")  # fmt: skip
    print(f"{'run':30} {'computed':>9} {'of prompt':>9} {'seconds':>8}  outputs", flush=True)
    rows = Rows(total)
    llm = engine(args, kv_offloading_size=args.offload_gib)
    reference, computed, seconds = run_pass(llm, prompts)
    rows.append(("host tier, pass 1", computed, seconds, True))
    outs, computed, seconds = run_pass(llm, prompts)
    rows.append(("host tier, pass 2", computed, seconds, outs == reference))
    del llm
    gc.collect()
    with tempfile.TemporaryDirectory() as disk:
        extra = {"kv_connector_extra_config": {"disk_path": disk}}
        for name in ("disk tier, pass 1", "disk tier, restarted engine"):
            llm = engine(args, kv_offloading_size=args.offload_gib, kv_transfer_config=extra)
            outs, computed, seconds = run_pass(llm, prompts)
            rows.append((name, computed, seconds, outs == reference))
            del llm
            gc.collect()
    if args.baseline:
        llm = engine(args)
        for name in ("no tier, pass 1", "no tier, pass 2"):
            outs, computed, seconds = run_pass(llm, prompts)
            rows.append((name, computed, seconds, outs == reference))


if __name__ == "__main__":
    main()
