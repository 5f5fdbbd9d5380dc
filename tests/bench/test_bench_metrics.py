"""Serving metrics, goodput, arrivals, the plot and the CLI wiring -- no model needed."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minivllm.entrypoints.bench.common import parse_percentiles, percentile, std
from minivllm.entrypoints.bench.serve import arrival_offsets
from minivllm.entrypoints.bench.serve_metrics import (
    RequestResult,
    compute_metrics,
    parse_goodput,
)
from minivllm.entrypoints.cli.main import build_parser, main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=40),
    q=st.floats(0, 100),
)
def test_percentile_and_std_match_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-6)
    assert std(values) == pytest.approx(float(np.std(values)), abs=1e-6)


def _ok(start: float, ttft: float, latency: float, tokens: int, prompt_len: int = 10):
    gaps = [(latency - ttft) / (tokens - 1)] * (tokens - 1) if tokens > 1 else []
    times = [start + ttft + sum(gaps[:i]) for i in range(tokens)]
    return RequestResult(
        prompt_len=prompt_len,
        success=True,
        output_tokens=tokens,
        ttft=ttft,
        latency=latency,
        itl=gaps,
        start_time=start,
        chunk_times=times,
    )


def _sample_results() -> list[RequestResult]:
    return [
        _ok(0.0, 0.05, 0.95, 10),  # tpot 0.1, every token in second 0
        _ok(2.0, 0.2, 2.2, 5),  # tpot 0.5
        _ok(0.5, 0.3, 0.3, 1),  # one token: no tpot
        RequestResult(prompt_len=999, error="HTTP 400: too long"),
    ]


def test_compute_metrics_figures() -> None:
    results = _sample_results()
    m = compute_metrics(results, duration=4.0, percentiles=[90, 99], slos={})
    assert (m["completed"], m["failed"]) == (3, 1)
    assert m["total_input_tokens"] == 30  # failed requests' prompts are not counted
    assert m["total_output_tokens"] == 16
    assert m["request_throughput"] == pytest.approx(3 / 4)
    assert m["output_throughput"] == pytest.approx(16 / 4)
    assert m["total_token_throughput"] == pytest.approx(46 / 4)
    assert m["mean_ttft_ms"] == pytest.approx(550 / 3)
    assert m["median_ttft_ms"] == pytest.approx(200)
    assert m["mean_tpot_ms"] == pytest.approx(300)  # (100 + 500) / 2: excludes 1-token request
    assert m["mean_e2el_ms"] == pytest.approx(3450 / 3)
    assert m["mean_itl_ms"] == pytest.approx((9 * 100 + 4 * 500) / 13)
    assert m["max_concurrent_requests"] == 2  # the first and the third share second 0
    assert m["max_output_tokens_per_s"] == 11  # 10 + 1 tokens in second 0
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < m[f"median_{name}_ms"] <= m[f"p90_{name}_ms"] <= m[f"p99_{name}_ms"]
    assert m["errors"][3] == "HTTP 400: too long"
    assert "request_goodput" not in m


def test_goodput_counts_requests_within_every_slo() -> None:
    results = _sample_results()
    m = compute_metrics(results, 4.0, [99], parse_goodput(["ttft:150", "tpot:200"]))
    assert m["good_requests"] == 1  # only the first: ttft 50 ms, tpot 100 ms
    assert m["request_goodput"] == pytest.approx(1 / 4)
    m = compute_metrics(results, 4.0, [99], parse_goodput(["e2el:2500"]))
    assert m["good_requests"] == 3
    m = compute_metrics(results, 4.0, [99], parse_goodput(["ttft:250"]))
    assert m["good_requests"] == 2


@pytest.mark.parametrize("bad", ["ttft", "itl:10", "ttft:x", "tpot:0", "e2el:-5"])
def test_parse_goodput_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="--goodput"):
        parse_goodput([bad])


def test_parse_percentiles() -> None:
    assert parse_percentiles("50, 99.9") == [50.0, 99.9]
    for bad in ("", "100", "a,b"):
        with pytest.raises(ValueError, match="--metric-percentiles"):
            parse_percentiles(bad)


def test_arrivals() -> None:
    assert arrival_offsets(5, float("inf"), 1.0, random.Random(0)) == [0.0] * 5
    offsets = arrival_offsets(4000, 8.0, 1.0, random.Random(0))
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and (gaps > 0).all()
    assert statistics.mean(gaps) == pytest.approx(1 / 8, rel=0.08)
    # Exponential gaps: the standard deviation equals the mean; burstier ones vary more.
    assert statistics.pstdev(gaps) == pytest.approx(1 / 8, rel=0.1)
    bursty = np.diff(arrival_offsets(4000, 8.0, 0.25, random.Random(0)))
    assert statistics.mean(bursty) == pytest.approx(1 / 8, rel=0.15)
    assert statistics.pstdev(bursty) > 1.5 * statistics.pstdev(gaps)


def test_plot_writes_png(tmp_path: Path) -> None:
    from minivllm.entrypoints.bench.plot import plot_serve

    path = tmp_path / "serve.png"
    plot_serve(_sample_results(), 4.0, path)
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_bench_cli_wiring_is_lazy() -> None:
    args = build_parser(["bench", "serve"]).parse_args(["bench", "serve", "--request-rate", "2"])
    from minivllm.entrypoints.bench import serve

    assert args._bench_main is serve.main and args.request_rate == 2.0
    assert not hasattr(args, "optimization_level"), "serve must not take engine flags"
    args = build_parser(["bench", "latency"]).parse_args(["bench", "latency", "-O0"])
    assert args.optimization_level == 0 and args.batch_size == 8


def test_bench_cli_bad_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "serve", "--goodput", "itl:5", "--base-url", "http://127.0.0.1:9"])
    assert exc.value.code == 2
    assert "--goodput" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["bench", "serve", "--base-url", "http://127.0.0.1:9", "--disable-tqdm"])
    assert exc.value.code == 2
    assert "cannot reach the server" in capsys.readouterr().err


def test_peak_concurrency_is_exact_within_a_second() -> None:
    # The first request ends at 1.2 s and the second starts at 1.5 s: never two at once,
    # although both touch second 1.
    results = [_ok(0.0, 0.1, 1.2, 3), _ok(1.5, 0.1, 1.0, 3)]
    m = compute_metrics(results, duration=3.0, percentiles=[99], slos={})
    assert m["max_concurrent_requests"] == 1
    results.append(_ok(1.0, 0.1, 0.4, 3))  # 1.0-1.4 overlaps the first
    assert (
        compute_metrics(results, duration=3.0, percentiles=[99], slos={})["max_concurrent_requests"]
        == 2
    )
