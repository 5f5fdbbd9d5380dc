"""Helpers shared by the bench commands: percentiles, the summary table, JSON output."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TABLE_WIDTH = 50
"""Width of the printed result tables (vLLM's)."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation, as numpy's default.

    An empty sequence gives 0.0 so that a run where every request failed still
    produces a complete (if empty) report.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def std(values: Sequence[float]) -> float:
    """Population standard deviation (numpy's default ``ddof=0``)."""
    if not values:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def parse_percentiles(raw: str) -> list[float]:
    """``"90,99"`` -> ``[90.0, 99.0]`` (the --metric-percentiles value)."""
    try:
        values = [float(p) for p in raw.split(",") if p.strip()]
    except ValueError:
        raise ValueError(
            f"argument --metric-percentiles: expected comma-separated numbers, got {raw!r}"
        ) from None
    if not values or any(not 0 < p < 100 for p in values):
        raise ValueError(
            f"argument --metric-percentiles: each value must be in (0, 100), got {raw!r}"
        )
    return values


def format_percentile(q: float) -> str:
    """99.0 -> ``"99"``, 99.9 -> ``"99.9"`` (used in field names such as ``p99_ttft_ms``)."""
    return str(int(q)) if float(q).is_integer() else str(q)


def print_table(title: str, rows: Sequence[tuple[str, Any] | str]) -> None:
    """Print a vLLM-style result block; a plain string row is a section header."""
    print(f"{' ' + title + ' ':=^{TABLE_WIDTH}}")
    for row in rows:
        if isinstance(row, str):
            print(f"{row:-^{TABLE_WIDTH}}")
            continue
        label, value = row
        if isinstance(value, float):
            print(f"{label:<40} {value:<10.2f}")
        else:
            print(f"{label:<40} {value!s:<10}")
    print("=" * TABLE_WIDTH)


def write_json(path: str | os.PathLike[str] | None, result: dict[str, Any]) -> None:
    """Write ``result`` to ``path`` (pretty-printed); nothing when path is None."""
    if path is None:
        return
    target = Path(path)
    if target.parent and not target.parent.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(f"Results written to {target}")


def add_common_args(parser: argparse.ArgumentParser, *, seed: bool = True) -> None:
    """--output-json, --seed and --disable-tqdm: flags every bench command has.

    Commands that take engine flags pass ``seed=False``: the engine's own ``--seed``
    then seeds the dataset too (as in vLLM).
    """
    parser.add_argument(
        "--output-json",
        default=None,
        metavar="FILE",
        help="Write every figure of the run to FILE as JSON.",
    )
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="Random seed of the dataset.")
    parser.add_argument("--disable-tqdm", action="store_true", help="Hide progress bars.")


def check_positive(name: str, value: int | None, allow_zero: bool = False) -> None:
    """Reject a count that must be positive, naming the flag."""
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else ">= 1"
        raise ValueError(f"argument {name}: must be {bound}, got {value}")
