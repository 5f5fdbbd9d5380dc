"""Where one batch-1 decode step of the default model spends its time.

Builds one engine in this process (``--quantization gguf`` or the float path, any
``-O`` level), prefills one prompt, then decodes: first ``--steps`` steps with no
timers (the clean tokens/s), then as many with wall-clock timers wrapped around
what every step calls, and prints a table of milliseconds per step and the share
of the step:

- weight GEMMs inside the forward (torch's int4/int8 low-bit kernels, the packed
  oneDNN GEMM, ``F.linear``), with the weight bytes they read per token and the
  GB/s that makes;
- attention (KV write + paged attention, the CPU backend's two calls);
- the rest of the forward (embedding, norms, rotary, activation, residual adds,
  the dtype casts around the low-bit kernels, and the Python/dispatch between
  kernels);
- the LM head GEMM and the rest of the logits, sampling (metadata + sampler),
  input building, the worker's other per-step Python, the scheduler, the
  output processor and the engine's own step code.

The timers wrap Python-level calls that both eager and compiled code make (the
low-bit op's kernel calls ``torch._weight_int4pack_mm_for_cpu`` through the torch
module; compiled code calls the packed GEMM and attention through their custom
ops, whose kernels are the wrapped functions), so the split holds at -O0 and -O2.
Each wrapped call costs ~1 us, so the timed run is a little slower than the clean
one.  ``--torch-profile`` adds torch.profiler's op table for a few steps.

    python benchmarks/step_profile.py --quantization gguf            # -O2 (default)
    python benchmarks/step_profile.py --quantization none -O 0
    python benchmarks/step_profile.py --quantization gguf none -O 0 2   # side by side
    git archive HEAD~3 | tar -x -C /tmp/before
    python benchmarks/step_profile.py --baseline /tmp/before         # before/after

With several configurations (``--quantization`` / ``-O`` values, or ``--baseline``,
which runs each one again on an older source tree) every configuration gets its
own process; they take turns decoding, ``--rounds`` times, so a loaded machine
slows them alike, and each table shows the round with the median step time,
followed by tokens/s (median) and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

# Table rows: (key, label).  Indented labels are parts of the row above them.
ROWS = [
    ("forward", "model forward"),
    ("gemm", "  weight GEMMs"),
    ("attention", "  attention (KV write + SDPA)"),
    ("fwd_rest", "  other forward ops + dispatch"),
    ("logits", "logits (LM head + cast)"),
    ("lm_head", "  LM head GEMM"),
    ("sampling", "sampling (metadata + sampler)"),
    ("inputs", "input building"),
    ("runner_rest", "model runner, other"),
    ("schedule", "scheduler.schedule"),
    ("update", "scheduler.update_from_output"),
    ("output", "output processor"),
    ("engine_rest", "engine step, other"),
]


class Timers:
    """Accumulated wall time of wrapped calls, by phase (inclusive times)."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = {}
        self.enabled = False
        self.in_forward = False
        self.on_enable: Callable[[], Any] | None = None
        self.on_disable: Callable[[], Any] | None = None

    def set(self, on: bool) -> None:
        self.enabled = on
        hook = self.on_enable if on else self.on_disable
        if hook is not None:
            hook()

    def wrap(self, owner: Any, name: str, phase: str | Callable[[], str]) -> None:
        fn = getattr(owner, name)
        timers = self

        def timed(*a: Any, **k: Any) -> Any:
            if not timers.enabled:
                return fn(*a, **k)
            key = phase() if callable(phase) else phase
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timers.acc[key] = timers.acc.get(key, 0.0) + time.perf_counter() - t

        if hasattr(fn, "default"):  # an op packet: compiled code calls ``.default``
            timed.default = timed  # type: ignore[attr-defined]
        setattr(owner, name, timed)

    def reset(self) -> None:
        self.acc = {}


