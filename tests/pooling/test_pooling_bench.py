"""``minivllm bench throughput`` in embeddings mode (a pooling model)."""

from __future__ import annotations

import json
from pathlib import Path

from minivllm.entrypoints.cli.main import main
from tests.pooling.pooling_helpers import save_bert


def test_bench_throughput_embeddings_mode(tmp_path: Path) -> None:
    save_bert(tmp_path / "bert")
    out = tmp_path / "throughput.json"
    argv = ["bench", "throughput", "--model", str(tmp_path / "bert"), "-O0"]
    argv += ["--num-prompts", "6", "--input-len", "16", "--output-len", "4"]
    argv += ["--disable-tqdm", "--output-json", str(out)]
    assert main(argv) == 0
    r = json.loads(out.read_text())
    assert r["num_requests"] == 6 and r["total_input_tokens"] == 6 * 16
    assert r["total_output_tokens"] == 0  # an embedding generates nothing
    assert r["requests_per_second"] > 0 and r["input_tokens_per_second"] > 0
