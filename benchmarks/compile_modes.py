"""Start-up time and decode speed of -O0, -O1, -O2 (and -O2 with a warm compile cache).

Each configuration runs in a fresh subprocess, so start-up includes everything a
user waits for (model load, Dynamo trace, Inductor compilation or cache loads) and
no process inherits another's in-memory caches.  The cold runs get an empty
MINIVLLM_CACHE_ROOT; the warm run reuses the -O2 run's.  Decode tokens/s counts the
steps after the prefill: every running request adds one token per step.

    python benchmarks/compile_modes.py                       # default model, 1 and 32
    python benchmarks/compile_modes.py --tokens 8 --batch-sizes 1 2 --levels 0 2  # quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

WORKER_FLAG = "--_worker"


def _worker(args: argparse.Namespace) -> None:
    """Build one engine and measure it; prints one JSON line."""
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine
    from minivllm.sampling_params import SamplingParams

    t0 = time.perf_counter()
    engine_args = EngineArgs(
        model=args.model,
        dtype=args.dtype,
        optimization_level=args.level,
        max_num_seqs=max(args.batch_sizes),
        device=args.device,
    )
    engine = LLMEngine.from_engine_args(engine_args)
    startup = time.perf_counter() - t0
    cc = engine.vllm_config.compilation_config
    result: dict[str, object] = {
        "startup_s": startup,
        "compile_s": cc.compilation_time,
        "mode": cc.mode.name if cc.mode is not None else "NONE",
        "cudagraph_mode": str(cc.cudagraph_mode),
    }
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    for batch in args.batch_sizes:
        for i in range(batch):
            ids = [(7 * i + j) % 1000 + 10 for j in range(args.prompt_len)]
            engine.add_request(f"b{batch}-{i}", {"prompt_token_ids": ids}, params)
        engine.step()  # the prefill
        start, steps = time.perf_counter(), 0
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        elapsed = time.perf_counter() - start
        result[f"decode_tok_s_b{batch}"] = batch * steps / elapsed if elapsed else 0.0
    print("RESULT " + json.dumps(result), flush=True)


def _run(args: argparse.Namespace, level: int, cache_root: str) -> dict[str, float]:
    cmd = [sys.executable, __file__, WORKER_FLAG, "--level", str(level)]
    cmd += ["--tokens", str(args.tokens), "--prompt-len", str(args.prompt_len)]
    cmd += ["--dtype", args.dtype, "--device", args.device, "--batch-sizes"]
    cmd += [str(b) for b in args.batch_sizes]
    if args.model:
        cmd += ["--model", args.model]
    env = {**os.environ, "MINIVLLM_CACHE_ROOT": cache_root}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise RuntimeError(f"-O{level} run failed:\n{proc.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model path (default: SmolLM2 GGUF)")
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-cache run")
    parser.add_argument(WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--level", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        _worker(args)
        return

    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="minivllm-bench-") as tmp:
        for level in args.levels:
            root = os.path.join(tmp, f"O{level}")
            rows.append((f"-O{level}", _run(args, level, root)))
            if level == max(args.levels) and level > 0 and not args.no_warm:
                rows.append((f"-O{level} warm cache", _run(args, level, root)))
    base = rows[0][1]
    cols = ["startup_s", "compile_s"] + [f"decode_tok_s_b{b}" for b in args.batch_sizes]
    header = f"{'config':<18}{'mode':<14}" + "".join(f"{c:>18}" for c in cols)
    print(header + f"{'speed-up':>10}")
    last = f"decode_tok_s_b{args.batch_sizes[-1]}"
    for name, r in rows:
        cells = "".join(f"{r[c]:>18.2f}" for c in cols)
        speedup = r[last] / base[last] if base[last] else float("nan")
        print(f"{name:<18}{r['mode']:<14}{cells}{speedup:>9.2f}x")
    print(f"(speed-up: decode tokens/s at batch {args.batch_sizes[-1]} relative to {rows[0][0]})")


if __name__ == "__main__":
    main()