def install(timers: Timers, engine: Any) -> None:
    """Wrap what a step calls (see the module doc)."""
    import torch
    import torch.nn.functional as F

    from minivllm.attention.backends.cpu_sdpa import CpuSdpaBackend
    from minivllm.engine.output_processor import OutputProcessor
    from minivllm.model_executor.layers import cpu_gemm

    try:
        from minivllm.kernels import lowbit_cpu
    except ImportError:  # a --baseline tree from before the kernels
        lowbit_cpu = None
    from minivllm.sample.metadata import SamplingMetadata
    from minivllm.sample.sampler import Sampler
    from minivllm.scheduler.scheduler import Scheduler
    from minivllm.worker import model_runner as mr
    from minivllm.worker.forward_runner import ForwardRunner

    def gemm_phase() -> str:
        return "gemm" if timers.in_forward else "lm_head"

    for name in ("_weight_int4pack_mm_for_cpu", "_weight_int8pack_mm", "_int_mm"):
        timers.wrap(torch, name, gemm_phase)
    if lowbit_cpu is not None and lowbit_cpu.available():  # minivllm's own kernels
        for name in ("q4_gemm", "q8_gemm", "q8_gemm_coarse", "q8_tiled_gemm"):
            if hasattr(torch.ops.minivllm_cpu, name):  # a baseline tree may lack one
                timers.wrap(torch.ops.minivllm_cpu, name, gemm_phase)
    timers.wrap(cpu_gemm, "onednn_linear", gemm_phase)
    timers.wrap(F, "linear", gemm_phase)
    timers.wrap(CpuSdpaBackend, "write_kv", "attention")
    timers.wrap(CpuSdpaBackend, "forward", "attention")
    run = ForwardRunner.run

    def forward(*a: Any, **k: Any) -> Any:
        timers.in_forward = True
        try:
            return run(*a, **k)
        finally:
            timers.in_forward = False

    ForwardRunner.run = forward  # type: ignore[method-assign]
    timers.wrap(ForwardRunner, "run", "forward")
    model = runner_of(engine).model
    timers.wrap(type(model), "compute_logits", "logits")
    timers.wrap(SamplingMetadata, "build", "sampling")
    timers.wrap(Sampler, "forward", "sampling")
    timers.wrap(mr, "build_step_inputs", "inputs")
    timers.wrap(type(runner_of(engine)), "execute_model", "execute")
    timers.wrap(Scheduler, "schedule", "schedule")
    timers.wrap(Scheduler, "update_from_output", "update")
    timers.wrap(OutputProcessor, "process_outputs", "output")


def runner_of(engine: Any) -> Any:
    return engine.executor.worker.model_runner


def weight_bytes(model: Any) -> tuple[int, int]:
    """Bytes of the weights the GEMMs read per decode token: (decoder layers, LM head)."""
    from minivllm.model_executor.layers.linear import LinearBase
    from minivllm.model_executor.layers.vocab_embedding import ParallelLMHead

    layers = head = 0
    for module in model.modules():
        if isinstance(module, ParallelLMHead):
            if module.quant_kind:
                head += module.qweight.nbytes + module.qscales.nbytes
            else:
                head += module.weight.nbytes
        elif isinstance(module, LinearBase):
            qweight = getattr(module, "qweight", None)
            if qweight is not None:
                layers += qweight.nbytes + module.qscales.nbytes
            elif module.weight is not None:
                layers += module.weight.nbytes
    return layers, head


def _decode_steps(
    engine: Any, steps: int, prompt_len: int, tag: str, timers: Timers | None = None
) -> tuple[int, float]:
    """Prefill one prompt, then decode ``steps`` tokens (timed, and with ``timers`` on)."""
    from minivllm.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    ids = [(13 * j) % 1000 + 10 for j in range(prompt_len)]
    engine.add_request(tag, {"prompt_token_ids": ids}, params)
    engine.step()  # the prefill (and first token)
    if timers is not None:
        timers.set(True)
    start, n = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        n += 1
    elapsed = time.perf_counter() - start
    if timers is not None:
        timers.set(False)
    return n, elapsed


