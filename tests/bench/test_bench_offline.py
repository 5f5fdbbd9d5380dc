"""``minivllm bench throughput`` and ``bench latency`` on the default model, tiny sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minivllm.entrypoints.cli.main import main

ENGINE_FLAGS = ["-O0", "--num-gpu-blocks-override", "256", "--disable-tqdm"]


def test_bench_throughput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "throughput.json"
    argv = ["bench", "throughput", *ENGINE_FLAGS, "--num-prompts", "4", "--input-len", "16"]
    assert main([*argv, "--output-len", "8", "--output-json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Throughput:" in printed and "requests/s" in printed
    r = json.loads(out.read_text())
    assert r["num_requests"] == 4
    assert r["total_input_tokens"] == 4 * 16  # the random prompts are exactly 16 tokens
    assert r["total_output_tokens"] == 4 * 8  # EOS is ignored
    assert r["total_num_tokens"] == 4 * 24
    assert r["elapsed_time"] > 0
    for key, tokens in [
        ("requests_per_second", 4),
        ("input_tokens_per_second", 64),
        ("output_tokens_per_second", 32),
        ("tokens_per_second", 96),
    ]:
        assert r[key] == pytest.approx(tokens / r["elapsed_time"])
        assert r[key] > 0


def test_bench_latency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "latency.json"
    argv = ["bench", "latency", *ENGINE_FLAGS, "--batch-size", "2", "--input-len", "16"]
    argv += ["--output-len", "8", "--num-iters-warmup", "1", "--num-iters", "3"]
    assert main([*argv, "--output-json", str(out)]) == 0
    assert "Avg latency (s):" in capsys.readouterr().out
    r = json.loads(out.read_text())
    latencies = r["latencies"]
    assert len(latencies) == 3 and all(t > 0 for t in latencies)
    assert r["avg_latency"] == pytest.approx(sum(latencies) / 3)
    values = [r["percentiles"][q] for q in ("10", "25", "50", "75", "90", "99")]
    assert values == sorted(values)
    assert min(latencies) <= values[0] and values[-1] <= max(latencies)
    assert r["output_tokens_per_second"] == pytest.approx(2 * 8 / r["avg_latency"])
