"""How OpenMP's idle-thread waiting changes CPU decode speed, alone and with a rival.

Every parallel region (a GEMM, an Inductor kernel) hands work to the other OpenMP
threads; between regions they either spin or sleep.  Sleeping at once
(``OMP_WAIT_POLICY=PASSIVE``) makes each region pay a futex wake-up; spinning long
(libgomp's default, ~300k spins) steals the cores from any other process.  For each
setting this script times decode steps of the default model in one engine process
running alone, and in two engine processes decoding at the same time on the same
cores (the rival case: a server next to its client, two engines, a busy CI box).

    python benchmarks/omp_wait.py [--level 0] [--seconds 10] [--spins 10000 30000]

Prints the median milliseconds per decode step at batch 1 and 32 alone, and at
batch 32 with a rival (mean of the two processes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from engine_timing import time_decode_batch

SETTINGS = {
    "PASSIVE (no spin)": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin 1000 (minivllm default)": {},
    "spin 300000 (libgomp default)": {"GOMP_SPINCOUNT": "300000"},
}


def _worker(level: int, batch: int, seconds: float) -> None:
    """Decode batches of ``batch`` requests for ``seconds``; print the median step ms."""
    from minivllm.args.engine_args import EngineArgs
    from minivllm.engine.llm_engine import LLMEngine
    from minivllm.sampling_params import SamplingParams

    engine = LLMEngine.from_engine_args(
        EngineArgs(model=None, optimization_level=level, max_num_seqs=max(batch, 1))
    )
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)

    def one_batch(tag: str) -> float:
        seconds, steps = time_decode_batch(engine, tag, batch, 16, params)
        return seconds * 1000 / steps

    one_batch("warmup")
    print("READY", flush=True)
    sys.stdin.readline()  # rivals start decoding together
    samples, deadline, n = [], time.perf_counter() + seconds, 0
    while time.perf_counter() < deadline:
        samples.append(one_batch(f"b{n}"))
        n += 1
    print(f"MS {statistics.median(samples)}", flush=True)


def _run(setting: dict[str, str], level: int, batch: int, seconds: float, copies: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(setting)
    cmd = [sys.executable, __file__, "--_worker", str(level), str(batch), str(seconds)]
    procs = [
        subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(copies)
    ]
    for p in procs:  # every engine is built before any decodes
        assert p.stdout is not None
        if "READY" not in p.stdout.readline():
            raise RuntimeError(f"worker failed to start ({setting})")
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds * 20 + 120)
        results.append(float(out.split("MS ")[-1]))
    return statistics.mean(results)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--_worker":
        _worker(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", type=int, default=0, help="optimization level (-O)")
    parser.add_argument("--seconds", type=float, default=10.0, help="decode time per run")
    parser.add_argument(
        "--spins", type=int, nargs="*", default=[], help="more GOMP_SPINCOUNT values to compare"
    )
    args = parser.parse_args()
    settings = dict(SETTINGS)
    settings.update({f"spin {n}": {"GOMP_SPINCOUNT": str(n)} for n in args.spins})
    print(f"ms per decode step, default model, -O{args.level}")
    header = f"{'setting':<32}{'alone b1':>12}{'alone b32':>12}{'rival b32':>12}"
    print(header)
    for name, setting in settings.items():
        cells = [
            _run(setting, args.level, 1, args.seconds, 1),
            _run(setting, args.level, 32, args.seconds, 1),
            _run(setting, args.level, 32, args.seconds, 2),
        ]
        print(f"{name:<32}" + "".join(f"{c:>12.1f}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
