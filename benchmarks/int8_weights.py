"""Decode speed and weight memory: float32 against ``quantization="int8_per_channel"``.

Writes a random-weight HF checkpoint of SmolLM2-135M's shape (30 layers, hidden
576, intermediate 1536, 9 query / 3 KV heads, 49,152-token vocabulary, tied
embeddings; `random_checkpoint.py`) to a temporary directory, builds one engine
per configuration in this process, and lets them take turns: each round decodes
one batch on every engine, in a rotating order, so both see the same machine load
and the ratio column compares them side by side.  Decode tokens/s counts the
steps after the prefill (every running request adds one token per step).

    python benchmarks/int8_weights.py                      # batch 1 and 32, -O2
    python benchmarks/int8_weights.py --level 0 --rounds 5 --tokens 32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from engine_timing import time_decode_batch
from random_checkpoint import write_checkpoint

CONFIGS = {"float32": None, "int8_per_channel": "int8_per_channel"}


def decode_tok_s(engine: Any, batch: int, tokens: int, prompt_len: int, tag: str) -> float:
    """Decode tokens/s of one batch of ``batch`` requests, after their prefill step."""
    from minivllm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    seconds, steps = time_decode_batch(engine, tag, batch, prompt_len, params)
    return batch * steps / seconds


def weight_mib(engine: Any) -> tuple[float, float]:
    """MiB of (the decoder's linear weights, every parameter and buffer of the model)."""
    from minivllm.model_executor.layers.linear import LinearBase

    model = engine.executor.worker.model_runner.model
    linear = 0
    for m in model.modules():
        if isinstance(m, LinearBase):
            linear += sum(t.nbytes for t in (m.weight, m.qweight, m.qscales) if t is not None)
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in [*model.parameters(), *model.buffers()]
    }
    return linear / 2**20, sum(storages.values()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved decode rounds")
    parser.add_argument("--level", type=int, default=2, help="optimization level (-O)")
    args = parser.parse_args()

    from minivllm.args.engine_args import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine

    samples: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="minivllm-int8-") as tmp:
        path = write_checkpoint(Path(tmp) / "smollm2-random")
        engines = {}
        for name, quantization in CONFIGS.items():
            engine_args = EngineArgs(
                model=str(path),
                dtype="float32",
                quantization=quantization,
                optimization_level=args.level,
                max_num_seqs=max(args.batch_sizes),
                skip_tokenizer_init=True,
                kv_cache_memory_bytes=256 * 2**20,
            )
            engines[name] = LLMEngine.from_engine_args(engine_args)
            decode_tok_s(engines[name], max(args.batch_sizes), 4, args.prompt_len, "warmup")
        names = list(engines)
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for batch in args.batch_sizes:
                for name in order:
                    tps = decode_tok_s(engines[name], batch, args.tokens, args.prompt_len, f"{r}")
                    samples.setdefault((name, batch), []).append(tps)
        mib = {name: weight_mib(engine) for name, engine in engines.items()}

    cols = [f"decode tok/s b{b}" for b in args.batch_sizes]
    print(
        f"{'config':<18}"
        + "".join(f"{c:>18}" for c in cols)
        + f"{'linear MiB':>12}{'model MiB':>11}"
    )
    for name in names:
        cells = "".join(f"{statistics.median(samples[name, b]):>18.1f}" for b in args.batch_sizes)
        print(f"{name:<18}{cells}{mib[name][0]:>12.1f}{mib[name][1]:>11.1f}")
    ratios = "  ".join(
        f"b{b} {statistics.median(samples[names[1], b]) / statistics.median(samples[names[0], b]):.2f}x"
        for b in args.batch_sizes
    )
    print(f"int8 / float32 decode: {ratios}")
    print(
        f"(-O{args.level}; median of {args.rounds} interleaved rounds of {args.tokens} tokens "
        "per request; random weights of SmolLM2-135M's shape)"
    )


if __name__ == "__main__":
    main()
