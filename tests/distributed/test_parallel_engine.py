"""Tensor x pipeline parallelism on the "mp" executor matches one process, and a dead
worker fails the engine quickly instead of hanging it.

One engine of four ranks (TP=2 x PP=2) on a tiny Qwen2 (q/k/v biases) whose single
KV head is replicated on both tensor-parallel ranks; the slow tests widen this to
every model family, TP=4 and the default model.  With PP=2 the engine keeps two
batches in flight: eight requests of different lengths, seeded sampling and an
abort of a request whose batch is running give the one-process results and leak no
KV block.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from dist_helpers import ENGINE, PROMPTS, greedy_tokens, reference_tokens, save_tiny

from minivllm import LLM, SamplingParams


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
    from minivllm.platforms.cpu import cpu_threads_per_rank

    executor = tp2_pp2.llm_engine.executor
    assert len(executor.worker_pids) == 4 and os.getpid() not in executor.worker_pids
    assert executor.collective_rpc("pid") == executor.worker_pids
    # The cores (or MINIVLLM_CPU_THREADS) split over four ranks, at least one each.
    assert executor.collective_rpc("num_threads") == [cpu_threads_per_rank(4)] * 4


# Eight requests of different lengths, some ending early: the batches split them.
MANY_PROMPTS: list[Any] = [
    {"prompt_token_ids": [(7 * i + 3 * j) % 120 + 1 for j in range(3 + 4 * i)]} for i in range(8)
]
MANY_PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (8, 3, 8, 1, 6, 8, 2, 8)
]
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=6, ignore_eos=True)


def _tokens(llm: LLM, prompts: list[Any], params: Any) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def one_process_many(tiny_qwen2: Path) -> tuple[list[list[int]], list[list[int]]]:
    """The one-process engine's greedy tokens of MANY_PROMPTS and its seeded tokens."""
    llm = LLM(model=str(tiny_qwen2), **ENGINE)
    return _tokens(llm, MANY_PROMPTS, MANY_PARAMS), _tokens(llm, PROMPTS, SEEDED)


def test_pipeline_keeps_two_batches_in_flight(
    tp2_pp2: LLM, one_process_many: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PP=2: the engine submits a second batch before the first one's results are read
    (the executor holds two unread steps), and the tokens still equal one process's."""
    engine = tp2_pp2.llm_engine
    executor = engine.executor
    assert engine.max_concurrent_batches == 2
    unread: list[int] = []
    submit = executor.execute_model

    def spy(scheduler_output: Any, non_block: bool = False) -> Any:
        result = submit(scheduler_output, non_block=non_block)
        unread.append(executor.num_pending)
        return result

    monkeypatch.setattr(executor, "execute_model", spy)
    assert _tokens(tp2_pp2, MANY_PROMPTS, MANY_PARAMS) == one_process_many[0]
    assert max(unread) == 2
    assert [len(t) for t in one_process_many[0]] == [p.max_tokens for p in MANY_PARAMS]
    # Seeded sampling: the output rank's generators give the one-process draws, twice.
    assert _tokens(tp2_pp2, PROMPTS, SEEDED) == one_process_many[1]
    assert _tokens(tp2_pp2, PROMPTS, SEEDED) == one_process_many[1]


def test_abort_of_a_request_in_flight_frees_its_kv_blocks(tp2_pp2: LLM) -> None:
    engine = tp2_pp2.llm_engine
    manager = engine.scheduler.kv_cache_manager
    free_at_start = manager.num_free_blocks
    long = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    for i, prompt in enumerate(MANY_PROMPTS[:4]):
        engine.add_request(f"abort-{i}", prompt, long)
    assert engine.step() == [] and len(engine.batch_queue) == 1  # submitted, not read
    in_flight = next(iter(engine.batch_queue[0][0].num_scheduled_tokens))
    engine.abort_request(in_flight)
    assert in_flight not in engine.scheduler.requests
    finished: dict[str, int] = {}
    for _ in range(1000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():  # the aborted request's late result is dropped
            assert out.request_id != in_flight
            if out.finished:
                finished[out.request_id] = len(out.outputs[0].token_ids)
    assert finished == {f"abort-{i}": 30 for i in range(4) if f"abort-{i}" != in_flight}
    assert not engine.batch_queue
    assert manager.num_free_blocks == free_at_start


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
