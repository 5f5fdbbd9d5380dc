"""Decode speed of the CPU GEMM choices: float32 with ``F.linear``, float32 with
oneDNN-packed weights, and bfloat16 with packed weights (on CPUs with bf16 compute).

All three engines (-O0, so no compilation blurs the GEMM difference) live in this
process and take turns, one batch each per round in a rotating order; the table
shows medians and each configuration's per-round ratio to the first.

    python benchmarks/cpu_gemm.py
    python benchmarks/cpu_gemm.py --rounds 2 --tokens 8 --batch-size 4   # quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from minivllm.args.engine_args import EngineArgs
from minivllm.engine.llm_engine import LLMEngine
from minivllm.model_executor.layers.cpu_gemm import packed_gemm_supported
from minivllm.sampling_params import SamplingParams

CONFIGS = (
    ("float32, F.linear", "float32", "0"),
    ("float32, packed", "float32", "1"),
    ("bfloat16, packed", "bfloat16", "1"),
)
"""(name, dtype, MINIVLLM_CPU_PACKED_GEMM) per engine."""


def decode_tok_s(engine: LLMEngine, batch: int, tokens: int, tag: str) -> float:
    """Decode tokens/s of ``batch`` fresh requests (the prefill step is not timed)."""
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    for i in range(batch):
        ids = [(7 * i + j) % 1000 + 10 for j in range(16)]
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids}, params)
    engine.step()
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return batch * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model path (default: SmolLM2 GGUF)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    import torch

    engines: dict[str, LLMEngine] = {}
    for name, dtype, packed in CONFIGS:
        if dtype == "bfloat16" and not packed_gemm_supported(torch.device("cpu"), torch.bfloat16):
            print(f"skipping {name}: this CPU has no bf16 compute")
            continue
        os.environ["MINIVLLM_CPU_PACKED_GEMM"] = packed  # read when the weights are loaded
        engine_args = EngineArgs(
            model=args.model, dtype=dtype, optimization_level=0, max_num_seqs=args.batch_size
        )
        engines[name] = LLMEngine.from_engine_args(engine_args)
    names = list(engines)
    speeds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            speeds[name].append(decode_tok_s(engines[name], args.batch_size, args.tokens, f"r{r}"))
    base = speeds[names[0]]
    print(f"{'config':<20}{'decode tok/s':>14}{'vs ' + names[0]:>26}")
    for name in names:
        ratio = statistics.median(a / b for a, b in zip(speeds[name], base, strict=True))
        print(f"{name:<20}{statistics.median(speeds[name]):>14.1f}{ratio:>25.2f}x")
    print(f"(-O0, batch {args.batch_size}, median of {args.rounds} interleaved rounds)")


if __name__ == "__main__":
    main()
