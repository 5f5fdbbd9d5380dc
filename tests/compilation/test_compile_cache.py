"""Inductor + the on-disk compile cache: a second start compiles nothing.

It runs Inductor (a C++ compiler on CPU); a 1-layer model keeps it to two
distinct pieces.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from compile_helpers import greedy_tokens, make_llm, start


def test_inductor_matches_eager_and_second_start_loads(
    one_layer_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MINIVLLM_CACHE_ROOT", str(tmp_path))
    eager = greedy_tokens(make_llm(one_layer_llama, compilation_config={"mode": 0}))
    inductor = {"mode": "VLLM_COMPILE", "backend": "inductor"}

    llm, first, first_s = start(one_layer_llama, compilation_config=inductor)
    assert first["num_piecewise_graphs_seen"] == 2
    assert first["num_inductor_compilations"] == 2 and first["num_cache_saves"] == 2
    assert first.get("num_cache_loads", 0) == 0
    compilation_config = llm.llm_engine.vllm_config.compilation_config
    cache_dir = Path(compilation_config.local_cache_dir)
    expected_root = tmp_path / "torch_compile_cache" / llm.llm_engine.vllm_config.compute_hash()
    assert cache_dir == expected_root / "rank_0" / "model"
    assert (cache_dir / "cache_index.json").is_file()
    assert greedy_tokens(llm) == eager
    first_compile_s = compilation_config.compilation_time
    del llm

    # Same config, and a field outside the hash (KV blocks, max_num_seqs): loads only.
    llm, second, second_s = start(
        one_layer_llama, compilation_config=inductor, num_gpu_blocks_override=48, max_num_seqs=8
    )
    assert second.get("num_backend_compilations", 0) == 0
    assert second["num_cache_loads"] == 2
    assert llm.llm_engine.vllm_config.compilation_config.compilation_time < first_compile_s
    assert second_s < first_s
    assert greedy_tokens(llm) == eager
    del llm

    # A hashed field: a new directory, so the pieces are compiled again.
    changed = {**inductor, "inductor_compile_config": {"max_autotune": False}}
    llm, third, _ = start(one_layer_llama, compilation_config=changed)
    assert third["num_inductor_compilations"] == 2
    assert third.get("num_cache_loads", 0) == 0
    assert Path(llm.llm_engine.vllm_config.compilation_config.local_cache_dir) != cache_dir
