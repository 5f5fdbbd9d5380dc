"""``minivllm bench startup [engine flags]``: cold and warm start-up time to the first token.

Each run is a fresh ``python -c`` process that imports minivllm, builds an engine
from the given engine flags and generates one token.  The clock starts just before
the process is spawned, so interpreter start and imports count.  The cold run gets
an empty cache root (``MINIVLLM_CACHE_ROOT``: dequantized weights, compile
artifacts; torch inductor's and triton's caches are pointed inside it too, and so is
the temporary directory, where Inductor keeps its precompiled C++ header, so that
nothing cached by earlier runs on this machine helps); the warm runs reuse the root
the cold run filled.  Reported: both times, their breakdown and the cold/warm ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from minivllm.entrypoints.bench.common import (
    add_common_args,
    check_positive,
    mean,
    print_table,
    write_json,
)

RESULT_MARKER = "MINIVLLM_STARTUP_RESULT "
"""Prefix of the child's result line on stdout (logs may share the stream)."""

# The child: timestamps (time.time(), comparable across processes) after imports,
# after the engine is built and when the first token is out.
CHILD_SCRIPT = """
import json, pickle, sys, time
from minivllm.engine.llm_engine import LLMEngine
from minivllm.sampling_params import RequestOutputKind, SamplingParams
imported = time.time()
with open(sys.argv[1], "rb") as f:
    engine_args = pickle.load(f)
engine = LLMEngine.from_engine_args(engine_args)
built = time.time()
params = SamplingParams(max_tokens=1, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
engine.add_request("startup", sys.argv[2], params)
while engine.has_unfinished_requests():
    engine.step()
done = time.time()
print(sys.argv[3] + json.dumps({"imported": imported, "built": built, "first_token": done}))
"""

PROMPT = "The capital of France is"
"""The one prompt each run completes."""


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """Run counts, the cache root, common flags and every engine flag."""
    from minivllm.args.engine_args import EngineArgs

    group = parser.add_argument_group("startup")
    group.add_argument(
        "--num-warm-runs",
        type=int,
        default=1,
        help="Warm runs after the cold one; the warm time is their mean (default 1).",
    )
    group.add_argument(
        "--cache-root",
        default=None,
        metavar="DIR",
        help="Cache root to start from (must be empty or absent; kept afterwards). Default: "
        "a temporary directory, removed at the end.",
    )
    group.add_argument("--run-timeout", type=float, default=1800.0, help="Seconds allowed per run.")
    add_common_args(parser, seed=False)
    EngineArgs.add_cli_args(parser)


def _dir_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def time_one_run(args_file: Path, cache_root: Path, timeout: float) -> dict[str, float]:
    """Spawn one child; seconds from spawn to imports done, engine built, first token."""
    tmp = cache_root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "TMPDIR": str(tmp),
        "MINIVLLM_CACHE_ROOT": str(cache_root),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_root / "torchinductor"),
        "TRITON_CACHE_DIR": str(cache_root / "triton"),
    }
    command = [sys.executable, "-c", CHILD_SCRIPT, str(args_file), PROMPT, RESULT_MARKER]
    spawned = time.time()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout)[-3000:]
        raise RuntimeError(f"the start-up run failed (exit status {proc.returncode}):\n{tail}")
    stamps = json.loads(lines[-1][len(RESULT_MARKER) :])
    return {
        "total_s": stamps["first_token"] - spawned,
        "import_s": stamps["imported"] - spawned,
        "engine_init_s": stamps["built"] - stamps["imported"],
        "first_token_s": stamps["first_token"] - stamps["built"],
    }


def main(args: argparse.Namespace) -> dict[str, Any]:
    """Time the cold and warm runs, print the summary, write --output-json."""
    from tqdm.auto import tqdm

    from minivllm.args.engine_args import EngineArgs

    check_positive("--num-warm-runs", args.num_warm_runs)
    keep = args.cache_root is not None
    if keep:
        cache_root = Path(args.cache_root).expanduser()
        if cache_root.exists() and any(cache_root.iterdir()):
            raise ValueError(
                f"argument --cache-root: {str(cache_root)!r} is not empty; a cold start needs "
                "an empty cache root (give a new directory)"
            )
    engine_args = EngineArgs.from_cli_args(args)
    engine_args.create_engine_config()  # bad flags fail here, not in a child's traceback

    if keep:
        cache_root.mkdir(parents=True, exist_ok=True)
    else:
        cache_root = Path(tempfile.mkdtemp(prefix="minivllm-startup-"))
    args_file = Path(tempfile.mkstemp(prefix="minivllm-startup-args-", suffix=".pkl")[1])
    try:
        args_file.write_bytes(pickle.dumps(engine_args))
        runs = []
        labels = ["cold"] + [f"warm {i + 1}" for i in range(args.num_warm_runs)]
        with tqdm(labels, desc="Start-up runs", disable=args.disable_tqdm) as bar:
            for label in bar:
                bar.set_postfix_str(label)
                runs.append(time_one_run(args_file, cache_root, args.run_timeout))
                if label == "cold":
                    cache_bytes = _dir_size(cache_root)
    finally:
        args_file.unlink(missing_ok=True)
        if not keep:
            shutil.rmtree(cache_root, ignore_errors=True)

    cold, warm_runs = runs[0], runs[1:]
    warm = {key: mean([r[key] for r in warm_runs]) for key in cold}
    result: dict[str, Any] = {
        "cold_start_s": cold["total_s"],
        "warm_start_s": warm["total_s"],
        "cold_over_warm": cold["total_s"] / warm["total_s"],
        "cold": cold,
        "warm": warm,
        "warm_runs": warm_runs,
        "cache_bytes_after_cold": cache_bytes,
        "cache_root": str(cache_root) if keep else None,
    }
    print_table(
        "Start-up Result",
        [
            ("Cold start to first token (s):", cold["total_s"]),
            ("Warm start to first token (s):", warm["total_s"]),
            ("Cold / warm:", result["cold_over_warm"]),
            "Cold (s)",
            ("Python start + imports:", cold["import_s"]),
            ("Engine init:", cold["engine_init_s"]),
            ("First token:", cold["first_token_s"]),
            "Warm (s)",
            ("Python start + imports:", warm["import_s"]),
            ("Engine init:", warm["engine_init_s"]),
            ("First token:", warm["first_token_s"]),
            "Cache",
            ("Cache size after cold run (MiB):", cache_bytes / 2**20),
        ],
    )
    write_json(args.output_json, result)
    return result
