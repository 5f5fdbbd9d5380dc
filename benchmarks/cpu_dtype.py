"""float32 against bfloat16 compute on this CPU, for the rule behind ``dtype="auto"``.

Three models, each run in float32 and in bfloat16, batch 1 and batch 32 decode:

- ``gguf-none``: the default model's GGUF dequantized to float (``--quantization none``);
- ``hf-bf16``: a random-weight bfloat16 Llama checkpoint of the default model's shape
  (hidden 576, 30 layers: `random_checkpoint.py`), as an HF safetensors model;
- ``gguf``: the default model kept low-bit (``--quantization gguf``); in float32 the
  residual stream, norms and attention stay float32 around the bfloat16 kernels, in
  bfloat16 the whole model runs in bfloat16.

All engines (at the default optimization level unless ``--level``) live in this
process and take turns, one batch each per round in a rotating order, so each
bfloat16/float32 ratio is measured under the same machine load; the table shows
medians of the per-round decode tokens/s and of the per-round ratios.  Accuracy of
the bfloat16 variants: ``python benchmarks/gguf_accuracy.py --dtype bfloat16``.

    python benchmarks/cpu_dtype.py
    python benchmarks/cpu_dtype.py --models gguf --rounds 2 --tokens 8   # quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cpu_gemm import decode_tok_s  # noqa: E402
from random_checkpoint import write_checkpoint  # noqa: E402

from minivllm.args.engine_args import EngineArgs  # noqa: E402
from minivllm.engine.llm_engine import LLMEngine  # noqa: E402
from minivllm.platforms.cpu import cpu_has_native_bf16  # noqa: E402

MODELS = ("gguf-none", "hf-bf16", "gguf")
DTYPES = ("float32", "bfloat16")


def engine_args(model: str, dtype: str, hf_dir: str, args: argparse.Namespace) -> EngineArgs:
    kwargs: dict = dict(
        dtype=dtype,
        max_num_seqs=max(args.batch_sizes),
        kv_cache_memory_bytes=256 << 20,
    )
    if args.level is not None:
        kwargs["optimization_level"] = args.level
    if model == "hf-bf16":
        kwargs.update(model=hf_dir, skip_tokenizer_init=True)
    else:
        kwargs["quantization"] = "gguf" if model == "gguf" else "none"
    return EngineArgs(**kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--level", type=int, default=None, help="-O level (default: engine's)")
    args = parser.parse_args()
    print(f"native bf16 compute on this CPU: {cpu_has_native_bf16()}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = str(Path(tmp) / "hf-bf16")
        if "hf-bf16" in args.models:
            write_checkpoint(Path(hf_dir), dtype="bfloat16")
        engines: dict[tuple[str, str], LLMEngine] = {}
        for model in args.models:
            for dtype in DTYPES:
                print(f"starting {model} {dtype}", flush=True)
                engines[model, dtype] = LLMEngine.from_engine_args(
                    engine_args(model, dtype, hf_dir, args)
                )
        keys = list(engines)
        speeds: dict[tuple[str, str, int], list[float]] = {}
        for r in range(args.rounds):
            for batch in args.batch_sizes:
                for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
                    tok_s = decode_tok_s(engines[key], batch, args.tokens, f"r{r}b{batch}")
                    speeds.setdefault((*key, batch), []).append(tok_s)
            print(f"round {r + 1}/{args.rounds} done", flush=True)

    print(
        f"\n{'model':<12}{'batch':>6}{'float32 tok/s':>15}{'bfloat16 tok/s':>16}{'bf16/fp32':>11}"
    )
    for model in args.models:
        for batch in args.batch_sizes:
            f32, b16 = speeds[model, "float32", batch], speeds[model, "bfloat16", batch]
            ratio = statistics.median(b / f for b, f in zip(b16, f32, strict=True))
            print(
                f"{model:<12}{batch:>6}{statistics.median(f32):>15.1f}"
                f"{statistics.median(b16):>16.1f}{ratio:>10.2f}x"
            )
    level = "default -O" if args.level is None else f"-O{args.level}"
    print(f"({level}, {args.tokens} tokens per request, median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
