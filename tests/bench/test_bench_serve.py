"""``minivllm bench serve`` against a real ``minivllm serve`` process (see conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from minivllm.entrypoints.cli.main import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METRICS = ("ttft", "tpot", "itl", "e2el")


def run_bench(server: Any, tmp_path: Path, *flags: str) -> dict[str, Any]:
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--base-url", server.url, "--disable-tqdm"]
    assert main([*argv, *flags, "--output-json", str(out)]) == 0
    return json.loads(out.read_text())


def check_plausible(r: dict[str, Any]) -> None:
    """Every figure the issue names is present, positive, and percentiles are ordered."""
    assert r["duration"] > 0 and r["completed"] > 0
    for key in ("request_throughput", "output_throughput", "total_token_throughput"):
        assert r[key] > 0
    for name in METRICS:
        mean, median = r[f"mean_{name}_ms"], r[f"median_{name}_ms"]
        p90, p99 = r[f"p90_{name}_ms"], r[f"p99_{name}_ms"]
        assert mean > 0 and r[f"std_{name}_ms"] >= 0
        assert 0 < median <= p90 <= p99
    # A request's end-to-end latency contains its time to first token.
    triples = zip(r["e2els"], r["ttfts"], r["errors"], strict=True)
    assert all(e >= t for e, t, err in triples if not err)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_serve_completions(
    bench_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], concurrency: int
) -> None:
    r = run_bench(
        bench_server, tmp_path,
        "--num-prompts", "4", "--input-len", "16", "--output-len", "8", "--ignore-eos",
        "--max-concurrency", str(concurrency),
    )  # fmt: skip
    assert "Serving Benchmark Result" in capsys.readouterr().out
    check_plausible(r)
    assert (r["completed"], r["failed"]) == (4, 0)
    # The server's usage counts confirm the prompts are exactly 16 tokens.
    assert r["input_lens"] == [16] * 4 and r["total_input_tokens"] == 64
    assert r["output_lens"] == [8] * 4 and r["total_output_tokens"] == 32
    assert r["max_concurrency"] == concurrency
    assert 1 <= r["max_concurrent_requests"] <= 4
    if concurrency == 1:
        # One at a time: each request starts after the previous one ended.
        ends = [s + e for s, e in zip(r["start_times"], r["e2els"], strict=True)]
        assert all(start >= end for start, end in zip(r["start_times"][1:], ends, strict=False))


def test_serve_chat_poisson_goodput_and_plot(bench_server: Any, tmp_path: Path) -> None:
    plot = tmp_path / "serve.png"
    r = run_bench(
        bench_server, tmp_path,
        "--endpoint", "/v1/chat/completions", "--request-rate", "20", "--seed", "1",
        "--num-prompts", "4", "--input-len", "12", "--output-len", "6", "--ignore-eos",
        "--goodput", "ttft:1500", "e2el:600000", "--plot", str(plot),
    )  # fmt: skip
    check_plausible(r)
    assert (r["completed"], r["failed"]) == (4, 0)
    assert r["request_rate"] == 20.0
    assert all(n > 12 for n in r["input_lens"])  # the chat template adds tokens
    assert r["start_times"] == sorted(r["start_times"]) and r["start_times"][-1] > 0
    expected_good = sum(t * 1000 <= 1500 for t in r["ttfts"])
    assert r["good_requests"] == expected_good
    assert r["request_goodput"] == pytest.approx(expected_good / r["duration"])
    assert plot.read_bytes()[:8] == PNG_MAGIC


def test_serve_sharegpt_counts_a_failed_request(bench_server: Any, tmp_path: Path) -> None:
    # Longer than the server's max_model_len, yet short enough for the dataset's filter.
    too_long = "apple banana cherry " * bench_server.max_model_len
    data = [
        {"conversations": [{"from": "human", "value": prompt}, {"from": "gpt", "value": reply}]}
        for prompt, reply in [
            ("Write a haiku about the sea, please.", "Waves fold into foam, salt wind"),
            ("List two colours of the rainbow.", "Red and orange are two colours."),
            (too_long, "This one never gets an answer."),
        ]
    ]
    dataset = tmp_path / "sharegpt.json"
    dataset.write_text(json.dumps(data))
    r = run_bench(
        bench_server, tmp_path,
        "--dataset", "sharegpt", "--dataset-path", str(dataset), "--num-prompts", "3",
        "--output-len", "4", "--max-concurrency", "2",
    )  # fmt: skip
    check_plausible(r)
    assert (r["completed"], r["failed"]) == (2, 1)
    errors = [e for e in r["errors"] if e]
    assert len(errors) == 1 and errors[0].startswith("HTTP 400")
    assert r["total_output_tokens"] <= 8
