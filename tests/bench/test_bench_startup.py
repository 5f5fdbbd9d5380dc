"""``minivllm bench startup``: a cold and a warm child process on the default model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from minivllm.entrypoints.cli.main import main


def test_bench_startup(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "startup.json"
    root = tmp_path / "cache-root"
    # Dequantized ("none"): its weight cache is what a cold -O0 start fills and a warm one
    # reads (the low-bit default reads the GGUF file each start: nothing to cache at -O0).
    argv = ["bench", "startup", "-O0", "--quantization", "none"]
    argv += ["--num-gpu-blocks-override", "64", "--disable-tqdm"]
    try:
        assert main([*argv, "--cache-root", str(root), "--output-json", str(out)]) == 0
        assert any(root.iterdir())  # --cache-root is kept
        cache_files = sum(1 for p in root.rglob("*") if p.is_file())
    finally:
        shutil.rmtree(root, ignore_errors=True)  # hundreds of MB of dequantized weights
    assert "Cold start to first token" in capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r["cold_start_s"] > 0 and r["warm_start_s"] > 0
    assert r["cold_over_warm"] == pytest.approx(r["cold_start_s"] / r["warm_start_s"])
    for run in (r["cold"], r["warm"]):
        parts = run["import_s"] + run["engine_init_s"] + run["first_token_s"]
        assert all(run[k] > 0 for k in ("import_s", "engine_init_s", "first_token_s"))
        assert parts == pytest.approx(run["total_s"])
    assert len(r["warm_runs"]) == 1
    # The cold run filled the given root (the dequantized GGUF weights at least), and the
    # warm run, reading them back instead of dequantizing, builds its engine faster.
    assert r["cache_bytes_after_cold"] > 0 and cache_files > 0
    assert r["cold"]["engine_init_s"] > r["warm"]["engine_init_s"]


def test_bench_startup_refuses_a_used_cache_root(tmp_path: Path) -> None:
    (tmp_path / "leftover").write_text("x")
    with pytest.raises(SystemExit) as exc:
        main(["bench", "startup", "--cache-root", str(tmp_path)])
    assert exc.value.code == 2
