"""The ``--matrix`` mode of vs_llamacpp.py: many GGUF files, one table, each run's load.

Each file is measured by a ``measure()`` callable (vs_llamacpp's comparison) once
the machine is quiet: `busy_cores`, the cores other processes kept busy over two
seconds, at most a quarter of the thread count, waiting up to ``settle_s`` seconds
for that.  (The 1-minute load average, used before, lags: after one file's 2-core
run it read ~2 and took ~45 s of an idle machine to fall under 1, so with a short
settle every file was run twice.)  A run that starts above that line is marked not
quiet and made once more; the run that started on the lower load is kept.
Nothing here needs llama.cpp, so the tests exercise it directly.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

Row = tuple[str, float | None, float | None]
"""``(label, llama.cpp figure, minivllm figure)``, as vs_llamacpp prints them."""
SHIPPED = {"smollm2-135m": "smollm2", "gemma3-270m": "gemma3"}
"""Matrix label of each shipped model -> its name for `gguf_zoo.shipped_gguf`."""


MEASURE_ERRORS = (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired)
"""Failures of one file's comparison that the matrix records and moves past."""


@dataclasses.dataclass
class MatrixRun:
    """One file's comparison, the busy cores it started on (`busy_cores`), and whether
    it was repeated."""

    model: str
    qtype: str
    path: Path
    rows: dict[str, Row] = dataclasses.field(default_factory=dict)
    load: float = 0.0
    quiet: bool = True
    repeated: bool = False
    error: str | None = None


def _cpu_times(stat: Path) -> tuple[int, int, int]:
    """(all jiffies, idle + iowait jiffies, CPUs) from /proc/stat."""
    lines = stat.read_text().splitlines()
    fields = [int(v) for v in lines[0].split()[1:9]]  # user .. steal
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
    return sum(fields), fields[3] + fields[4], cpus


def busy_cores(
    sample_s: float = 2.0,
    stat: Path = Path("/proc/stat"),
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Cores busy over the next ``sample_s`` seconds while this process sleeps: other
    processes' work (and time the hypervisor gave away, ``steal``), from the kernel's
    CPU counters; the 1-minute load average where /proc/stat cannot be read."""
    try:
        total0, idle0, cpus = _cpu_times(stat)
        sleep(sample_s)
        total1, idle1, _ = _cpu_times(stat)
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0]
    total = total1 - total0
    return 0.0 if total <= 0 else cpus * (1.0 - (idle1 - idle0) / total)


def wait_for_quiet(
    threshold: float,
    max_wait_s: float,
    probe: Callable[[], float] = busy_cores,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 5.0,
) -> float:
    """Wait until ``probe()`` (busy cores) is at most ``threshold`` or ``max_wait_s``
    passed; the reading then."""
    waited = 0.0
    load = probe()
    while load > threshold and waited < max_wait_s:
        sleep(poll_s)
        waited += poll_s
        load = probe()
    return load


def measure_quietly(
    run: MatrixRun,
    measure: Callable[[], dict[str, Row]],
    threads: int,
    settle_s: float,
    **wait_kwargs,
) -> MatrixRun:
    """Fill ``run`` from ``measure()``; a run that started with more than
    ``threads / 4`` cores busy is made once more and the one with the lower reading
    kept (a failed repeat keeps the first)."""
    threshold = 0.25 * threads
    attempts: list[tuple[float, dict[str, Row]]] = []
    while len(attempts) < 2:
        load = wait_for_quiet(threshold, settle_s, **wait_kwargs)
        print(
            f"== {run.model} {run.qtype}: {load:.2f} cores busy "
            f"(1-min load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
        try:
            attempts.append((load, measure()))
        except MEASURE_ERRORS:
            if not attempts:
                raise
            break
        if load <= threshold:
            break
    run.load, run.rows = min(attempts, key=lambda a: a[0])
    run.quiet = run.load <= threshold
    run.repeated = len(attempts) > 1
    return run


def run_matrix(
    files: list[tuple[str, str, Path]],
    measure: Callable[[Path], dict[str, Row]],
    threads: int,
    settle_s: float,
) -> list[MatrixRun]:
    """Measure every ``(model, type, path)``; a failure is recorded, not raised."""
    runs = []
    for model, qtype, path in files:
        run = MatrixRun(model, qtype, path)
        try:
            measure_quietly(run, lambda p=path: measure(p), threads, settle_s)
        except MEASURE_ERRORS as e:
            run.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        runs.append(run)
    return runs


# -- table -------------------------------------------------------------------
def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _ratio(row: Row | None) -> str:
    if row is None or not row[1] or not row[2]:
        return "n/a"
    return f"{row[2] / row[1]:.2f}x"


def _pair(row: Row | None) -> str:
    return "n/a" if row is None else f"{_rate(row[1])} / {_rate(row[2])}"


def _quiet_cell(run: MatrixRun) -> str:
    if run.error:
        return "failed"
    text = "yes" if run.quiet else "**no**"
    return text + (" (best of 2)" if run.repeated else "")


def format_matrix(runs: list[MatrixRun], seqs: int = 32, serve: bool = True) -> str:
    """One markdown table: ratios are minivllm / llama.cpp, higher is better for minivllm;
    tok/s cells are ``llama.cpp / minivllm``.  Failures are listed under it."""
    head = ["model", "type", "file MB", "b1 e2e tok/s", "b1 e2e ratio", "b1 tg128 tok/s"]
    head += ["tg128 ratio", f"{seqs} seqs ratio"] + (["serving ratio"] if serve else [])
    head += ["busy cores", "quiet"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for run in runs:
        size = run.path.stat().st_size / 2**20 if run.path.exists() else 0.0
        rows = run.rows
        cells = [run.model, run.qtype, f"{size:.0f}", _pair(rows.get("pg")), _ratio(rows.get("pg"))]
        cells += [_pair(rows.get("tg128")), _ratio(rows.get("tg128"))]
        cells += [_ratio(rows.get(f"seqs{seqs}"))] + ([_ratio(rows.get("serve"))] if serve else [])
        cells += [f"{run.load:.2f}", _quiet_cell(run)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [f"- {r.model} {r.qtype}: {r.error}" for r in runs if r.error]
    return "\n".join(lines)


def file_type_name(path: Path) -> str:
    """The file's ``general.file_type`` as llama.cpp names it (``Q4_K_M``), or ``?``."""
    import gguf

    from minivllm.transformers_utils.config import read_gguf_metadata

    value = read_gguf_metadata(path).get("general.file_type")
    try:
        return gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "?"