def build(args: argparse.Namespace) -> tuple[Any, Timers]:
    """One engine for the configuration in ``args``, with the timers installed."""
    from minivllm.args.engine_args import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=args.model,
            quantization=args.quantization,  # "none" dequantizes; unset would mean "gguf"
            optimization_level=args.level,
            max_num_seqs=1,
            dtype=args.dtype,
            compilation_config=json.loads(args.cc) if args.cc else None,
        )
    )
    timers = Timers()
    install(timers, engine)
    _decode_steps(engine, 16, args.prompt_len, "warmup")
    return engine, timers


def measure(engine: Any, timers: Timers, args: argparse.Namespace) -> dict[str, Any]:
    """Clean decode tokens/s, then one timed run's split of the step."""
    compilation_config = engine.vllm_config.compilation_config
    clean = [_decode_steps(engine, args.steps, args.prompt_len, "clean") for _ in range(2)]
    tok_s = sum(n for n, _ in clean) / sum(t for _, t in clean)
    timers.reset()
    n, elapsed = _decode_steps(engine, args.steps, args.prompt_len, "timed", timers)
    ms = {k: v * 1000 / n for k, v in timers.acc.items()}
    step = elapsed * 1000 / n
    parts = {
        k: ms.get(k, 0.0)
        for k in ("forward", "gemm", "attention", "logits", "lm_head", "sampling", "inputs")
        + ("schedule", "update", "output")
    }
    parts["fwd_rest"] = parts["forward"] - parts["gemm"] - parts["attention"]
    parts["runner_rest"] = ms.get("execute", 0.0) - sum(
        parts[k] for k in ("forward", "logits", "sampling", "inputs")
    )
    parts["engine_rest"] = (
        step - ms.get("execute", 0.0) - sum(parts[k] for k in ("schedule", "update", "output"))
    )
    layer_bytes, head_bytes = weight_bytes(runner_of(engine).model)
    return {
        "config": f"{args.quantization} -O{args.level}",
        "mode": compilation_config.mode.name if compilation_config.mode is not None else "NONE",
        "dtype": str(engine.vllm_config.model_config.dtype).removeprefix("torch."),
        "tok_s": tok_s,
        "step_ms": step,
        "parts": parts,
        "layer_mb": layer_bytes / 1e6,
        "head_mb": head_bytes / 1e6,
    }


def _print_profile(r: dict[str, Any]) -> None:
    step, parts = r["step_ms"], r["parts"]
    print(
        f"\n== {r['config']} (mode {r['mode']}, dtype {r['dtype']}): "
        f"{r['tok_s']:.1f} decode tok/s untimed; timed step {step:.2f} ms"
    )
    print(f"{'part':<34}{'ms/step':>9}{'% step':>8}")
    for key, label in ROWS:
        print(f"{label:<34}{parts[key]:>9.3f}{100 * parts[key] / step:>7.1f}%")
    gemm_s = (parts["gemm"] + parts["lm_head"]) / 1000
    mb = r["layer_mb"] + r["head_mb"]
    gbs = mb / 1000 / gemm_s if gemm_s else 0.0
    print(
        f"weights read per token: {r['layer_mb']:.1f} MB layers + {r['head_mb']:.1f} MB "
        f"LM head = {mb:.1f} MB; {gbs:.1f} GB/s over the GEMM time; "
        f"GEMMs are {100 * gemm_s * 1000 / step:.0f}% of the step"
    )


def _torch_profile(engine: Any, args: argparse.Namespace) -> None:
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU])
    hooks = Timers()  # only its on/off switch: the profiler covers the decode steps alone
    hooks.on_enable, hooks.on_disable = prof.__enter__, lambda: prof.__exit__(None, None, None)
    steps, _ = _decode_steps(engine, 16, args.prompt_len, "torch-profile", hooks)
    print(
        f"\ntorch.profiler over {steps} decode steps (self CPU time; divide by {steps} per step):"
    )
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))


