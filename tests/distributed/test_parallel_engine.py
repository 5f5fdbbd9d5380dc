"""Tensor x pipeline parallelism on the "mp" executor matches one process, and a dead
worker fails the engine quickly instead of hanging it.

One engine of four ranks (TP=2 x PP=2) on a tiny Qwen2 (q/k/v biases) whose single
KV head is replicated on both tensor-parallel ranks; the slow tests widen this to
every model family, TP=4 and the default model.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from dist_helpers import ENGINE, PROMPTS, greedy_tokens, reference_tokens, save_tiny

from minivllm import LLM


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("qwen2"), "qwen2", num_key_value_heads=1)


@pytest.fixture(scope="module")
def tp2_pp2(tiny_qwen2: Path):  # noqa: ANN201
    llm = LLM(model=str(tiny_qwen2), tensor_parallel_size=2, pipeline_parallel_size=2, **ENGINE)
    yield llm
    llm.llm_engine.shutdown()


def test_tp2_pp2_gives_the_one_process_greedy_tokens(tiny_qwen2: Path, tp2_pp2: LLM) -> None:
    assert greedy_tokens(tp2_pp2) == reference_tokens(tiny_qwen2)


def test_workers_are_spawned_with_a_thread_share(tp2_pp2: LLM) -> None:
    from minivllm.executor.rank_worker import threads_per_worker

    executor = tp2_pp2.llm_engine.executor
    assert len(executor.worker_pids) == 4 and os.getpid() not in executor.worker_pids
    assert executor.collective_rpc("pid") == executor.worker_pids
    # The cores (or MINIVLLM_CPU_THREADS) split over four ranks, at least one each.
    assert executor.collective_rpc("num_threads") == [threads_per_worker(4)] * 4


def test_killed_worker_fails_the_engine_within_seconds(tp2_pp2: LLM) -> None:
    """Runs last in the module: the engine is unusable afterwards."""
    from minivllm.executor.multiproc import WorkerError

    executor = tp2_pp2.llm_engine.executor
    os.kill(executor.worker_pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerError, match="worker rank 1 died"):
        tp2_pp2.generate(PROMPTS, use_tqdm=False)
    assert time.monotonic() - start < 10
    assert not tp2_pp2.llm_engine.is_healthy()
    with pytest.raises(WorkerError):  # later calls fail at once, nothing hangs
        tp2_pp2.generate(PROMPTS, use_tqdm=False)
