"""Multi-LoRA serving: one batch mixing adapters against the base model alone, and
against running each adapter's requests as a batch of its own.

Workload: ``--requests`` prompts (default 32) spread round-robin over ``--adapters``
random PEFT-format adapters (default 4; ranks 8 and 16, attention and MLP targets),
greedy, ``--max-tokens`` tokens each (EOS ignored so every run does the same work).
All engines live in this one process and the rounds interleave them, so the ratios
compare runs under the same machine load.

1. mixed: the LoRA engine (``max_loras`` = number of adapters) runs all requests as
   one batch, each row with its own adapter;
2. base: an engine without LoRA runs the same requests on the base model;
3. separate: the LoRA engine runs each adapter's requests as a batch of its own,
   one adapter after the other (what a server that cannot mix adapters does).

Output tok/s per case, and mixed / base (target >= 0.7) and mixed / separate (> 1).

    python benchmarks/lora.py                      # default model, -O0
    python benchmarks/lora.py --max-tokens 16 --rounds 1 -O 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from minivllm import LLM, SamplingParams
from minivllm.lora.request import LoRARequest

# The tests' PEFT-format adapter writer (random A and B, no model needed).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from lora_helpers import write_random_adapter  # noqa: E402

TARGETS = [
    (8, ["q_proj", "v_proj"]),
    (16, ["q_proj", "k_proj", "v_proj", "o_proj"]),
    (8, ["gate_proj", "up_proj", "down_proj"]),
    (16, ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
]
"""(rank, target modules) of each adapter, cycled."""

TOPICS = ["the sea", "a city at night", "mountains", "an old library", "the first snow",
          "a train journey", "a garden", "the desert"]  # fmt: skip


def timed(llm: LLM, prompts: list[str], params: SamplingParams, loras: Any) -> tuple[float, int]:
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("-O", "--optimization-level", type=int, default=0)
    args = parser.parse_args()

    common = {"optimization_level": args.optimization_level, "max_model_len": 512,
              "max_num_seqs": max(32, args.requests)}  # fmt: skip
    base = LLM(**common)
    lora = LLM(**common, enable_lora=True, max_loras=args.adapters, max_lora_rank=16)
    hf_config = lora.llm_engine.vllm_config.model_config.hf_text_config
    tmp = Path(tempfile.mkdtemp(prefix="minivllm-lora-bench-"))
    adapters = []
    for i in range(args.adapters):
        rank, modules = TARGETS[i % len(TARGETS)]
        write_random_adapter(tmp / f"a{i}", hf_config, r=rank, target_modules=modules, seed=i)
        adapters.append(LoRARequest(f"a{i}", i + 1, str(tmp / f"a{i}")))

    prompts = [f"Write a short poem about {TOPICS[i % len(TOPICS)]}." for i in range(args.requests)]
    loras = [adapters[i % args.adapters] for i in range(args.requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    # Warm-up: kernels built, adapters loaded, compiled shapes seen.
    for name, engine, which in (("mixed", lora, loras), ("base", base, None)):
        seconds, tokens = timed(engine, prompts, params, which)
        print(f"  warm-up {name}: {tokens / seconds:.1f} tok/s", flush=True)

    rates: dict[str, list[float]] = {"mixed": [], "base": [], "separate": []}
    for _ in range(args.rounds):
        seconds, tokens = timed(lora, prompts, params, loras)
        rates["mixed"].append(tokens / seconds)
        print(f"  mixed: {tokens / seconds:.1f} tok/s", flush=True)
        seconds, tokens = timed(base, prompts, params, None)
        rates["base"].append(tokens / seconds)
        print(f"  base: {tokens / seconds:.1f} tok/s", flush=True)
        total_s, total_tokens = 0.0, 0
        for adapter in adapters:
            mine = [p for p, a in zip(prompts, loras, strict=True) if a is adapter]
            seconds, tokens = timed(lora, mine, params, adapter)
            total_s, total_tokens = total_s + seconds, total_tokens + tokens
        rates["separate"].append(total_tokens / total_s)
        print(f"  separate: {total_tokens / total_s:.1f} tok/s", flush=True)

    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"{args.requests} requests over {args.adapters} adapters, {args.max_tokens} tokens "
          f"each, -O{args.optimization_level}, {args.rounds} rounds (median output tok/s)")  # fmt: skip
    for name, value in median.items():
        print(
            f"  {name:9s} {value:8.1f} tok/s   (rounds: {', '.join(f'{v:.1f}' for v in rates[name])})"
        )
    print(f"  mixed / base     = {median['mixed'] / median['base']:.2f}x (target >= 0.7x)")
    print(f"  mixed / separate = {median['mixed'] / median['separate']:.2f}x (target > 1x)")


if __name__ == "__main__":
    main()
