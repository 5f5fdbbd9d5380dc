"""The path users get: the default model (low-bit GGUF) at -O2 saves its Dynamo trace
on the first start, and a second start, a new process, loads it instead of tracing.

Found on the default model: its low-bit weights are views of the tensors they were
packed in, and the trace could not be pickled ("AOT compilation failed"), so every
start traced the model again.  The tiny float models of test_aot_compile.py have no
such weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

MARKER = "AOT_TEST_RESULT "
CHILD = """
import json, sys
from minivllm import LLM, SamplingParams
from minivllm.compilation.counter import compilation_counter

before = compilation_counter.clone()
llm = LLM(optimization_level=2, max_model_len=256, num_gpu_blocks_override=64)
counts = compilation_counter.delta(before)
params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
out = llm.generate(["The capital of France is"], params, use_tqdm=False)
result = {"counts": counts, "tokens": list(out[0].outputs[0].token_ids)}
print(sys.argv[1] + json.dumps(result), flush=True)
"""


def _start(cache_root: Path) -> tuple[dict[str, Any], str]:
    """One engine start in a fresh process: its counts, tokens and log."""
    env = {
        **os.environ,
        "MINIVLLM_CACHE_ROOT": str(cache_root),
        # The decode graph is a second, unsaved trace; this test is about the model's.
        "MINIVLLM_CPU_DECODE_GRAPH": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, MARKER],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    log = proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARKER)]
    assert proc.returncode == 0 and lines, log[-4000:]
    return json.loads(lines[-1][len(MARKER) :]), log


@pytest.mark.slow  # test_aot_compile.py's tiny Q4_1 GGUF covers the packed views, faster
@pytest.mark.skipif(
    os.environ.get("MINIVLLM_USE_AOT_COMPILE", "1") == "0", reason="AOT compile turned off"
)
def test_default_model_second_start_loads_the_saved_trace(tmp_path: Path) -> None:
    first, first_log = _start(tmp_path)
    assert "AOT compilation failed" not in first_log, first_log[-4000:]
    assert first["counts"]["num_dynamo_traces"] == 1
    assert first["counts"]["num_aot_saves"] == 1, first_log[-4000:]

    second, second_log = _start(tmp_path)
    assert "AOT compilation failed" not in second_log, second_log[-4000:]
    assert "loaded the AOT-compiled forward" in second_log
    assert second["counts"].get("num_dynamo_traces", 0) == 0
    assert second["counts"]["num_aot_loads"] == 1
    assert second["counts"].get("num_backend_compilations", 0) == 0
    assert second["tokens"] == first["tokens"]