class Worker:
    """One configuration's engine in its own process, measured on request."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.info = json.loads(self._expect("READY"))
        self.samples: list[dict[str, Any]] = []

    def _expect(self, tag: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(tag + " "):
                return line.removeprefix(tag + " ")
            print(line, end="")  # the worker's own table
        raise RuntimeError(f"{self.name}: worker exited early (its log is above)")

    def measure(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.samples.append(json.loads(self._expect("RESULT")))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=120)


def _median_result(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The sample with the median step time (keeps one consistent breakdown)."""
    ordered = sorted(samples, key=lambda r: r["step_ms"])
    result = dict(ordered[len(ordered) // 2])
    result["tok_s"] = statistics.median(r["tok_s"] for r in samples)
    return result


def _serve(args: argparse.Namespace) -> None:
    """Worker mode: build the engine, then measure once per line on stdin."""
    engine, timers = build(args)
    print("READY " + json.dumps({"pid": os.getpid()}), flush=True)
    for _ in sys.stdin:
        print("RESULT " + json.dumps(measure(engine, timers, args)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model path (default: SmolLM2 GGUF)")
    parser.add_argument(
        "--quantization", nargs="+", default=["gguf"], choices=["gguf", "none"],
        help="gguf: low-bit weights; none: dequantized float",
    )  # fmt: skip
    parser.add_argument("--levels", "-O", type=int, nargs="+", default=[2], dest="levels")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--cc", default=None, help="compilation config JSON, e.g. '{\"compile_sizes\": [1]}'"
    )
    parser.add_argument("--steps", type=int, default=64, help="decode steps per measurement")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds (several configs)"
    )
    parser.add_argument(
        "--baseline", default=None, metavar="DIR",
        help="also run every config with PYTHONPATH=DIR (e.g. a `git archive` of an older "
        "commit), interleaved with this tree's, for before/after ratios in one run",
    )  # fmt: skip
    parser.add_argument("--torch-profile", action="store_true", help="add torch.profiler's table")
    parser.add_argument("--_serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_q", default="gguf", help=argparse.SUPPRESS)
    parser.add_argument("--_level", type=int, default=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._serve:
        args.quantization, args.level = args._q, args._level
        _serve(args)
        return
    configs = [(q, level) for q in args.quantization for level in args.levels]
    if len(configs) == 1 and args.baseline is None:
        args.quantization, args.level = configs[0]
        engine, timers = build(args)
        _print_profile(measure(engine, timers, args))
        if args.torch_profile:
            _torch_profile(engine, args)
        return
    trees = [("", os.environ.get("PYTHONPATH", ""))]
    if args.baseline:
        trees.append(("before ", args.baseline))
    workers: list[Worker] = []
    try:
        for q, level in configs:
            for tag, path in trees:
                cmd = [sys.executable, os.path.abspath(__file__), "--_serve", "--_q", q]
                cmd += ["--_level", str(level), "--steps", str(args.steps)]
                cmd += ["--prompt-len", str(args.prompt_len), "--dtype", args.dtype]
                if args.cc:
                    cmd += ["--cc", args.cc]
                if args.model:
                    cmd += ["--model", args.model]
                env = {**os.environ, "PYTHONPATH": path}
                workers.append(Worker(f"{tag}{q} -O{level}", cmd, env))
        for r in range(args.rounds):
            order = workers[r % len(workers) :] + workers[: r % len(workers)]
            for w in order:
                w.measure()
    finally:
        for w in workers:
            w.close()
    results = [(w.name, _median_result(w.samples)) for w in workers]
    for name, r in results:
        r["config"] = name
        _print_profile(r)
    print(f"\n{'config':<22}{'tok/s':>8}{'step ms':>9}{'vs first':>10}")
    base = results[0][1]["tok_s"]
    for name, r in results:
        print(f"{name:<22}{r['tok_s']:>8.1f}{r['step_ms']:>9.2f}{r['tok_s'] / base:>9.2f}x")
    print(
        f"(median of {args.rounds} interleaved rounds of {args.steps} decode steps each; "
        "tok/s without timers, step ms with them)"
    )


if __name__ == "__main__":
    main()
