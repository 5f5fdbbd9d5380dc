"""``bench serve --plot FILE.png``: latency CDFs and throughput over time (matplotlib, Agg)."""

from __future__ import annotations

import os
from collections.abc import Sequence

from minivllm.entrypoints.bench.serve_metrics import RequestResult, per_second_series


def _cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Step points of the empirical CDF, starting from 0 at the smallest value."""
    ordered = sorted(values)
    n = len(ordered)
    return [ordered[0], *ordered], [0.0] + [(i + 1) / n for i in range(n)]


PLOT_EXTRA_HINT = "--plot needs matplotlib, an optional extra: pip install 'minivllm[plot]'"


def require_matplotlib() -> None:
    """ValueError with the install hint when matplotlib is missing (checked before a run,
    so nobody waits for a benchmark to learn that its plot cannot be drawn)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(PLOT_EXTRA_HINT)


def plot_serve(results: list[RequestResult], duration: float, path: str | os.PathLike[str]) -> None:
    """Four panels: CDFs of TTFT, TPOT and E2EL (ms) of the successful requests, and
    output tokens / s and requests in flight per second of the run."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError(PLOT_EXTRA_HINT) from None
    matplotlib.use("Agg")  # no display needed; must precede pyplot's import
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.success]
    series = {
        "TTFT": [r.ttft * 1000 for r in ok],
        "TPOT": [t * 1000 for r in ok if (t := r.tpot) is not None],
        "E2EL": [r.latency * 1000 for r in ok],
    }
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for ax, (name, values) in zip(axes.flat, series.items(), strict=False):
        if values:
            xs, ys = _cdf(values)
            ax.step(xs, ys, where="post")
        ax.set_title(f"{name} CDF ({len(values)} requests)")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)

    tokens, in_flight = per_second_series(ok, duration)
    ax = axes.flat[3]
    # One more edge than bins, so the last second is drawn as a step too.
    seconds = list(range(len(tokens) + 1))
    tokens = [*tokens, tokens[-1]]
    in_flight = [*in_flight, in_flight[-1]]
    ax.plot(seconds, tokens, drawstyle="steps-post", label="output tokens / s")
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("output tokens / s")
    ax.set_title("Throughput over time")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    twin = ax.twinx()
    twin.plot(seconds, in_flight, drawstyle="steps-post", color="tab:orange", label="in flight")
    twin.set_ylabel("requests in flight")
    twin.set_ylim(0, max(in_flight) + 1)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper right")
    failed = len(results) - len(ok)
    fig.suptitle(f"minivllm bench serve: {len(ok)} ok, {failed} failed, {duration:.1f} s")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
