"""Start-up time and decode speed of -O0, -O1, -O2 (and -O2 with a warm compile cache).

Each configuration runs in its own worker process, so start-up includes everything
a user waits for (model load, Dynamo trace, Inductor compilation or cache loads) and
no process inherits another's in-memory caches.  The cold runs get an empty
MINIVLLM_CACHE_ROOT (and Inductor kernel cache); the warm run reuses the -O2 run's.

Workers start one after another (start-up is timed alone), then stay alive and
take turns: each round asks every worker, in a rotating order, to decode one batch
while the others wait idle, and the table shows each worker's median over the
rounds.  Interleaving puts every configuration under the same machine load, so the
speed-up column is a side-by-side ratio even on a noisy machine.  Decode tokens/s
counts the steps after the prefill: every running request adds one token per step.

A second table splits a decode step at the largest batch into the linear layers
(GEMMs), attention (KV write + paged attention), the rest of the model forward
(norms, rotary, activations, residual adds, Python), and the step outside the
forward (input preparation, logits, sampling, scheduling).  Compilation can only
shrink the third part, so ``bound`` (step / (step - rest)) is the speed-up -O0 would
get if compiling made that part free.

    python benchmarks/compile_modes.py                       # default model, 1 and 32
    python benchmarks/compile_modes.py --tokens 8 --batch-sizes 1 2 --levels 0 2 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

WORKER_FLAG = "--_worker"


class StepTimers:
    """Wall time of the GEMMs, the attention ops and the whole forward, per step.

    Installed by wrapping what both eager and compiled code call at run time: the
    packed GEMM (`cpu_gemm.onednn_linear`, inside the ``minivllm::packed_linear`` op
    when compiled), the CPU attention backend's KV
    write and attention, and `ForwardRunner.run`.  GEMMs outside the forward (the LM
    head) count apart.  Unpacked GEMMs (``MINIVLLM_CPU_PACKED_GEMM=0``) are not timed.
    """

    def __init__(self) -> None:
        from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend
        from minivllm.model_executor.layers import cpu_gemm
        from minivllm.worker.forward_runner import ForwardRunner

        self.acc = dict.fromkeys(("gemm", "attention", "forward", "lm_head"), 0.0)
        self.in_forward = False
        cpu_gemm.onednn_linear = self._wrap(cpu_gemm.onednn_linear, "gemm")
        for name in ("write_kv", "forward"):
            setattr(CpuSdpaBackend, name, self._wrap(getattr(CpuSdpaBackend, name), "attention"))
        ForwardRunner.run = self._wrap(ForwardRunner.run, "forward")

    def _wrap(self, fn: Any, part: str) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            key = "lm_head" if part == "gemm" and not self.in_forward else part
            if part == "forward":
                self.in_forward = True
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.acc[key] += time.perf_counter() - t
                if part == "forward":
                    self.in_forward = False

        return call

    def reset(self) -> None:
        self.acc = dict.fromkeys(self.acc, 0.0)


def _decode(
    engine: Any, timers: StepTimers, batch: int, args: argparse.Namespace, tag: str
) -> dict[str, float]:
    """Decode tokens/s of one batch of ``batch`` requests (after their prefill step),
    and the per-step milliseconds of each part of the decode steps."""
    from minivllm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    for i in range(batch):
        ids = [(7 * i + j) % 1000 + 10 for j in range(args.prompt_len)]
        engine.add_request(f"{tag}-{i}", {"prompt_token_ids": ids}, params)
    engine.step()  # the prefill
    timers.reset()
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    elapsed = time.perf_counter() - start
    ms = {k: v * 1000 / max(steps, 1) for k, v in timers.acc.items()}
    return {
        "tok_s": batch * steps / elapsed if elapsed else 0.0,
        "step": elapsed * 1000 / max(steps, 1),
        "gemm": ms["gemm"],
        "attention": ms["attention"],
        "rest": ms["forward"] - ms["gemm"] - ms["attention"],
        "outside": elapsed * 1000 / max(steps, 1) - ms["forward"],
    }


def _worker(args: argparse.Namespace) -> None:
    """Build one engine, report its start-up, then decode a batch per stdin command."""
    from minivllm.args.engine_args import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine

    timers = StepTimers()
    t0 = time.perf_counter()
    engine_args = EngineArgs(
        model=args.model,
        dtype=args.dtype,
        optimization_level=args.level,
        max_num_seqs=max(args.batch_sizes),
        device=args.device,
        skip_tokenizer_init=args.skip_tokenizer_init,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
    )
    engine = LLMEngine.from_engine_args(engine_args)
    startup = time.perf_counter() - t0
    compilation_config = engine.vllm_config.compilation_config
    _decode(engine, timers, max(args.batch_sizes), args, "warmup")  # first-call costs stay out
    ready = {
        "startup_s": startup,
        "compile_s": compilation_config.compilation_time,
        "mode": compilation_config.mode.name if compilation_config.mode is not None else "NONE",
        "dtype": str(engine.vllm_config.model_config.dtype).removeprefix("torch."),
    }
    print("READY " + json.dumps(ready), flush=True)
    for n, line in enumerate(sys.stdin):
        result = _decode(engine, timers, int(line), args, f"r{n}")
        print("RESULT " + json.dumps(result), flush=True)


class Worker:
    """One configuration's engine process, driven over its stdin/stdout."""

    def __init__(self, name: str, args: argparse.Namespace, level: int, cache_root: str):
        cmd = [sys.executable, __file__, WORKER_FLAG, "--level", str(level)]
        cmd += ["--tokens", str(args.tokens), "--prompt-len", str(args.prompt_len)]
        cmd += ["--dtype", args.dtype, "--device", args.device, "--batch-sizes"]
        cmd += [str(b) for b in args.batch_sizes]
        if args.model:
            cmd += ["--model", args.model]
        if args.skip_tokenizer_init:
            cmd.append("--skip-tokenizer-init")
        if args.kv_cache_memory_bytes is not None:
            cmd += ["--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
        # Inductor's own kernel cache moves along, so a cold start really compiles.
        inductor_dir = os.path.join(cache_root, "inductor")
        env = {
            **os.environ,
            "MINIVLLM_CACHE_ROOT": cache_root,
            "TORCHINDUCTOR_CACHE_DIR": inductor_dir,
        }
        self.name = name
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self.info: dict[str, Any] = json.loads(self._expect("READY"))
        self.samples: dict[int, list[dict[str, float]]] = {}

    def _expect(self, tag: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(tag + " "):
                return line.removeprefix(tag + " ")
        self.log.seek(0)
        raise RuntimeError(f"{self.name} worker failed:\n{self.log.read()[-3000:]}")

    def decode(self, batch: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{batch}\n")
        self.proc.stdin.flush()
        self.samples.setdefault(batch, []).append(json.loads(self._expect("RESULT")))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model path (default: SmolLM2 GGUF)")
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved decode rounds")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--skip-tokenizer-init",
        action="store_true",
        help="a model without tokenizer files (benchmarks/random_checkpoint.py writes one)",
    )
    parser.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        default=None,
        help="KV cache size of each worker; on a GPU set it, since the workers share the "
        "card and the first would otherwise take gpu_memory_utilization of it",
    )
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-cache run")
    parser.add_argument(WORKER_FLAG, action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--level", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._worker:
        _worker(args)
        return

    workers: list[Worker] = []
    with tempfile.TemporaryDirectory(prefix="minivllm-bench-") as tmp:
        try:
            for level in args.levels:
                root = os.path.join(tmp, f"O{level}")
                workers.append(Worker(f"-O{level}", args, level, root))
                if level == max(args.levels) and level > 0 and not args.no_warm:
                    workers.append(Worker(f"-O{level} warm cache", args, level, root))
            for r in range(args.rounds):
                order = workers[r % len(workers) :] + workers[: r % len(workers)]
                for batch in args.batch_sizes:
                    for w in order:
                        w.decode(batch)
        finally:
            for w in workers:
                w.close()
    _print_table(workers, args)


def _median(w: Worker, batch: int, key: str) -> float:
    return statistics.median(sample[key] for sample in w.samples[batch])


def _print_table(workers: list[Worker], args: argparse.Namespace) -> None:
    cols = ["startup_s", "compile_s"] + [f"decode_tok_s_b{b}" for b in args.batch_sizes]
    print(f"{'config':<18}{'mode':<14}" + "".join(f"{c:>18}" for c in cols) + f"{'speed-up':>10}")
    last = args.batch_sizes[-1]
    base = _median(workers[0], last, "tok_s")
    for w in workers:
        cells = [w.info["startup_s"], w.info["compile_s"]]
        cells += [_median(w, b, "tok_s") for b in args.batch_sizes]
        row = "".join(f"{c:>18.2f}" for c in cells)
        speedup = _median(w, last, "tok_s") / base
        print(f"{w.name:<18}{w.info['mode']:<14}{row}{speedup:>9.2f}x")
    print(
        f"(decode: median of {args.rounds} interleaved rounds; speed-up: decode tokens/s at "
        f"batch {last} relative to {workers[0].name}; dtype {workers[0].info['dtype']})"
    )
    parts = ["step", "gemm", "attention", "rest", "outside"]
    print(f"\nms per decode step at batch {last} (medians):")
    print(f"{'config':<18}" + "".join(f"{p:>11}" for p in parts) + f"{'bound':>9}")
    for w in workers:
        ms = {p: _median(w, last, p) for p in parts}
        bound = ms["step"] / max(ms["step"] - ms["rest"], 1e-9)
        cells = "".join(f"{ms[p]:>11.1f}" for p in parts)
        print(f"{w.name:<18}{cells}{bound:>8.2f}x")
    print(
        "(gemm: linear layers in the forward; attention: KV write + paged attention; rest: "
        "the other forward work, which compilation fuses; outside: inputs, LM head, "
        "sampling, scheduling; bound: step / (step - rest))"
    )


if __name__ == "__main__":
    main()
