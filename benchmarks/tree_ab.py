"""Two source trees of minivllm side by side: did a change alter its speed?

    python benchmarks/tree_ab.py --old /path/to/old/tree [--new .] [--rounds 2]
                                 [--skip-serve] [--compile-modes]

Runs the minivllm rows of `vs_llamacpp.py --quick` (batch 1 tg128 / pp128, 16 and
32 sequences of 128 in / 128 out, serving 16 clients) for each tree, the trees
taking turns within every round (the order flips each round), so both meet the
same machine load.  Each run imports the tree it measures (``PYTHONPATH``), in a
fresh process.  With ``--compile-modes`` each round also runs each tree's own
``benchmarks/compile_modes.py`` (short settings) and prints its table.  The table
shows every round's figures and the new / old ratio: compare them against the
spread between rounds, which is the noise of this machine.  llama.cpp is not
needed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import vs_llamacpp as vs  # noqa: E402


@contextlib.contextmanager
def tree(root: Path):
    """Make `vs_llamacpp`'s minivllm runs import ``root``."""
    saved = vs.ROOT
    vs.ROOT = root
    try:
        yield
    finally:
        vs.ROOT = saved


def measure(root: Path, model: str, serve: bool) -> dict[str, float]:
    with tree(root):
        figures = {f"batch 1 {k} (tok/s)": v for k, v in vs.minivllm_batch1(model, 2).items()}
        for seqs in (16, 32):
            figures[f"{seqs} seqs total tok/s"] = vs.minivllm_batched(model, seqs)
        if serve:
            port = vs.free_port()
            cmd = [*vs.MINIVLLM, "serve", model, "--port", str(port), "--max-num-seqs", "16"]
            out, ttft = vs.serve_throughput(
                cmd + vs.ENGINE_ARGS, port, model, 32, env=vs.minivllm_env()
            )
            figures["serving 16 clients out tok/s"] = out
            figures["serving 16 clients median TTFT ms"] = ttft
    return figures


def compile_modes(root: Path) -> None:
    cmd = [sys.executable, str(root / "benchmarks" / "compile_modes.py")]
    cmd += ["--batch-sizes", "1", "32", "--rounds", "2", "--tokens", "32"]
    env = dict(os.environ, PYTHONPATH=str(root))
    print(f"## compile_modes.py of {root}", flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    print(proc.stdout[-6000:], proc.stderr[-2000:] if proc.returncode else "", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the tree before the change")
    parser.add_argument("--new", type=Path, default=vs.ROOT, help="the tree after it")
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--compile-modes", action="store_true")
    args = parser.parse_args()
    vs.ENGINE_ARGS[:] = ["--quantization", "gguf"]
    model = args.model or vs.default_gguf()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    results: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    loads = []
    for round_ in range(args.rounds):
        loads.append(os.getloadavg()[0])
        order = ["old", "new"] if round_ % 2 == 0 else ["new", "old"]
        for name in order:
            results[name].append(measure(trees[name], model, not args.skip_serve))
            print(f"round {round_} {name}: {results[name][-1]}", flush=True)  # kept if stopped
            if args.compile_modes:
                compile_modes(trees[name])
    print(f"\nold = {trees['old']}\nnew = {trees['new']}")
    print(f"1-min load average at each round's start: {', '.join(f'{x:.1f}' for x in loads)}")
    print("| row | round | old | new | new / old |\n| --- | --- | --- | --- | --- |")
    for row in results["old"][0]:
        for r in range(args.rounds):
            old, new = results["old"][r][row], results["new"][r][row]
            print(f"| {row} | {r} | {old:.1f} | {new:.1f} | {new / old:.2f}x |")


if __name__ == "__main__":
    main()
